import Logging
import ParleyProtocol

/// Drives a `NegotiationStateMachine` over the `PeerConnection` port: it feeds the machine the peer
/// connection's events, the other party's signals and the app's network changes, and performs the
/// actions the machine returns, one at a time and in order, so that the engine sees one operation
/// at a time and the far side gets our signals in the order the machine chose.
///
/// What it reads of the peer connection's events while an action is performed reaches the machine
/// after that action's result: it may be what the action brought about (an answer applied, then ICE
/// failing on the credentials it brought, reported before the call returns), and the machine must
/// see the answer applied first, or it would take the new credentials' failure for the old ones'
/// and never restart again. The port says nothing of ICE generations, so an old failure read during
/// that call is taken for a new one too: it costs one more restart, where the other way a call hung.
public actor Negotiator {
    public enum Outcome: Hashable, Sendable {
        /// ICE and DTLS connected (again): media can flow.
        case connected
        /// ICE failed and the restarts ran out ("ice-failed"), or the DTLS handshake failed ("dtls-failed").
        case failed(reason: String)
    }

    public nonisolated let polite: Bool
    private let peer: any PeerConnection
    private let sendSignal: @Sendable (SignalPayload) async -> Void
    private let report: @Sendable (Outcome) async -> Void
    private let logger: Logger
    private var machine: NegotiationStateMachine
    /// Actions decided but not yet performed; whoever finds it idle performs them all.
    private var queue: [NegotiationStateMachine.Action] = []
    private var performing = false
    /// The peer connection's events that came while an action was performed, for after its result.
    private var eventsDuringAction: [PeerConnectionEvent] = []

    public init(peer: any PeerConnection, polite: Bool, maxIceRestarts: Int = 3, logger: Logger,
                send: @escaping @Sendable (SignalPayload) async -> Void,
                report: @escaping @Sendable (Outcome) async -> Void) {
        self.peer = peer
        self.polite = polite
        self.machine = NegotiationStateMachine(polite: polite, maxIceRestarts: maxIceRestarts)
        self.logger = logger
        self.sendSignal = send
        self.report = report
    }

    /// ICE restarts since ICE last connected.
    var iceRestarts: Int { machine.iceRestarts }
    /// Whether it is performing actions (tests wait for it to be idle).
    var isPerforming: Bool { performing }

    /// Feeds the peer connection's events until it closes.
    public func run() async {
        for await event in peer.events {
            guard !machine.isClosed else { return }
            if performing {
                eventsDuringAction.append(event)
            } else {
                await handle(event)
            }
        }
    }

    private func handle(_ event: PeerConnectionEvent) async {
        switch event {
        case .negotiationNeeded(let id):
            if await peer.shouldNegotiate(id) { await perform(machine.negotiationNeeded()) }
        case .localCandidate(let candidate):
            await perform(machine.localCandidate(candidate))
        case .iceConnectionState(let state):
            await perform(machine.iceConnectionChanged(state))
        case .connectionState(let state):
            await perform(machine.connectionChanged(state))
        case .remoteAudioStarted:
            break
        }
    }

    public func close() {
        _ = machine.close()
        queue = []
        eventsDuringAction = []
    }

    /// A description, a candidate or a restart request from the other party.
    public func receive(_ signal: SignalPayload) async {
        await perform(machine.received(signal))
    }

    /// The network changed: ICE restarts (the polite side asks the impolite one to restart it).
    /// After `maxIceRestarts` restarts without connecting, negotiation fails.
    public func restartIce() async {
        await perform(machine.networkChanged())
    }

    /// Media stopped arriving on the connected call: ICE restarts (the polite side asks for it), as
    /// the path may be dead without ICE knowing yet. Counted with the other restarts.
    public func mediaStopped() async {
        await perform(machine.mediaStopped())
    }

    private func perform(_ actions: [NegotiationStateMachine.Action]) async {
        queue += actions
        guard !performing else { return }
        performing = true
        defer { performing = false }
        while !queue.isEmpty {
            let action = queue.removeFirst()
            queue += await execute(action)
            // Handling one may suspend (`shouldNegotiate`): what comes meanwhile waits its turn here too.
            while !eventsDuringAction.isEmpty, !machine.isClosed {
                await handle(eventsDuringAction.removeFirst())
            }
        }
    }

    /// Performs one action; answers what the machine makes of its result.
    private func execute(_ action: NegotiationStateMachine.Action) async -> [NegotiationStateMachine.Action] {
        switch action {
        case .createOffer(let iceRestart):
            return await step("could not make an offer") { try await peer.createOffer(iceRestart: iceRestart) } then: { $0.offerCreated($1) }
        case .createAnswer:
            return await step("could not make an answer") { try await peer.createAnswer() } then: { $0.answerCreated($1) }
        case .setLocalDescription(let description):
            return await step("local description refused") { try await peer.setLocalDescription(description) } then: { machine, _ in machine.localDescriptionSet() }
        case .setRemoteDescription(let description):
            return await step("remote description refused") { try await peer.setRemoteDescription(description) } then: { machine, _ in machine.remoteDescriptionSet() }
        case .addRemoteCandidate(let candidate):
            do {
                try await peer.addRemoteCandidate(candidate)
            } catch {
                // Candidates of an offer this peer ignored (glare) are expected to be refused.
                logger.debug("remote candidate refused", metadata: ["error": "\(error)"])
            }
            return []
        case .send(let signal):
            await sendSignal(signal)
            return []
        case .reportConnected:
            await report(.connected)
            return []
        case .reportFailed(let reason):
            await report(.failed(reason: reason))
            return []
        }
    }

    private func step<Result>(_ failure: Logger.Message, _ operation: () async throws -> Result,
                              then: (inout NegotiationStateMachine, Result) -> [NegotiationStateMachine.Action]) async -> [NegotiationStateMachine.Action] {
        do {
            let result = try await operation()
            return then(&machine, result)
        } catch {
            logger.debug(failure, metadata: ["error": "\(error)"])
            return machine.stepFailed()
        }
    }
}
