import Logging
import ParleyProtocol

/// Perfect negotiation (W3C WebRTC 1.0, §10.7) over the `PeerConnection` port, with protocol v1's
/// roles: the callee is polite, and makes no offer before its first answer. Remote candidates wait
/// until a remote description is set. ICE failure (or a network change) leads to an ICE restart,
/// at most `maxIceRestarts` times before the negotiator gives up.
public actor Negotiator {
    public enum Outcome: Hashable, Sendable {
        /// ICE connected (again).
        case connected
        /// ICE failed and the restarts ran out.
        case failed(reason: String)
    }

    public nonisolated let polite: Bool
    private let peer: any PeerConnection
    private let sendSignal: @Sendable (SignalPayload) async -> Void
    private let report: @Sendable (Outcome) async -> Void
    private let maxIceRestarts: Int
    private let logger: Logger

    private var makingOffer = false
    private var ignoreOffer = false
    private var remoteDescriptionSet = false
    private var pendingCandidates: [IceCandidate?] = []
    /// The callee may not offer before its first answer; negotiation asked for before that waits.
    private var mayOffer: Bool
    private var negotiationDeferred = false
    private var restartPending = false
    private(set) var iceRestarts = 0
    private var closed = false

    public init(peer: any PeerConnection, polite: Bool, maxIceRestarts: Int = 3, logger: Logger,
                send: @escaping @Sendable (SignalPayload) async -> Void,
                report: @escaping @Sendable (Outcome) async -> Void) {
        self.peer = peer
        self.polite = polite
        self.mayOffer = !polite
        self.maxIceRestarts = maxIceRestarts
        self.logger = logger
        self.sendSignal = send
        self.report = report
    }

    /// Feeds the peer connection's events until it closes.
    public func run() async {
        for await event in peer.events {
            guard !closed else { return }
            switch event {
            case .negotiationNeeded(let id):
                if await peer.shouldNegotiate(id) { await negotiate() }
            case .localCandidate(let candidate):
                await sendSignal(SignalPayload(candidate: candidate.map(CandidateSignal.candidate) ?? .endOfCandidates))
            case .iceConnectionState(.connected), .iceConnectionState(.completed):
                iceRestarts = 0
                await report(.connected)
            case .iceConnectionState(.failed):
                await restartIce()
            case .iceConnectionState, .remoteAudioStarted:
                break
            }
        }
    }

    public func close() { closed = true }

    /// A description or candidate from the other party.
    public func receive(_ signal: SignalPayload) async {
        do {
            if let description = signal.description { try await receive(description) }
            switch signal.candidate {
            case .candidate(let candidate)?: try await addCandidate(candidate)
            case .endOfCandidates?: try await addCandidate(nil)
            case nil: break
            }
        } catch {
            logger.debug("negotiation step failed", metadata: ["error": "\(error)"])
        }
    }

    /// Restarts ICE (after ICE failed, or when the network changed); gives up after `maxIceRestarts`.
    public func restartIce() async {
        guard !closed else { return }
        guard iceRestarts < maxIceRestarts else {
            closed = true
            await report(.failed(reason: "ice-failed"))
            return
        }
        iceRestarts += 1
        restartPending = true
        await negotiate()
    }

    private func negotiate() async {
        // The callee's first answer covers what it wanted to send; an ICE restart asked for before
        // that waits for it.
        guard mayOffer else {
            if restartPending { negotiationDeferred = true }
            return
        }
        guard !makingOffer else {
            negotiationDeferred = true
            return
        }
        makingOffer = true
        defer { makingOffer = false }
        do {
            let offer = try await peer.createOffer(iceRestart: restartPending)
            // The state may have moved on while the offer was made (a remote offer arrived).
            guard await peer.signalingState() == .stable else { return }
            try await peer.setLocalDescription(offer)
            restartPending = false
            await sendSignal(SignalPayload(description: offer))
        } catch {
            logger.debug("could not make an offer", metadata: ["error": "\(error)"])
        }
    }

    private func receive(_ description: SessionDescription) async throws {
        let state = await peer.signalingState()
        let collision = description.type == "offer" && (makingOffer || state != .stable)
        ignoreOffer = !polite && collision
        if ignoreOffer {
            logger.debug("ignoring a colliding offer (impolite peer)")
            return
        }
        if collision { try await peer.rollback() }
        try await peer.setRemoteDescription(description)
        remoteDescriptionSet = true
        for candidate in pendingCandidates { try? await peer.addRemoteCandidate(candidate) }
        pendingCandidates = []
        guard description.type == "offer" else { return }
        let answer = try await peer.createAnswer()
        try await peer.setLocalDescription(answer)
        await sendSignal(SignalPayload(description: answer))
        if !mayOffer {
            mayOffer = true
            if negotiationDeferred {
                negotiationDeferred = false
                await negotiate()
            }
        }
    }

    private func addCandidate(_ candidate: IceCandidate?) async throws {
        guard remoteDescriptionSet else {
            pendingCandidates.append(candidate)
            return
        }
        do {
            try await peer.addRemoteCandidate(candidate)
        } catch {
            // Candidates of an offer this peer ignored are expected to fail.
            if !ignoreOffer { throw error }
        }
    }
}
