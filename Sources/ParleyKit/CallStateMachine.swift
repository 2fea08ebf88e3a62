import Foundation
import ParleyProtocol

/// One call on this device, with CallKit's semantics. A plain struct: every event is a `mutating`
/// method that answers the actions to perform; `CallManager` performs them.
///
/// ```
/// outgoing: dialing ─invite ack─▶ ringing ─call.accepted─▶ connecting ─ICE connected─▶ connected
/// incoming: ringing ─answer action─▶ answering ─accept ack + peer ready─▶ connecting ─▶ connected
/// every phase ─▶ ended
/// ```
///
/// Connecting while ringing (`connectsWhileRinging`, protocol.md): a ringing callee makes its peer
/// connection at once, holding media, and rings `early`; the caller connects to every callee device
/// that rings early. ICE and DTLS may then connect before the answer (`mediaReady`), and nothing is
/// captured, sent or played until it: the callee starts media once the server took its accept (a
/// device whose accept loses never sends), the caller when it hears which device answered, keeping
/// that device's path and closing the others. An answered call whose path is ready is connected at once.
///
/// The rules of apple-rules.md it encodes:
/// - audio is configured only in the start and answer actions;
/// - the answer action stays pending until the server took the accept and the peer connection
///   exists, and fails if the call cannot be joined;
/// - declining a call that rings while another is in progress declines it as `busy`;
/// - a call that ended while this device was away ends with the server's reason.
public struct CallStateMachine: Sendable {
    public enum Direction: Hashable, Sendable { case outgoing, incoming }

    public enum Phase: Hashable, Sendable {
        case dialing
        case ringing
        case answering
        case connecting
        case connected
        case ended(EndReason)

        public var isEnded: Bool { if case .ended = self { true } else { false } }
    }

    public enum Action: Hashable, Sendable {
        case sendInvite
        case sendRinging(early: Bool)
        case sendAccept
        case sendDecline(EndReason)
        case sendHangup(reason: String?)
        case sendUpdate(muted: Bool?, held: Bool?)
        case reportIncoming
        case reportStartedConnecting
        case reportConnected
        case reportEnded(SystemEndReason)
        case fulfill(ProviderActionID)
        case fail(ProviderActionID)
        case configureAudio
        /// `early`: while ringing, holding media until `.startMedia`.
        case makePeerConnection(polite: Bool, early: Bool = false)
        /// Outgoing: a peer connection to a callee device that rings early, holding media.
        case connectEarly(DeviceID)
        /// Outgoing: the device that answered had a path while ringing: it becomes the call's, its
        /// media starts, and the other early paths close (without one, a new connection is made).
        case takeEarlyPath(DeviceID)
        /// Incoming: the answer went through: media held while ringing starts.
        case startMedia
        /// Closes the call's peer connection and every early path.
        case closePeerConnection
        case setPeerMuted(Bool)
        case setPeerHeld(Bool)
        case sendDTMF(String, then: ProviderActionID)
    }

    public let id: CallID
    public let direction: Direction
    public let remote: UserID
    public let remoteName: String?
    /// Where an incoming call comes from, when the hub says (a LAN listener's does).
    public private(set) var remoteAddress: String?
    public let media: MediaSpec
    public private(set) var phase: Phase
    public private(set) var held = false
    public private(set) var muted = false
    private var startAction: ProviderActionID?
    private var answerAction: ProviderActionID?
    private var acceptTaken = false
    private var peerReady = false
    /// Whether this call connects while it rings (set where it is made; audio calls only).
    public let connectsWhileRinging: Bool
    /// Incoming: the peer connection was made while ringing, its media held.
    private var earlyPeer = false
    /// ICE and DTLS connected before the call was answered.
    private var mediaReady = false
    /// Outgoing: the callee devices connected to while ringing.
    public private(set) var earlyDevices: Set<DeviceID> = []

    /// The system call UUID of this call.
    public var uuid: UUID { UUID(uuidString: id.rawValue)! }

    private init(id: CallID, direction: Direction, remote: UserID, remoteName: String?, media: MediaSpec, phase: Phase,
                 connectsWhileRinging: Bool) {
        self.connectsWhileRinging = connectsWhileRinging
        self.id = id
        self.direction = direction
        self.remote = remote
        self.remoteName = remoteName
        self.media = media
        self.phase = phase
    }

    /// The user started a call (a start action, from the system UI or the app).
    public static func outgoing(_ id: CallID, to remote: UserID, media: MediaSpec, action: ProviderActionID,
                                connectWhileRinging: Bool = false) -> (CallStateMachine, [Action]) {
        var call = CallStateMachine(id: id, direction: .outgoing, remote: remote, remoteName: nil, media: media, phase: .dialing,
                                    connectsWhileRinging: connectWhileRinging)
        call.startAction = action
        return (call, [.configureAudio, .sendInvite])
    }

