import Foundation
import Logging
import ParleyProtocol

/// What the app's UI hears about calls.
public enum CallEvent: Hashable, Sendable {
    /// A call arrived (over signaling, or from a VoIP push); CallKit shows it.
    case incoming(UUID, from: UserID, name: String?, video: Bool)
    case phase(UUID, CallStateMachine.Phase)
    case remoteUpdated(UUID, muted: Bool?, held: Bool?)
    case quality(UUID, QualityReport)
    case bitrate(UUID, BitrateController.Setting)
    /// The server took an outgoing call: how many of the callee's devices ring now, and how many
    /// were woken by push. Both zero: the callee is offline and the call will end unanswered.
    case invited(UUID, devices: Int, pushed: Int)
    /// Where audio plays now.
    case route(AudioOutput)
    /// An interruption ended without resuming; media waits for `resumeAfterInterruption()`.
    case pausedByInterruption
    /// Recording with consent moved: the new state, and why (the far side asks, agreed, stopped…).
    case recording(UUID, RecordingConsent.State, RecordingConsent.Change)
    /// A recording this device made is finished: its file and where it sits in the call.
    case recorded(UUID, CallRecordingFile)
    /// Whether media arrives from the far side: `false` once a connected call has received no
    /// packet for `Configuration.noMediaAfter` (nothing to hear, and no quality to rate: the call's
    /// quality is cleared, and ICE restarts: the path may be dead without ICE knowing yet), `true`
    /// when packets arrive again after that.
    case receivingMedia(UUID, Bool)
}

