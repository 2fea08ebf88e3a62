import ParleyProtocol

/// Offer/answer negotiation of one call's peer connection, without I/O: each event returns the
/// actions its owner (`Negotiator`) performs, and the results of those actions come back as events.
///
/// Protocol v1's roles: the caller is the impolite peer, the callee the polite one. Perfect
/// negotiation resolves two offers that cross by having the polite peer roll its own back, and
/// webrtcbin cannot roll back. So offers never cross: **only the impolite peer makes offers**. The
/// polite peer answers, and when it wants an ICE restart (ICE failed, or its network changed) it
/// asks for one with `call.signal {restartIce: true}`; the impolite peer restarts on that request.
///
///     impolite                                          polite
///     stable ─(negotiation needed, restart)─▶ offering  stable ─(remote offer)─▶ answering
///     offering: creating ▶ applying ▶ awaiting answer   answering: applying offer ▶ creating
///               ▶ applying answer ─▶ stable                        ▶ applying answer ─▶ stable
///
/// Anything that arrives mid-round waits for the round to end, and is never lost:
/// - A restart wanted while an offer is out runs once that round is over. Two exceptions, both
///   covered by the round in flight: ICE failing while a restart round is in flight, and the polite
///   peer's request arriving before the answer to a restart offer (its answer then comes after the
///   request, so from its new network).
/// - The polite peer's own restart wishes wait while it answers, and are dropped before its first
///   offer arrives (ICE has not started: its first answer gathers on the network it has).
/// - An offer that reaches the impolite peer while its own offer is out is ignored (glare: the
///   polite side, a browser, rolls back and answers ours). An offer that arrives while an answer
///   is being applied is taken next.
/// - Remote candidates wait until the description they belong to is applied; local candidates
///   wait until the description they belong to has been sent.
/// - `maxIceRestarts` restarts in a row without ICE connecting end negotiation with `ice-failed`.
/// - The call is connected when the connection as a whole is (ICE and DTLS: `connectionChanged`),
///   not when ICE alone is; a DTLS handshake that fails on a connected pair ends it with `dtls-failed`.
public struct NegotiationStateMachine: Hashable, Sendable {
    public enum Action: Hashable, Sendable {
        case createOffer(iceRestart: Bool)
        case createAnswer
        case setLocalDescription(SessionDescription)
        case setRemoteDescription(SessionDescription)
        case addRemoteCandidate(IceCandidate?)
        /// A description, a candidate, or a restart request for the other party.
        case send(SignalPayload)
        /// ICE and DTLS are up: media can flow.
        case reportConnected
        /// "ice-failed" (the restarts ran out) or "dtls-failed".
        case reportFailed(reason: String)
    }

    private enum State: Hashable, Sendable {
        case stable
        /// Impolite only: our offer, from its creation until the answer is applied.
        case offering(iceRestart: Bool, step: OfferStep)
        case answering(AnswerStep)
        case closed
    }

    private enum OfferStep: Hashable, Sendable {
        case creating
        case applying(SessionDescription)
        case awaitingAnswer
        case applyingAnswer
    }

    private enum AnswerStep: Hashable, Sendable {
        case applyingOffer
        case creating
        case applying(SessionDescription)
    }

    /// Why an ICE restart is wanted: each is covered by a round in flight differently.
    private enum RestartCause: Hashable, Sendable {
        case networkChanged, iceFailed, farSideAsked, mediaStopped
    }

    public let polite: Bool
    public let maxIceRestarts: Int
    /// Whether ICE is connected now: a connection failure then is DTLS's.
    private var iceConnected = false
    private var state = State.stable
    /// ICE restarts (offers, or requests for one) since ICE last connected.
    public private(set) var iceRestarts = 0
    private var restartWanted = false
    private var negotiationWanted = false
    private var remoteDescriptionApplied = false
    private var pendingRemoteCandidates: [IceCandidate?] = []
    private var pendingLocalCandidates: [IceCandidate?] = []
    /// A remote offer that arrived mid-round, with the candidates that came after it.
    private var pendingOffer: PendingOffer?

    private struct PendingOffer: Hashable, Sendable {
        var offer: SessionDescription
        var candidates: [IceCandidate?]
    }

    public init(polite: Bool, maxIceRestarts: Int = 3) {
        self.polite = polite
        self.maxIceRestarts = maxIceRestarts
    }

    public var isClosed: Bool { state == .closed }

    // MARK: Events from the peer connection

