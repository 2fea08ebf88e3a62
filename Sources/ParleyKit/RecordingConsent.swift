import ParleyProtocol

/// Recording a call with the other party's consent, as this device sees it. The server holds the
/// same rules (protocol.md, "Recording with consent") and refuses what breaks them; this side makes
/// sure nothing is recorded before the far side agreed, and that the recorder stops whenever either
/// side stops it or the call ends.
///
/// Only the device that asked records: it alone starts the recorder, once the other party's
/// `accepted` arrives. A plain struct: every event answers the actions to perform.
public struct RecordingConsent: Hashable, Sendable {
    public enum State: Hashable, Sendable {
        case off
        /// We asked; the other party has not answered yet.
        case asking
        /// The other party asks to record; the user must answer (`answer(consent:)`).
        case asked
        /// The call is being recorded, by this device when `here`.
        case on(here: Bool)

        public var isOn: Bool { if case .on = self { true } else { false } }
    }

    /// Why the state changed: what the UI tells the user.
    public enum Change: Hashable, Sendable {
        case requestedHere
        case requestedThere
        case acceptedHere
        case acceptedThere
        case declinedHere
        case declinedThere
        case stoppedHere
        case stoppedThere
        case callEnded
        /// The server refused a step of ours (its message), or the recorder could not start.
        case failed(String)
    }

    public enum Action: Hashable, Sendable {
        case send(RecordingStep)
        case startRecorder
        case stopRecorder
        /// Tell the app: the new state, and why.
        case notify(State, Change)
    }

    public enum Refusal: Error, Hashable, Sendable, CustomStringConvertible {
        /// The step does not fit the recording's state here (asking twice, answering nothing).
        case notNow(State)
        /// The call has not been answered (or has ended): there is nothing to record yet.
        case notConnected
        case noSuchCall
        /// This device's media engine cannot record (`PeerConnection.canRecordCalls`).
        case cannotRecord

        public var description: String {
            switch self {
            case .notNow(let state): "recording cannot do that now (it is \(state))"
            case .notConnected: "the call is not connected"
            case .noSuchCall: "no such call"
            case .cannotRecord: "this device cannot record calls"
            }
        }
    }

    public private(set) var state: State = .off

    public init() {}

    // MARK: This user

    /// The user asks to record the call.
    public mutating func request() throws(Refusal) -> [Action] {
        guard state == .off else { throw .notNow(state) }
        return move(to: .asking, .requestedHere, [.send(.requested)])
    }

    /// The user answers the other party's request.
    public mutating func answer(consent: Bool) throws(Refusal) -> [Action] {
        guard state == .asked else { throw .notNow(state) }
        return consent ? move(to: .on(here: false), .acceptedHere, [.send(.accepted)])
            : move(to: .off, .declinedHere, [.send(.declined)])
    }

    /// The user stops the recording, or withdraws a request.
    public mutating func stop() throws(Refusal) -> [Action] {
        switch state {
        case .asking, .on(here: false): return move(to: .off, .stoppedHere, [.send(.stopped)])
        case .on(here: true): return move(to: .off, .stoppedHere, [.send(.stopped), .stopRecorder])
        case .off, .asked: throw .notNow(state)
        }
    }

    // MARK: The far side and the server

    /// The other party's step (`call.updated {recording}`).
    public mutating func remote(_ step: RecordingStep) -> [Action] {
        switch (step, state) {
        case (.requested, .off), (.requested, .asking):
            // Both asked at once: the server took theirs and refuses ours.
            return move(to: .asked, .requestedThere)
        case (.accepted, .asking):
            return move(to: .on(here: true), .acceptedThere, [.startRecorder])
        case (.declined, .asking):
            return move(to: .off, .declinedThere)
        case (.stopped, .on(here: true)):
            return move(to: .off, .stoppedThere, [.stopRecorder])
        case (.stopped, .on(here: false)), (.stopped, .asked), (.stopped, .asking):
            // (While we ask, the other party may stop instead of declining: the server allows it.)
            return move(to: .off, .stoppedThere)
        default:
            // A step that does not fit (a duplicate after a resume): the server did not take it either.
            return []
        }
    }

    /// The server refused a step of ours: `RecordingStepResult` never came.
    public mutating func refused(_ step: RecordingStep, message: String) -> [Action] {
        switch (step, state) {
        case (.requested, .asking):
            return move(to: .off, .failed(message))
        case (.accepted, .on(here: false)):
            return move(to: .off, .failed(message))
        default:
            return []
        }
    }

    /// What the server says after a new session (`call.state`): a request it no longer holds (it
    /// restarted) is over, and so is a recording it says is off.
    public mutating func server(_ recording: RecordingState) -> [Action] {
        switch (recording, state) {
        case (.off, .asking), (.off, .asked):
            return move(to: .off, .failed("the server no longer has the request"))
        case (.off, .on(here: false)):
            return move(to: .off, .failed("the server no longer has the recording"))
        case (.off, .on(here: true)):
            return move(to: .off, .failed("the server no longer has the recording"), [.stopRecorder])
        default:
            return []
        }
    }

    /// The recorder could not start: recording stops for both sides.
    public mutating func recorderFailed(_ message: String) -> [Action] {
        guard state == .on(here: true) else { return [] }
        return move(to: .off, .failed(message), [.send(.stopped)])
    }

    /// The call ended: whatever was being recorded stops.
    public mutating func callEnded() -> [Action] {
        switch state {
        case .off: return []
        case .on(here: true): return move(to: .off, .callEnded, [.stopRecorder])
        default: return move(to: .off, .callEnded)
        }
    }

    private mutating func move(to next: State, _ change: Change, _ actions: [Action] = []) -> [Action] {
        state = next
        return actions + [.notify(next, change)]
    }
}