    /// A call arrived: over signaling (`call.incoming`), or from a VoIP push (`alreadyReported`).
    public static func incoming(_ id: CallID, from remote: UserID, name: String?, address: String? = nil, media: MediaSpec,
                                alreadyReported: Bool, connectWhileRinging: Bool = false) -> (CallStateMachine, [Action]) {
        var call = CallStateMachine(id: id, direction: .incoming, remote: remote, remoteName: name, media: media, phase: .ringing,
                                    connectsWhileRinging: connectWhileRinging)
        call.remoteAddress = address
        return (call, alreadyReported ? [] : [.reportIncoming])
    }

    // MARK: Outgoing

    public mutating func inviteAcknowledged() -> [Action] {
        guard phase == .dialing else { return [] }
        phase = .ringing
        return takeStart(fulfilled: true) + [.reportStartedConnecting]
    }

    public mutating func inviteFailed() -> [Action] {
        guard phase == .dialing else { return [] }
        phase = .ended(EndReason(rawValue: "failed"))
        let paths: [Action] = earlyDevices.isEmpty ? [] : [.closePeerConnection]
        earlyDevices = []
        return takeStart(fulfilled: false) + paths
    }

    /// A callee device rings (`call.ringing`); one that rings `early` is connected to now.
    public mutating func remoteRinging(device: DeviceID?, early: Bool) -> [Action] {
        guard direction == .outgoing, connectsWhileRinging, early, let device, phase == .dialing || phase == .ringing,
              earlyDevices.insert(device).inserted else { return [] }
        return [.connectEarly(device)]
    }

    /// `device` answered (absent from servers that do not say).
    public mutating func remoteAccepted(device: DeviceID? = nil) -> [Action] {
        guard direction == .outgoing, phase == .ringing || phase == .dialing else { return [] }
        phase = .connecting
        let early = earlyDevices
        earlyDevices = []
        if let device, early.contains(device) { return takeStart(fulfilled: true) + [.takeEarlyPath(device)] }
        return takeStart(fulfilled: true) + (early.isEmpty ? [] : [.closePeerConnection]) + [.makePeerConnection(polite: false)]
    }

    // MARK: Incoming

    /// The signaling invite for a call first learned of from a push: ring the caller.
    /// (Connecting while ringing, the peer connection is made now, holding media.)
    public mutating func signalingInviteArrived() -> [Action] {
        guard direction == .incoming, phase == .ringing else { return [] }
        guard connectsWhileRinging, !earlyPeer else { return [.sendRinging(early: earlyPeer)] }
        earlyPeer = true
        return [.sendRinging(early: true), .makePeerConnection(polite: true, early: true)]
    }

    public mutating func answer(_ action: ProviderActionID) -> [Action] {
        guard direction == .incoming, phase == .ringing else { return [.fail(action)] }
        phase = .answering
        answerAction = action
        return [.configureAudio, .sendAccept] + (earlyPeer ? [] : [.makePeerConnection(polite: true, early: connectsWhileRinging)])
    }

    public mutating func acceptAcknowledged() -> [Action] {
        acceptTaken = true
        return answerIfReady()
    }

    public mutating func peerConnectionReady() -> [Action] {
        peerReady = true
        // A mute (or hold) set before the peer connection existed, while ringing, reaches it now.
        return (muted ? [.setPeerMuted(true)] : []) + (held ? [.setPeerHeld(true)] : []) + answerIfReady()
    }

    private mutating func answerIfReady() -> [Action] {
        guard phase == .answering, acceptTaken, peerReady, let action = answerAction else { return [] }
        answerAction = nil
        phase = mediaReady ? .connected : .connecting
        // (Connecting while ringing, every connection of the call holds its media until now.)
        return [.fulfill(action)] + (connectsWhileRinging ? [.startMedia] : [])
    }

    /// The server refused the accept: someone else answered, or the call is over.
    public mutating func acceptFailed(_ code: ErrorCode?) -> [Action] {
        guard phase == .answering else { return [] }
        let reason: (EndReason, SystemEndReason) = switch code {
        case .callAlreadyAnswered?: (.answeredElsewhere, .answeredElsewhere)
        case .callEnded?: (.hangup, .remoteEnded)
        default: (EndReason(rawValue: "failed"), .failed)
        }
        phase = .ended(reason.0)
        var actions: [Action] = answerAction.map { [.fail($0)] } ?? []
        answerAction = nil
        actions += [.closePeerConnection, .reportEnded(reason.1)]
        return actions
    }

    // MARK: Both directions

    public mutating func mediaConnected() -> [Action] {
        switch phase {
        case .connecting:
            phase = .connected
            return direction == .outgoing ? [.reportConnected] : []
        case .dialing, .ringing, .answering:
            // Connected while ringing: the answer finds it ready.
            mediaReady = true
            return []
        case .connected, .ended:
            return []
        }
    }

