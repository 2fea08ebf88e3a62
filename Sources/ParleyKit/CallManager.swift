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
/// connections on the other. Owns every call's state machine and performs its actions.
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
        public init() {}
    }

    public nonisolated let events: AsyncStream<CallEvent>
    private let eventSink: AsyncStream<CallEvent>.Continuation
    private let signaling: SignalingClient<C>
    private let provider: any SystemCallProvider
    private let audio: any AudioSession
    private let peers: any PeerConnectionFactory
    private let clock: C
    private let logger: Logger
    private let configuration: Configuration

    /// A request for a call, waiting in the call's outbox.
    private struct Outgoing: Sendable {
        var make: @Sendable (String) -> ClientMessage
        /// What the answer means to the call (nil: nothing).
        var onSuccess: (@Sendable (inout CallStateMachine, Ack) -> [CallStateMachine.Action])?
        var onFailure: (@Sendable (inout CallStateMachine, SignalingError) -> [CallStateMachine.Action])?
    }

    private struct Live {
        var machine: CallStateMachine
        var peer: (any PeerConnection)?
        var negotiator: Negotiator?
        var pendingSignals: [SignalPayload] = []
        /// The call's requests in the order its state machine and negotiator asked for them: one
        /// task hands them to the signaling client one after another (without waiting for answers).
        var outbox: AsyncStream<Outgoing>.Continuation
        /// The outbox's task, and the tasks waiting for answers; cancelled when the call is forgotten.
        var requests: [Task<Void, Never>] = []
        /// The negotiator and the stats loop; cancelled with the peer connection.
        var media: [Task<Void, Never>] = []
        var quality: QualityReport?
        var recording = RecordingConsent()
        /// Where this device records once the far side agrees.
        var recordingFile: (path: String, layout: RecordingLayout)?
    }

    private var calls: [CallID: Live] = [:]
    /// Route and interruption policy while a call is in progress.
    private var route: AudioRoutePolicy?
    private var iceServers: [IceServer] = []
    private var hadSession = false

    public init(signaling: SignalingClient<C>, provider: any SystemCallProvider, audio: any AudioSession,
                peers: any PeerConnectionFactory, clock: C, logger: Logger, configuration: Configuration = Configuration()) {
        self.signaling = signaling
        self.provider = provider
        self.audio = audio
        self.peers = peers
        self.clock = clock
        self.logger = logger
        self.configuration = configuration
        (events, eventSink) = AsyncStream.makeStream()
    }

    /// Starts signaling and handles calls until cancelled.
    public func run() async {
        await signaling.start()
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await event in self.signaling.events { await self.handle(event) }
            }
            group.addTask {
                for await action in self.provider.actions { await self.handle(action) }
            }
        }
    }

    /// Whether a call is being answered, connecting or connected (or dialed): the audio session is the call's.
    public var hasCallInProgress: Bool {
        calls.values.contains { $0.machine.isInProgress }
    }

    /// The phase of a call, if this manager knows it.
    public func phase(of call: UUID) -> CallStateMachine.Phase? {
        calls[CallID(uuid: call)]?.machine.phase
    }

    /// The network changed: signaling reconnects and resumes, and every call restarts ICE.
    public func networkChanged() async {
        await signaling.networkChanged()
        for live in calls.values where !live.machine.phase.isEnded {
            await live.negotiator?.restartIce()
        }
    }

    // MARK: Recording with consent

    /// Asks the other party to let this device record the call, both voices, to an Ogg/Opus file at
    /// `path`. Nothing is recorded until they agree (`CallEvent.recording` with `.acceptedThere`);
    /// recording stops when either side stops it or the call ends (`CallEvent.recorded`).
    public func requestRecording(_ uuid: UUID, to path: String, layout: RecordingLayout = .mixed) async throws(RecordingConsent.Refusal) {
        let call = CallID(uuid: uuid)
        // Asking for what this device cannot do would only make the far side answer for nothing.
        if let peer = calls[call]?.peer, !peer.canRecordCalls { throw .cannotRecord }
        try await performRecording(call, needsConnection: true, keeping: (path, layout)) { (consent: inout RecordingConsent) throws(RecordingConsent.Refusal) in
            try consent.request()
        }
    }

    /// Answers the other party's request to record the call.
    public func answerRecording(_ uuid: UUID, consent: Bool) async throws(RecordingConsent.Refusal) {
        try await performRecording(CallID(uuid: uuid), needsConnection: true) { (recording: inout RecordingConsent) throws(RecordingConsent.Refusal) in
            try recording.answer(consent: consent)
        }
    }

    /// Stops recording the call (either side may), or withdraws a request not yet answered.
    public func stopRecording(_ uuid: UUID) async throws(RecordingConsent.Refusal) {
        try await performRecording(CallID(uuid: uuid), needsConnection: false) { (consent: inout RecordingConsent) throws(RecordingConsent.Refusal) in
            try consent.stop()
        }
    }

    /// Where a call's recording stands here.
    public func recordingState(of uuid: UUID) -> RecordingConsent.State? {
        calls[CallID(uuid: uuid)]?.recording.state
    }

    /// A step the user took: refused (thrown) when it does not fit; `file` is where this device
    /// records if the step leads to recording.
    private func performRecording(_ call: CallID, needsConnection: Bool, keeping file: (path: String, layout: RecordingLayout)? = nil,
                                  _ event: (inout RecordingConsent) throws(RecordingConsent.Refusal) -> [RecordingConsent.Action]) async throws(RecordingConsent.Refusal) {
        guard var live = calls[call] else { throw .noSuchCall }
        if needsConnection {
            switch live.machine.phase {
            case .connecting, .connected: break
            default: throw .notConnected
            }
        }
        let actions = try event(&live.recording)
        if let file { live.recordingFile = file }
        calls[call] = live
        await execute(actions, for: call)
    }

    /// A step from the far side, the server or the call's own course.
    private func performRecording(_ call: CallID, _ event: (inout RecordingConsent) -> [RecordingConsent.Action]) async {
        guard var live = calls[call] else { return }
        let actions = event(&live.recording)
        calls[call] = live
        await execute(actions, for: call)
    }

    private func execute(_ actions: [RecordingConsent.Action], for call: CallID) async {
        for action in actions {
            guard let live = calls[call] else { return }
            switch action {
            case .send(let step):
                let pending = await signaling.submit { .callUpdate(CallUpdate(id: $0, call: call, recording: step)) }
                let task = Task {
                    do throws(SignalingError) {
                        _ = try await pending.answer()
                    } catch where error.code == .rejected {
                        // Only the server's refusal undoes the step: after a timeout it may well
                        // have taken it (the far side then records, and this side can still stop it).
                        await self.performRecording(call) { $0.refused(step, message: error.description) }
                    } catch {
                        self.logger.warning("a recording step went unanswered", metadata: ["call.id": "\(call)", "error": "\(error)"])
                    }
                }
                calls[call]?.requests.append(task)
            case .startRecorder:
                do {
                    guard let peer = live.peer, let file = live.recordingFile else { throw CallRecordingUnsupported() }
                    try await peer.startCallRecording(to: file.path, layout: file.layout)
                    // The actor took other events while the recorder started: a stop (or the call's
                    // end) that came meanwhile found nothing to stop, so it is stopped now.
                    if calls[call]?.recording.state != .on(here: true), let file = await peer.stopCallRecording() {
                        eventSink.yield(.recorded(call.uuid, file))
                    }
                } catch {
                    logger.error("could not start recording the call", metadata: ["call.id": "\(call)", "error": "\(error)"])
                    await performRecording(call) { $0.recorderFailed("\(error)") }
                }
            case .stopRecorder:
                if let file = await live.peer?.stopCallRecording() { eventSink.yield(.recorded(call.uuid, file)) }
            case .notify(let state, let change):
                eventSink.yield(.recording(call.uuid, state, change))
            }
        }
    }

    // MARK: Audio route and interruptions

    /// The audio route changed, or the user pressed the speaker button.
    public func audioRouteChanged(_ event: AudioRouteEvent) async {
        var policy = currentRoutePolicy()
        let actions = policy.handle(event)
        route = policy
        await perform(actions)
    }

    /// An audio interruption began or ended, or media services were reset.
    public func audioInterrupted(_ interruption: AudioInterruption) async {
        var policy = currentRoutePolicy()
        let actions = policy.handle(interruption)
        route = policy
        await perform(actions)
    }

    /// The user resumed media after an interruption that did not resume by itself.
    public func resumeAfterInterruption() async {
        var policy = currentRoutePolicy()
        let actions = policy.userResumed()
        route = policy
        await perform(actions)
    }

    private func currentRoutePolicy() -> AudioRoutePolicy {
        if let route { return route }
        let video = calls.values.contains { $0.machine.isInProgress && $0.machine.media.video }
        return AudioRoutePolicy(video: video)
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
                let video = calls.values.contains { $0.machine.isInProgress && $0.machine.media.video }
                await audio.configure(CallAudioConfiguration(video: video))
            case .holdCall, .unholdCall:
                let held = action == .holdCall
                for (id, live) in calls where live.machine.isInProgress {
                    await perform(id) { $0.setHeldByApp(held) }
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
    /// come late.
    public func pushedCallReported(_ push: VoIPPushReport) async {
        guard push.endAtOnce == nil, let pushed = push.call else { return }
        if calls[pushed.id] == nil {
            let (machine, _) = CallStateMachine.incoming(pushed.id, from: pushed.from, name: pushed.name, media: pushed.media,
                                                         alreadyReported: true)
            calls[pushed.id] = makeLive(machine)
            eventSink.yield(.incoming(pushed.id.uuid, from: pushed.from, name: pushed.name, video: pushed.media.video))
        }
        // In a task of its own, so the next push is handled at once rather than after this round trip.
        Task { await self.checkPushedCall(pushed.id) }
    }

    private func checkPushedCall(_ call: CallID) async {
        do {
            let state = try await signaling.request { .callState(CallRequest(id: $0, call: call)) }
                .decodeResult(CallStateResult.self)
            if state.state == .ended {
                await perform(call) { $0.remoteEnded(state.reason ?? .hangup) }
            }
        } catch let error as SignalingError {
            if error.serverCode == .callNotFound { await perform(call) { $0.remoteEnded(.cancelled) } }
        } catch {
            logger.debug("could not ask for the pushed call's state", metadata: ["error": "\(error)"])
        }
    }

    // MARK: Signaling

    private func handle(_ event: SignalingEvent) async {
        switch event {
        case .connected(let welcome):
            iceServers = welcome.iceServers
            if !welcome.resumed, hadSession { await recoverAfterNewSession() }
            hadSession = true
        case .message(let message):
            await handle(message)
        case .disconnected, .connectFailed, .stopped:
            break
        }
    }

    /// A new session (after a server restart, or a resume the server could not serve): whatever
    /// this device missed is gone, so ask the server about every call (protocol v1, "Restarts and
    /// several nodes"). `ringing` and `active` go on untouched (media never went through the server);
    /// `ended` ends with the server's reason; `call_not_found` means the server lost the call, which
    /// then cannot be signalled any more: it ends with `server-lost-call`. Anything else (no answer in
    /// time, the connection dropped again) leaves the call alone; the next new session asks again.
    private func recoverAfterNewSession() async {
        let open = calls.filter { !$0.value.machine.phase.isEnded }.map(\.key)
        await withTaskGroup(of: (CallID, Result<CallStateResult, SignalingError>).self) { group in
            for id in open {
                let pending = await signaling.submit { .callState(CallRequest(id: $0, call: id)) }
                group.addTask {
                    do throws(SignalingError) {
                        let ack = try await pending.answer()
                        guard let state = try? ack.decodeResult(CallStateResult.self) else {
                            return (id, .failure(SignalingError(code: .rejected, serverCode: .badRequest, message: "unreadable call.state answer")))
                        }
                        return (id, .success(state))
                    } catch {
                        return (id, .failure(error))
                    }
                }
            }
            for await (id, outcome) in group {
                switch outcome {
                case .success(let state) where state.state == .ended:
                    await perform(id) { $0.remoteEnded(state.reason ?? .connectionLost) }
                case .success(let state) where state.recording != nil:
                    // A restarted server keeps a recording that is on, not a request nobody answered.
                    await performRecording(id) { $0.server(state.recording!) }
                case .failure(let error) where error.serverCode == .callNotFound:
                    logger.notice("the server lost a call; ending it", metadata: ["call.id": "\(id)"])
                    await perform(id) { $0.remoteEnded(.serverLostCall) }
                case .success, .failure:
                    break
                }
            }
        }
    }

    private func handle(_ message: ServerMessage) async {
        switch message {
        case .callIncoming(let incoming):
            if calls[incoming.call] != nil {
                await perform(incoming.call) { $0.signalingInviteArrived() }
            } else {
                let (machine, actions) = CallStateMachine.incoming(incoming.call, from: incoming.from.user, name: incoming.from.name,
                                                                   address: incoming.from.address,
                                                                   media: incoming.media, alreadyReported: false)
                calls[incoming.call] = makeLive(machine)
                eventSink.yield(.incoming(incoming.call.uuid, from: incoming.from.user, name: incoming.from.name, video: incoming.media.video))
                await execute(actions, for: incoming.call)
                await perform(incoming.call) { $0.signalingInviteArrived() }
            }
        case .callRinging:
            break
        case .callAccepted(let accepted):
            await perform(accepted.call) { $0.remoteAccepted() }
        case .callSignal(let signal):
            guard var live = calls[signal.call] else { return }
            if let negotiator = live.negotiator {
                await negotiator.receive(signal.signal)
            } else {
                live.pendingSignals.append(signal.signal)
                calls[signal.call] = live
            }
        case .callUpdated(let update):
            guard let live = calls[update.call] else { return }
            if let step = update.recording {
                await performRecording(update.call) { $0.remote(step) }
            } else {
                eventSink.yield(.remoteUpdated(live.machine.uuid, muted: update.muted, held: update.held))
            }
        case .callEnded(let ended):
            await perform(ended.call) { $0.remoteEnded(ended.reason) }
        default:
            break
        }
    }

    // MARK: System actions

    private func handle(_ action: ProviderAction) async {
        switch action {
        case .start(let id, let uuid, let to, let video):
            let call = CallID(uuid: uuid)
            let (machine, actions) = CallStateMachine.outgoing(call, to: to, media: MediaSpec(audio: true, video: video), action: id)
            calls[call] = makeLive(machine)
            await execute(actions, for: call)
        case .answer(let id, let uuid):
            await perform(CallID(uuid: uuid), orFail: id) { $0.answer(id) }
        case .end(let id, let uuid):
            let call = CallID(uuid: uuid)
            let another = calls.contains { $0.key != call && $0.value.machine.isInProgress }
            await perform(call, orFail: id) { $0.end(id, anotherCallActive: another) }
        case .setHeld(let id, let uuid, let held):
            await perform(CallID(uuid: uuid), orFail: id) { $0.setHeld(held, action: id) }
        case .setMuted(let id, let uuid, let muted):
            await perform(CallID(uuid: uuid), orFail: id) { $0.setMuted(muted, action: id) }
        case .playDTMF(let id, let uuid, let digits):
            await perform(CallID(uuid: uuid), orFail: id) { $0.playDTMF(digits, action: id) }
        case .audioSessionActivated:
            // Audio starts here and only here, every time the system activates the session.
            await audio.setAudioEnabled(true)
        case .audioSessionDeactivated:
            await audio.setAudioEnabled(false)
        case .timedOut(let id):
            for call in Array(calls.keys) { await perform(call) { $0.actionTimedOut(id) } }
        case .reset:
            for id in Array(calls.keys) { await perform(id) { $0.reset() } }
            await audio.setAudioEnabled(false)
        }
    }

    // MARK: Performing actions

    private func perform(_ call: CallID, orFail action: ProviderActionID? = nil,
                         _ event: (inout CallStateMachine) -> [CallStateMachine.Action]) async {
        guard var live = calls[call] else {
            if let action { await provider.fail(action) }
            return
        }
        let before = live.machine.phase
        let actions = event(&live.machine)
        calls[call] = live
        await execute(actions, for: call)
        if let phase = calls[call]?.machine.phase, phase != before {
            if phase.isEnded { await performRecording(call) { $0.callEnded() } }
            eventSink.yield(.phase(call.uuid, phase))
            if phase.isEnded { forgetLater(call) }
        }
    }

    private func makeLive(_ machine: CallStateMachine) -> Live {
        let (outgoing, outbox) = AsyncStream<Outgoing>.makeStream()
        let call = machine.id
        let drain = Task { [signaling] in
            for await request in outgoing {
                let pending = await signaling.submit(request.make)
                guard request.onSuccess != nil || request.onFailure != nil else { continue }
                self.awaitAnswer(pending, of: request, for: call)
            }
        }
        return Live(machine: machine, outbox: outbox, requests: [drain])
    }

    private func awaitAnswer(_ pending: PendingRequest, of request: Outgoing, for call: CallID) {
        let task = Task {
            do throws(SignalingError) {
                let ack = try await pending.answer()
                if let onSuccess = request.onSuccess { await self.perform(call) { onSuccess(&$0, ack) } }
            } catch where error.code == .cancelled {
                return
            } catch {
                if let onFailure = request.onFailure { await self.perform(call) { onFailure(&$0, error) } }
            }
        }
        calls[call]?.requests.append(task)
    }

    /// Queues a request of a call behind the ones it asked for before.
    private func send(_ call: CallID, _ make: @escaping @Sendable (String) -> ClientMessage,
                      onSuccess: (@Sendable (inout CallStateMachine, Ack) -> [CallStateMachine.Action])? = nil,
                      onFailure: (@Sendable (inout CallStateMachine, SignalingError) -> [CallStateMachine.Action])? = nil) {
        calls[call]?.outbox.yield(Outgoing(make: make, onSuccess: onSuccess, onFailure: onFailure))
    }

    /// A description, candidate or restart request from the negotiator: queued, not awaited, so
    /// candidates leave back to back behind their description.
    private func sendSignal(_ signal: SignalPayload, for call: CallID) {
        send(call) { .callSignal(CallSignal(id: $0, call: call, signal: signal)) }
    }

    private func execute(_ actions: [CallStateMachine.Action], for call: CallID) async {
        for action in actions {
            guard let live = calls[call] else { return }
            let machine = live.machine
            switch action {
            case .sendInvite:
                send(call, { .callInvite(CallInvite(id: $0, call: call, to: machine.remote, media: machine.media)) },
                     onSuccess: { [eventSink] machine, ack in
                         if let result = try? ack.decodeResult(CallInviteResult.self) {
                             eventSink.yield(.invited(call.uuid, devices: result.devices, pushed: result.pushed))
                         }
                         return machine.inviteAcknowledged()
                     },
                     onFailure: { machine, _ in machine.inviteFailed() })
            case .sendRinging:
                send(call) { .callRinging(CallRequest(id: $0, call: call)) }
            case .sendAccept:
                send(call, { .callAccept(CallRequest(id: $0, call: call)) },
                     onSuccess: { machine, _ in machine.acceptAcknowledged() },
                     onFailure: { machine, error in machine.acceptFailed(error.serverCode) })
            case .sendDecline(let reason):
                send(call) { .callDecline(CallDecline(id: $0, call: call, reason: reason)) }
            case .sendHangup(let reason):
                if let quality = live.quality?.callQuality {
                    send(call) { .callReport(CallReport(id: $0, call: call, quality: quality)) }
                }
                send(call) { .callHangup(CallHangup(id: $0, call: call, reason: reason)) }
            case .sendUpdate(let muted, let held):
                send(call) { .callUpdate(CallUpdate(id: $0, call: call, muted: muted, held: held)) }
            case .reportIncoming:
                do {
                    try await provider.reportIncomingCall(IncomingCallReport(call: call.uuid, caller: machine.remote,
                                                                             callerName: machine.remoteName, video: machine.media.video,
                                                                             callerAddress: machine.remoteAddress))
                } catch {
                    // The system refused (Do Not Disturb, blocked caller): decline for the user.
                    await perform(call) { $0.remoteEnded(.declined) }
                    send(call) { .callDecline(CallDecline(id: $0, call: call, reason: .busy)) }
                }
            case .reportStartedConnecting:
                await provider.reportOutgoingCallStartedConnecting(call.uuid)
            case .reportConnected:
                await provider.reportOutgoingCallConnected(call.uuid)
            case .reportEnded(let reason):
                await provider.reportCallEnded(call.uuid, reason: reason)
            case .fulfill(let id):
                await provider.fulfill(id)
            case .fail(let id):
                await provider.fail(id)
            case .configureAudio:
                await audio.configure(CallAudioConfiguration(video: machine.media.video))
            case .makePeerConnection(let polite):
                await makePeerConnection(for: call, polite: polite)
            case .closePeerConnection:
                await closePeerConnection(for: call)
            case .setPeerMuted(let muted):
                await live.peer?.setMicrophoneMuted(muted)
            case .setPeerHeld(let held):
                await live.peer?.setOnHold(held)
            case .sendDTMF(let tones, let action):
                do {
                    // An engine that cannot send DTMF fails the action at once (CallKit tells the user).
                    guard let peer = live.peer, peer.canSendDTMF else { throw CancellationError() }
                    try await peer.sendDTMF(tones)
                    await provider.fulfill(action)
                } catch {
                    await provider.fail(action)
                }
            }
        }
    }

    private func forgetLater(_ call: CallID) {
        let retention = configuration.endedCallRetention
        Task { [clock] in
            try? await clock.sleep(for: retention)
            self.forget(call)
        }
    }

    private func forget(_ call: CallID) {
        guard let live = calls[call], live.machine.phase.isEnded else { return }
        live.outbox.finish()
        for task in live.requests { task.cancel() }
        calls[call] = nil
    }

    private func makePeerConnection(for call: CallID, polite: Bool) async {
        guard let live = calls[call] else { return }
        let configuration = PeerConnectionConfiguration(iceServers: iceServers, relayOnly: self.configuration.relayOnly,
                                                        media: live.machine.media)
        let peer: any PeerConnection
        do {
            peer = try await peers.makePeerConnection(configuration)
        } catch {
            logger.error("could not create a peer connection", metadata: ["call.id": "\(call)", "error": "\(error)"])
            await perform(call) { $0.mediaFailed("media-failed") }
            return
        }
        let negotiator = Negotiator(peer: peer, polite: polite, maxIceRestarts: self.configuration.maxIceRestarts, logger: logger,
            send: { [weak self] signal in await self?.sendSignal(signal, for: call) },
            report: { [weak self] outcome in await self?.negotiation(outcome, for: call) })
        guard var current = calls[call], !current.machine.phase.isEnded else {
            await peer.close()
            return
        }
        current.peer = peer
        current.negotiator = negotiator
        let pending = current.pendingSignals
        current.pendingSignals = []
        current.media.append(Task { await negotiator.run() })
        calls[call] = current
        for signal in pending { await negotiator.receive(signal) }
        await perform(call) { $0.peerConnectionReady() }
    }

    private func negotiation(_ outcome: Negotiator.Outcome, for call: CallID) async {
        switch outcome {
        case .connected:
            await perform(call) { $0.mediaConnected() }
            startQualityLoop(for: call)
        case .failed(let reason):
            await perform(call) { $0.mediaFailed(reason) }
        }
    }

    private func startQualityLoop(for call: CallID) {
        guard let live = calls[call], let peer = live.peer, live.media.count < 2 else { return }
        let interval = configuration.statsInterval
        let bitrateConfiguration = configuration.bitrate
        let noMediaAfter = configuration.noMediaAfter
        let task = Task { [clock] in
            var monitor = QualityMonitor()
            var controller = BitrateController(configuration: bitrateConfiguration)
            var mediaFlows = false
            var arrivals = MediaArrivals(silenceAfter: noMediaAfter)
            while !Task.isCancelled {
                guard let sample = try? await peer.statistics() else { return }
                if let receiving = arrivals.add(sample) { await self.receiving(receiving, for: call) }
                if let report = monitor.add(sample) {
                    // No MOS without received packets; the encoder still learns what the far side lost.
                    if report.receivedPackets > 0 { self.record(report, for: call) }
                    // The controller starts with the media: under loss the DTLS handshake can hold
                    // it back for seconds, and no receiver report comes before it flows.
                    mediaFlows = mediaFlows || report.bitrateKbps > 0
                    if mediaFlows, let setting = controller.update(report, now: sample.at) {
                        await peer.setAudioEncoding(setting)
                        await self.emit(.bitrate(call.uuid, setting))
                    }
                }
                do { try await clock.sleep(for: interval) } catch { return }
            }
        }
        calls[call]?.media.append(task)
    }

    private func receiving(_ receiving: Bool, for call: CallID) async {
        eventSink.yield(.receivingMedia(call.uuid, receiving))
        guard !receiving else { return }
        calls[call]?.quality = nil
        await calls[call]?.negotiator?.mediaStopped()
    }

    private func record(_ report: QualityReport, for call: CallID) {
        calls[call]?.quality = report
        eventSink.yield(.quality(call.uuid, report))
    }

    private func emit(_ event: CallEvent) { eventSink.yield(event) }

    private func closePeerConnection(for call: CallID) async {
        // The recorder stops (and its file is closed) before the media it records goes.
        await performRecording(call) { $0.callEnded() }
        guard var live = calls[call] else { return }
        await live.negotiator?.close()
        await live.peer?.close()
        live.peer = nil
        live.negotiator = nil
        for task in live.media { task.cancel() }
        live.media = []
        calls[call] = live
    }
}

extension CallID {
    /// The call id of a system call UUID.
    public init(uuid: UUID) { self.init(rawValue: uuid.uuidString)! }
    public var uuid: UUID { UUID(uuidString: rawValue)! }
}