    /// The engine wants a negotiation (already checked to be still needed).
    public mutating func negotiationNeeded() -> [Action] {
        // The polite peer's answers carry what it has to send; it makes no offers.
        guard !polite else { return [] }
        switch state {
        case .stable: return startOffer(iceRestart: false)
        case .offering, .answering: negotiationWanted = true; return []
        case .closed: return []
        }
    }

    public mutating func localCandidate(_ candidate: IceCandidate?) -> [Action] {
        switch state {
        case .offering(_, .applying), .answering(.applying):
            // Its description has not gone out yet: the far side would have nothing to add it to.
            pendingLocalCandidates.append(candidate)
            return []
        case .closed:
            return []
        default:
            return [.send(SignalPayload(candidate: candidate.map(CandidateSignal.candidate) ?? .endOfCandidates))]
        }
    }

    public mutating func iceConnectionChanged(_ ice: IceConnectionState) -> [Action] {
        guard state != .closed else { return [] }
        iceConnected = ice == .connected || ice == .completed
        switch ice {
        case .connected, .completed:
            iceRestarts = 0
            return []
        case .failed:
            return wantRestart(.iceFailed)
        case .new, .checking, .disconnected, .closed:
            return []
        }
    }

    /// ICE and DTLS together. Connected only once DTLS-SRTP is up on the ICE pair: before that no
    /// media can flow, whatever ICE says. A failure while ICE is connected is the DTLS handshake's
    /// (no cipher suite in common, a certificate that does not match its fingerprint), which an
    /// ICE restart does not repeat: negotiation ends. One while ICE is not is ICE's, handled there.
    public mutating func connectionChanged(_ connection: PeerConnectionState) -> [Action] {
        guard state != .closed else { return [] }
        switch connection {
        case .connected:
            return [.reportConnected]
        case .failed where iceConnected:
            _ = close()
            return [.reportFailed(reason: "dtls-failed")]
        case .new, .connecting, .disconnected, .failed, .closed:
            return []
        }
    }

    // MARK: Events from the app

    /// The network changed: ICE restarts (or, on the polite side, asks for a restart).
    public mutating func networkChanged() -> [Action] { wantRestart(.networkChanged) }

    /// Media stopped arriving on a connected call. Both ends send packets all through a call (a
    /// muted or held microphone sends silence), so the path is likely dead while ICE does not know
    /// yet: libnice gives up on a selected pair only after 50 s without an answer to its keepalives,
    /// a browser after 30 s. A restart tries every pair again at once, over another interface if
    /// there is one; if the path comes back first, media goes on over it during the restart.
    public mutating func mediaStopped() -> [Action] { wantRestart(.mediaStopped) }

    public mutating func close() -> [Action] {
        state = .closed
        pendingRemoteCandidates = []
        pendingLocalCandidates = []
        pendingOffer = nil
        return []
    }

    // MARK: Events from the other party

    public mutating func received(_ signal: SignalPayload) -> [Action] {
        var actions: [Action] = []
        if let description = signal.description { actions += receive(description) }
        switch signal.candidate {
        case .candidate(let candidate)?: actions += remoteCandidate(candidate)
        case .endOfCandidates?: actions += remoteCandidate(nil)
        case nil: break
        }
        if signal.restartIce { actions += wantRestart(.farSideAsked) }
        return actions
    }

    private mutating func receive(_ description: SessionDescription) -> [Action] {
        switch (description.type, state) {
        case ("offer", .stable):
            return takeOffer(description)
        case ("offer", .offering(_, .applyingAnswer)), ("offer", .answering):
            // Sent after the far side's answer (or with our answer on its way): not a collision.
            pendingOffer = PendingOffer(offer: description, candidates: [])
            return []
        case ("offer", .offering):
            // Glare: the impolite peer keeps its offer; the far side rolls its own back.
            return []
        case ("answer", .offering(let iceRestart, .awaitingAnswer)):
            state = .offering(iceRestart: iceRestart, step: .applyingAnswer)
            return [.setRemoteDescription(description)]
        default:
            // An answer to nothing we offered, or a description type v1 does not use.
            return []
        }
    }

    private mutating func remoteCandidate(_ candidate: IceCandidate?) -> [Action] {
        if pendingOffer != nil {
            pendingOffer?.candidates.append(candidate)
            return []
        }
        switch state {
        case .closed:
            return []
        case .answering(.applyingOffer), .offering(_, .applyingAnswer):
            pendingRemoteCandidates.append(candidate)
            return []
        default:
            guard remoteDescriptionApplied else {
                pendingRemoteCandidates.append(candidate)
                return []
            }
            return [.addRemoteCandidate(candidate)]
        }
    }