    /// The user ended the call (an end action). `anotherCallActive`: a ringing call declined while
    /// another call is in progress is declined as busy.
    public mutating func end(_ action: ProviderActionID, anotherCallActive: Bool) -> [Action] {
        guard !phase.isEnded else { return [.fulfill(action)] }
        var actions: [Action]
        if direction == .incoming, phase == .ringing {
            let reason: EndReason = anotherCallActive ? .busy : .declined
            phase = .ended(reason)
            actions = [.sendDecline(reason)]
        } else {
            phase = .ended(.hangup)
            actions = [.sendHangup(reason: nil)]
        }
        actions += pendingActionsFailed()
        return actions + [.closePeerConnection, .fulfill(action)]
    }

    /// The server ended the call (`call.ended`), or `call.state` said it is over.
    public mutating func remoteEnded(_ reason: EndReason) -> [Action] {
        guard !phase.isEnded else { return [] }
        phase = .ended(reason)
        return pendingActionsFailed() + [.closePeerConnection, .reportEnded(Self.systemReason(reason, direction: direction))]
    }

    public mutating func setHeld(_ held: Bool, action: ProviderActionID) -> [Action] {
        guard phase == .connecting || phase == .connected else { return [.fail(action)] }
        self.held = held
        return [.setPeerHeld(held), .sendUpdate(muted: nil, held: held), .fulfill(action)]
    }

    /// Held or resumed by the app itself (an audio interruption), not by a system action.
    public mutating func setHeldByApp(_ held: Bool) -> [Action] {
        guard phase == .connecting || phase == .connected, held != self.held else { return [] }
        self.held = held
        return [.setPeerHeld(held), .sendUpdate(muted: nil, held: held)]
    }

    public mutating func setMuted(_ muted: Bool, action: ProviderActionID) -> [Action] {
        guard !phase.isEnded else { return [.fail(action)] }
        self.muted = muted
        return [.setPeerMuted(muted), .sendUpdate(muted: muted, held: nil), .fulfill(action)]
    }

    /// DTMF needs media: a call that is connecting or connected.
    public func playDTMF(_ digits: String, action: ProviderActionID) -> [Action] {
        let valid = !digits.isEmpty && digits.allSatisfy { "0123456789*#ABCDabcd,".contains($0) }
        guard valid, phase == .connecting || phase == .connected else { return [.fail(action)] }
        return [.sendDTMF(digits.uppercased(), then: action)]
    }

    /// Media could not be recovered: ICE restarts ran out (`ice-failed`), or DTLS failed (`dtls-failed`).
    public mutating func mediaFailed(_ reason: String) -> [Action] {
        guard !phase.isEnded else { return [] }
        if direction == .incoming, phase == .ringing, earlyPeer {
            // The connection made while ringing failed (or could not be made): the call rings on,
            // and answering makes another, which holds its media as well until the accept is taken.
            earlyPeer = false
            peerReady = false
            mediaReady = false
            return [.closePeerConnection]
        }
        phase = .ended(EndReason(rawValue: reason))
        return pendingActionsFailed() + [.sendHangup(reason: reason), .closePeerConnection, .reportEnded(.failed)]
    }

    /// The provider was reset: the system already forgot the call; tell the other party.
    public mutating func reset() -> [Action] {
        guard !phase.isEnded else { return [] }
        let ringing = direction == .incoming && phase == .ringing
        phase = .ended(ringing ? .declined : .hangup)
        return pendingActionsFailed() + [ringing ? .sendDecline(.declined) : .sendHangup(reason: "reset"), .closePeerConnection]
    }

    /// The system gave up waiting for `action` (CallKit's `timedOutPerforming`) and dropped the call
    /// if it was its start or answer: the call ends here too, and the other party hears of it.
    public mutating func actionTimedOut(_ action: ProviderActionID) -> [Action] {
        guard !phase.isEnded, action == startAction || action == answerAction else { return [] }
        startAction = nil
        answerAction = nil
        let unanswered = direction == .incoming && !acceptTaken
        phase = .ended(EndReason(rawValue: "failed"))
        return [unanswered ? .sendDecline(.declined) : .sendHangup(reason: "failed"), .closePeerConnection]
    }

    public var isInProgress: Bool {
        switch phase {
        case .answering, .connecting, .connected: true
        case .dialing, .ringing: direction == .outgoing
        case .ended: false
        }
    }

    private mutating func takeStart(fulfilled: Bool) -> [Action] {
        guard let action = startAction else { return [] }
        startAction = nil
        return [fulfilled ? .fulfill(action) : .fail(action)]
    }

    private mutating func pendingActionsFailed() -> [Action] {
        var actions: [Action] = []
        if let action = startAction { actions.append(.fail(action)) }
        if let action = answerAction { actions.append(.fail(action)) }
        startAction = nil
        answerAction = nil
        return actions
    }

    /// How a server end reason reads to the system.
    public static func systemReason(_ reason: EndReason, direction: Direction) -> SystemEndReason {
        switch reason {
        case .answeredElsewhere: .answeredElsewhere
        case .declinedElsewhere: .declinedElsewhere
        case .noAnswer: .unanswered
        case .hangup, .cancelled, .declined, .busy: .remoteEnded
        default: .failed
        }
    }
}