/// Runs calls: signaling on one side, the system call provider, the audio session and peer
/// connections on the other. Each call is a `CallController`, run as a child of `run()`; the
/// manager makes them, routes each call's signaling messages and system actions to its own, and
/// keeps what spans calls: the audio route and interruptions, VoIP pushes, a new signaling session.
public actor CallManager<C: Clock> where C.Duration == Duration {
    public struct Configuration: Sendable {
        public var statsInterval: Duration = .seconds(2)
        public var maxIceRestarts = 3
        public var relayOnly = false
        public var bitrate = BitrateController.Configuration()
        /// How long an ended call stays known (for `phase(of:)` and late events) before it is forgotten.
        public var endedCallRetention: Duration = .seconds(300)
        /// How long a connected call may receive no packet before `CallEvent.receivingMedia(_, false)`.
        public var noMediaAfter: Duration = .seconds(5)
        /// Connect audio calls while they ring (protocol.md, "Connecting while ringing"): ICE and DTLS
        /// are done before the answer, so answering costs the accept's trip and the first packet.
        /// Nothing is captured, sent or played before the answer. Needs an engine that can hold
        /// media (`PeerConnectionFactory.canHoldMedia`); video calls connect after the answer.
        public var connectWhileRinging = true
        /// Connecting while ringing, a callee offers only relay candidates (it needs TURN), so the
        /// caller learns none of its addresses before the answer (nor after: the call stays relayed).
        public var relayOnlyWhileRinging = false
        public init() {}
    }

    public nonisolated let events: AsyncStream<CallEvent>
    private let eventSink: AsyncStream<CallEvent>.Continuation
    private let signaling: SignalingClient<C>
    private let provider: any SystemCallProvider
    private let audio: any AudioSession
    private let logger: Logger
    private let environment: CallController<C>.Environment
    /// Every call known, until its controller's `run()` returns.
    private var calls: [CallID: CallController<C>] = [:]
    /// Calls made, for `run()` to run.
    private let made: AsyncStream<CallController<C>>
    private let madeSink: AsyncStream<CallController<C>>.Continuation
    /// Route and interruption policy while a call is in progress.
    private var route: AudioRoutePolicy?
    /// The signaling session's ICE servers (each `welcome` brings them), read by every call.
    private let iceServers = IceServerList()
    private var hadSession = false

    public init(signaling: SignalingClient<C>, provider: any SystemCallProvider, audio: any AudioSession,
                peers: any PeerConnectionFactory, clock: C, logger: Logger, configuration: Configuration = Configuration()) {
        self.signaling = signaling
        self.provider = provider
        self.audio = audio
        self.logger = logger
        (events, eventSink) = AsyncStream.makeStream()
        (made, madeSink) = AsyncStream.makeStream()
        environment = CallController.Environment(signaling: signaling, provider: provider, audio: audio, peers: peers, clock: clock,
                                                 logger: logger, configuration: configuration, events: eventSink,
                                                 iceServers: { [iceServers] in iceServers.servers })
    }

    /// Starts signaling and handles calls until cancelled. Every call's tasks are children of this
    /// one (a call made before it runs waits for it).
    public func run() async {
        await signaling.start()
        await withDiscardingTaskGroup { group in
            group.addTask {
                for await event in self.signaling.events { await self.handle(event) }
            }
            group.addTask {
                for await action in self.provider.actions { await self.handle(action) }
            }
            for await call in made {
                group.addTask {
                    await call.run()
                    await self.forget(call)
                }
            }
        }
    }

    /// Whether a call is being answered, connecting or connected (or dialed): the audio session is the call's.
    public var hasCallInProgress: Bool {
        get async { await anyCall { await $0.isInProgress } }
    }

    /// The phase of a call, if this manager knows it.
    public func phase(of call: UUID) async -> CallStateMachine.Phase? {
        await calls[CallID(uuid: call)]?.phase
    }

    /// The network changed: signaling reconnects and resumes, and every call restarts ICE.
    public func networkChanged() async {
        await signaling.networkChanged()
        for call in calls.values { await call.networkChanged() }
    }

    // MARK: Recording with consent

    /// Asks the other party to let this device record the call, both voices, to an Ogg/Opus file at
    /// `path`. Nothing is recorded until they agree (`CallEvent.recording` with `.acceptedThere`);
    /// recording stops when either side stops it or the call ends (`CallEvent.recorded`).
    public func requestRecording(_ uuid: UUID, to path: String, layout: RecordingLayout = .mixed) async throws(RecordingConsent.Refusal) {
        guard let call = calls[CallID(uuid: uuid)] else { throw .noSuchCall }
        // Asking for what this device cannot do would only make the far side answer for nothing.
        guard await call.canRecordCalls else { throw .cannotRecord }
        try await call.performRecording(needsConnection: true, keeping: (path, layout)) { (consent: inout RecordingConsent) throws(RecordingConsent.Refusal) in
            try consent.request()
        }
    }

    /// Answers the other party's request to record the call.
    public func answerRecording(_ uuid: UUID, consent: Bool) async throws(RecordingConsent.Refusal) {
        guard let call = calls[CallID(uuid: uuid)] else { throw .noSuchCall }
        try await call.performRecording(needsConnection: true) { (recording: inout RecordingConsent) throws(RecordingConsent.Refusal) in
            try recording.answer(consent: consent)
        }
    }

    /// Stops recording the call (either side may), or withdraws a request not yet answered.
    public func stopRecording(_ uuid: UUID) async throws(RecordingConsent.Refusal) {
        guard let call = calls[CallID(uuid: uuid)] else { throw .noSuchCall }
        try await call.performRecording(needsConnection: false) { (consent: inout RecordingConsent) throws(RecordingConsent.Refusal) in
            try consent.stop()
        }
    }

    /// Where a call's recording stands here.
    public func recordingState(of uuid: UUID) async -> RecordingConsent.State? {
        await calls[CallID(uuid: uuid)]?.recording.state
    }

    // MARK: Audio route and interruptions

    /// The audio route changed, or the user pressed the speaker button.
    public func audioRouteChanged(_ event: AudioRouteEvent) async {
        var policy = await currentRoutePolicy()
        let actions = policy.handle(event)
        route = policy
        await perform(actions)
    }

    /// An audio interruption began or ended, or media services were reset.
    public func audioInterrupted(_ interruption: AudioInterruption) async {
        var policy = await currentRoutePolicy()
        let actions = policy.handle(interruption)
        route = policy
        await perform(actions)
    }

    /// The user resumed media after an interruption that did not resume by itself.
    public func resumeAfterInterruption() async {
        var policy = await currentRoutePolicy()
        let actions = policy.userResumed()
        route = policy
        await perform(actions)
    }

    private func currentRoutePolicy() async -> AudioRoutePolicy {
        if let route { return route }
        return AudioRoutePolicy(video: await videoCallInProgress())
    }

    private func videoCallInProgress() async -> Bool {
        await anyCall { call in
            guard await call.isInProgress else { return false }
            return await call.video
        }
    }

    private func perform(_ actions: [AudioRoutePolicy.Action]) async {
        for action in actions {
            switch action {
            case .route(let output): await audio.route(to: output)
            case .overrideToSpeaker(let on): await audio.overrideOutputToSpeaker(on)
            case .pauseMedia: await audio.setAudioEnabled(false)
            case .resumeMedia: await audio.setAudioEnabled(true)
            case .restartAudio:
                await audio.setAudioEnabled(false)
                await audio.setAudioEnabled(true)
            case .reconfigureSession:
                await audio.configure(CallAudioConfiguration(video: await videoCallInProgress()))
            case .holdCall, .unholdCall:
                let held = action == .holdCall
                for call in calls.values {
                    if await call.isInProgress { await call.perform { $0.setHeldByApp(held) } }
                }
            case .show(let output):
                eventSink.yield(.route(output))
            case .showPausedAwaitingUser:
                eventSink.yield(.pausedByInterruption)
            }
        }
    }

    // MARK: VoIP push

    /// A VoIP push arrived that its source did not report. The call is reported to the system
    /// before `completion` runs, whatever the payload says: a malformed payload is reported, ended,
    /// then completed.
    public func handleVoIPPush(_ payload: Data, completion: @escaping @Sendable () -> Void) async {
        let push = VoIPPushReport(payload: payload, phoneRunning: true)
        do {
            try await provider.reportIncomingCall(push.report)
        } catch {
            logger.debug("the system refused the incoming call", metadata: ["call.id": "\(push.report.call)"])
        }
        if let reason = push.endAtOnce { await provider.reportCallEnded(push.report.call, reason: reason) }
        completion()
        await pushedCallReported(push)
    }

    /// A VoIP push whose call the system was told of (`VoIPPushReport`; one it ended at once is
    /// ignored): it rings here until the server's answer says whether it still rings — a push may
    /// come late. The call asks, as a task of its own, so the next push is handled at once.
    public func pushedCallReported(_ push: VoIPPushReport) async {
        guard push.endAtOnce == nil, let pushed = push.call else { return }
        let call: CallController<C>
        if let known = calls[pushed.id] {
            call = known
        } else {
            let (machine, _) = CallStateMachine.incoming(pushed.id, from: pushed.from, name: pushed.name, media: pushed.media,
                                                         alreadyReported: true, connectWhileRinging: connectsWhileRinging(pushed.media))
            call = make(machine)
            eventSink.yield(.incoming(pushed.id.uuid, from: pushed.from, name: pushed.name, video: pushed.media.video))
        }
        await call.checkPushedCall()
    }

    // MARK: Signaling

    private func handle(_ event: SignalingEvent) async {
        switch event {
        case .connected(let welcome):
            iceServers.servers = welcome.iceServers
            if !welcome.resumed, hadSession { await recoverAfterNewSession() }
            hadSession = true
        case .message(let message):
            await handle(message)
        case .disconnected, .connectFailed, .stopped:
            break
        }
    }

    /// A new session (after a server restart, or a resume the server could not serve): whatever
    /// this device missed is gone, so every call asks the server about itself, all at once
    /// (`CallController.recoverAfterNewSession`). `ringing` and `active` go on untouched: media
    /// never went through the server.
    private func recoverAfterNewSession() async {
        await withDiscardingTaskGroup { group in
            for call in calls.values { group.addTask { await call.recoverAfterNewSession() } }
        }
    }

    private func handle(_ message: ServerMessage) async {
        switch message {
        case .callIncoming(let incoming):
            if let call = calls[incoming.call] {
                await call.perform { $0.signalingInviteArrived() }
            } else {
                let (machine, actions) = CallStateMachine.incoming(incoming.call, from: incoming.from.user, name: incoming.from.name,
                                                                   address: incoming.from.address, media: incoming.media,
                                                                   alreadyReported: false, connectWhileRinging: connectsWhileRinging(incoming.media))
                let call = make(machine)
                eventSink.yield(.incoming(incoming.call.uuid, from: incoming.from.user, name: incoming.from.name, video: incoming.media.video))
                await call.start(actions)
                await call.perform { $0.signalingInviteArrived() }
            }
        case .callRinging(let ringing):
            await calls[ringing.call]?.perform { $0.remoteRinging(device: ringing.device, early: ringing.early == true) }
        case .callAccepted(let accepted):
            await calls[accepted.call]?.perform { $0.remoteAccepted(device: accepted.device) }
        case .callSignal(let signal):
            await calls[signal.call]?.received(signal.signal, from: signal.from.device)
        case .callUpdated(let update):
            await calls[update.call]?.remoteUpdated(update)
        case .callEnded(let ended):
            await calls[ended.call]?.perform { $0.remoteEnded(ended.reason) }
        default:
            break
        }
    }

    /// Whether a call with `media` connects while it rings: audio calls, with an engine that can hold media.
    private func connectsWhileRinging(_ media: MediaSpec) -> Bool {
        environment.configuration.connectWhileRinging && environment.peers.canHoldMedia && !media.video
    }

    // MARK: System actions

    private func handle(_ action: ProviderAction) async {
        switch action {
        case .start(let id, let uuid, let to, let video):
            let media = MediaSpec(audio: true, video: video)
            let (machine, actions) = CallStateMachine.outgoing(CallID(uuid: uuid), to: to, media: media, action: id,
                                                               connectWhileRinging: connectsWhileRinging(media))
            await make(machine).start(actions)
        case .answer(let id, let uuid):
            await perform(uuid, orFail: id) { $0.answer(id) }
        case .end(let id, let uuid):
            let call = CallID(uuid: uuid)
            let another = await anyCall { other in
                guard other.id != call else { return false }
                return await other.isInProgress
            }
            await perform(uuid, orFail: id) { $0.end(id, anotherCallActive: another) }
        case .setHeld(let id, let uuid, let held):
            await perform(uuid, orFail: id) { $0.setHeld(held, action: id) }
        case .setMuted(let id, let uuid, let muted):
            await perform(uuid, orFail: id) { $0.setMuted(muted, action: id) }
        case .playDTMF(let id, let uuid, let digits):
            await perform(uuid, orFail: id) { $0.playDTMF(digits, action: id) }
        case .audioSessionActivated:
            // Audio starts here and only here, every time the system activates the session.
            await audio.setAudioEnabled(true)
        case .audioSessionDeactivated:
            await audio.setAudioEnabled(false)
        case .timedOut(let id):
            for call in calls.values { await call.perform { $0.actionTimedOut(id) } }
        case .reset:
            for call in calls.values { await call.perform { $0.reset() } }
            await audio.setAudioEnabled(false)
        }
    }

    /// A system action for a call; one for a call nobody knows fails (CallKit tells the user).
    private func perform(_ uuid: UUID, orFail action: ProviderActionID,
                         _ event: @Sendable (inout CallStateMachine) -> [CallStateMachine.Action]) async {
        guard let call = calls[CallID(uuid: uuid)] else { return await provider.fail(action) }
        await call.perform(event)
    }

    // MARK: Calls

    /// A new call's controller, known from now on and run by `run()`.
    private func make(_ machine: CallStateMachine) -> CallController<C> {
        let call = CallController(machine, environment: environment)
        calls[machine.id] = call
        madeSink.yield(call)
        return call
    }

    /// A call whose controller finished (ended, and kept its retention) is forgotten.
    private func forget(_ call: CallController<C>) {
        if calls[call.id] === call { calls[call.id] = nil }
    }

    private func anyCall(_ condition: (CallController<C>) async -> Bool) async -> Bool {
        for call in calls.values {
            if await condition(call) { return true }
        }
        return false
    }
}

extension CallID {
    /// The call id of a system call UUID.
    public init(uuid: UUID) { self.init(rawValue: uuid.uuidString)! }
    public var uuid: UUID { UUID(uuidString: rawValue)! }
}

/// The ICE servers of the signaling session now: set by the manager, read by its calls.
private final class IceServerList: @unchecked Sendable {  // its one value, under its lock
    private let lock = NSLock()
    private var value: [IceServer] = []

    var servers: [IceServer] {
        get { lock.withLock { value } }
        set { lock.withLock { value = newValue } }
    }
}