    // MARK: Results of actions

    public mutating func offerCreated(_ offer: SessionDescription) -> [Action] {
        guard case .offering(let iceRestart, .creating) = state else { return [] }
        state = .offering(iceRestart: iceRestart, step: .applying(offer))
        return [.setLocalDescription(offer)]
    }

    public mutating func answerCreated(_ answer: SessionDescription) -> [Action] {
        guard case .answering(.creating) = state else { return [] }
        state = .answering(.applying(answer))
        return [.setLocalDescription(answer)]
    }

    public mutating func localDescriptionSet() -> [Action] {
        switch state {
        case .offering(let iceRestart, .applying(let offer)):
            state = .offering(iceRestart: iceRestart, step: .awaitingAnswer)
            return [.send(SignalPayload(description: offer))] + flushLocalCandidates()
        case .answering(.applying(let answer)):
            return [.send(SignalPayload(description: answer))] + flushLocalCandidates() + roundEnded()
        default:
            return []
        }
    }

    public mutating func remoteDescriptionSet() -> [Action] {
        switch state {
        case .answering(.applyingOffer):
            remoteDescriptionApplied = true
            state = .answering(.creating)
            return flushRemoteCandidates() + [.createAnswer]
        case .offering(_, .applyingAnswer):
            remoteDescriptionApplied = true
            return flushRemoteCandidates() + roundEnded()
        default:
            return []
        }
    }

    /// The step in flight (creating or applying a description) failed. The round is over; what
    /// waited for it goes ahead.
    public mutating func stepFailed() -> [Action] {
        switch state {
        case .offering(_, .awaitingAnswer), .stable, .closed:
            return []
        case .offering, .answering:
            return flushLocalCandidates() + roundEnded()
        }
    }

    // MARK: Rounds

    private mutating func startOffer(iceRestart: Bool) -> [Action] {
        if iceRestart {
            guard iceRestarts < maxIceRestarts else { return giveUp() }
            iceRestarts += 1
        }
        restartWanted = false
        negotiationWanted = false
        state = .offering(iceRestart: iceRestart, step: .creating)
        return [.createOffer(iceRestart: iceRestart)]
    }

    private mutating func takeOffer(_ offer: SessionDescription) -> [Action] {
        state = .answering(.applyingOffer)
        return [.setRemoteDescription(offer)]
    }

    private mutating func askForRestart() -> [Action] {
        guard iceRestarts < maxIceRestarts else { return giveUp() }
        iceRestarts += 1
        restartWanted = false
        return [.send(SignalPayload(restartIce: true))]
    }

    private mutating func giveUp() -> [Action] {
        _ = close()
        return [.reportFailed(reason: "ice-failed")]
    }

    /// Back to stable: what waited for the round goes ahead, the far side's offer first.
    private mutating func roundEnded() -> [Action] {
        state = .stable
        if let next = pendingOffer {
            pendingOffer = nil
            pendingRemoteCandidates += next.candidates
            return takeOffer(next.offer)
        }
        if polite {
            return restartWanted ? askForRestart() : []
        }
        return restartWanted || negotiationWanted ? startOffer(iceRestart: restartWanted) : []
    }

    private mutating func wantRestart(_ cause: RestartCause) -> [Action] {
        if polite {
            switch state {
            case _ where cause == .farSideAsked, .closed:
                // Restarts are the impolite peer's to make; a request the other way is a mistake.
                return []
            case .answering, .offering:
                restartWanted = true
                return []
            case .stable:
                // Before the first offer ICE has not started: the first answer gathers afresh.
                return remoteDescriptionApplied ? askForRestart() : []
            }
        }
        switch (state, cause) {
        case (.closed, _):
            return []
        case (.stable, _):
            return startOffer(iceRestart: true)
        case (.offering(true, _), .iceFailed), (.offering(true, _), .mediaStopped),
             (.offering(true, .creating), .farSideAsked), (.offering(true, .applying), .farSideAsked),
             (.offering(true, .awaitingAnswer), .farSideAsked):
            return []
        default:
            restartWanted = true
            return []
        }
    }

    private mutating func flushRemoteCandidates() -> [Action] {
        defer { pendingRemoteCandidates = [] }
        return pendingRemoteCandidates.map(Action.addRemoteCandidate)
    }

    private mutating func flushLocalCandidates() -> [Action] {
        defer { pendingLocalCandidates = [] }
        return pendingLocalCandidates.map { .send(SignalPayload(candidate: $0.map(CandidateSignal.candidate) ?? .endOfCandidates)) }
    }
}
