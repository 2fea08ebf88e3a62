import Foundation
import Logging
import ParleyProtocol

/// One call: its `CallStateMachine` and `RecordingConsent`, its peer connection and `Negotiator`,
/// its outbox of requests, and every task these need, each a child of `run()`. The call's
/// requests leave in the order its machines asked for them; the answers, the negotiator, the
/// quality loop and the recording steps run beside them. Once the call has ended and been kept
/// `Configuration.endedCallRetention` (so that late events and `phase(of:)` still find it),
/// `run()` cancels what is left and returns: nothing of the call outlives it.
///
/// `CallManager` makes one for each call and runs it as a child of its own `run()`; it routes each
/// call's signaling messages and system actions here and keeps what spans calls (the audio route,
/// VoIP pushes). A controller can also be run and tested on its own.
public actor CallController<C: Clock> where C.Duration == Duration {
    /// What a call uses that is not its own: shared by every call of a manager.
    public struct Environment: Sendable {
        public var signaling: SignalingClient<C>
        public var provider: any SystemCallProvider
        public var audio: any AudioSession
        public var peers: any PeerConnectionFactory
        public var clock: C
        public var logger: Logger
        public var configuration: CallManager<C>.Configuration
        public var events: AsyncStream<CallEvent>.Continuation
        /// The ICE servers of the signaling session now (they come with each `welcome`).
        public var iceServers: @Sendable () async -> [IceServer]

        public init(signaling: SignalingClient<C>, provider: any SystemCallProvider, audio: any AudioSession,
                    peers: any PeerConnectionFactory, clock: C, logger: Logger, configuration: CallManager<C>.Configuration,
                    events: AsyncStream<CallEvent>.Continuation, iceServers: @escaping @Sendable () async -> [IceServer]) {
            self.signaling = signaling
            self.provider = provider
            self.audio = audio
            self.peers = peers
            self.clock = clock
            self.logger = logger
            self.configuration = configuration
            self.events = events
            self.iceServers = iceServers
        }
    }

    /// A request of the call, waiting in its outbox.
    private struct Outgoing: Sendable {
        var make: @Sendable (String) -> ClientMessage
        /// What the answer means to the call (nil: nothing).
        var onSuccess: (@Sendable (inout CallStateMachine, Ack) -> [CallStateMachine.Action])?
        var onFailure: (@Sendable (inout CallStateMachine, SignalingError) -> [CallStateMachine.Action])?
    }

    private typealias Job = @Sendable () async -> Void

    public nonisolated let id: CallID
    /// The call's id as CallKit knows it.
    public nonisolated let uuid: UUID
    private let environment: Environment
    private nonisolated let logger: Logger
    private nonisolated let events: AsyncStream<CallEvent>.Continuation
    public private(set) var machine: CallStateMachine
    /// The phase last announced (`CallEvent.phase`).
    private var announcedPhase: CallStateMachine.Phase
    public private(set) var recording = RecordingConsent()
    /// Where this device records once the far side agrees.
    private var recordingFile: (path: String, layout: RecordingLayout)?
    private var peer: (any PeerConnection)?
    private var negotiator: Negotiator?
    /// Outgoing, connecting while ringing: a path to each callee device that rings early, media held.
    private var earlyPaths: [DeviceID: EarlyPath] = [:]
    /// The callee device whose early path became the call's.
    private var answeredDevice: DeviceID?

    private struct EarlyPath {
        var peer: any PeerConnection
        var negotiator: Negotiator
        /// What negotiation last reported while the call rang.
        var outcome: Negotiator.Outcome?
    }
    /// Signals that came before the peer connection.
    private var pendingSignals: [SignalPayload] = []
    /// The last quality report; nil while nothing arrives.
    private var quality: QualityReport?
    /// Which peer connection the quality loop runs for (a new one for each; none once closed).
    private var qualityLoopFor: Int?
    private var peerGeneration = 0
    /// Work for `run()`: each job becomes a child task of the call.
    private let jobs: AsyncStream<Job>
    private let jobSink: AsyncStream<Job>.Continuation
    /// The call's requests, handed to the signaling client one after another (not waiting for answers).
    private let outbox: AsyncStream<Outgoing>
    private let outboxSink: AsyncStream<Outgoing>.Continuation

    public init(_ machine: CallStateMachine, environment: Environment) {
        id = machine.id
        uuid = machine.uuid
        logger = environment.logger
        events = environment.events
        self.machine = machine
        announcedPhase = machine.phase
        self.environment = environment
        (jobs, jobSink) = AsyncStream.makeStream()
        (outbox, outboxSink) = AsyncStream.makeStream()
    }

    /// Runs the call's tasks until it is over (ended and kept for `endedCallRetention`), or until
    /// cancelled; then cancels every one left.
    public func run() async {
        await withDiscardingTaskGroup { group in
            group.addTask { await self.drainOutbox() }
            for await job in jobs { group.addTask(operation: job) }
            group.cancelAll()
        }
        outboxSink.finish()
    }

    public var phase: CallStateMachine.Phase { machine.phase }
    public var isInProgress: Bool { machine.isInProgress }
    public var video: Bool { machine.media.video }
    public var canRecordCalls: Bool { peer?.canRecordCalls ?? true }

    // MARK: Events

    /// Feeds the call's state machine an event and performs what it answers. A new phase is
    /// announced; an ended call stops its recording and is let go after its retention.
    public func perform(_ event: @Sendable (inout CallStateMachine) -> [CallStateMachine.Action]) async {
        let before = announcedPhase
        let actions = event(&machine)
        await execute(actions)
        // (An action may have performed an event of its own, which announced the phase already.)
        let phase = machine.phase
        guard phase != announcedPhase else { return }
        announcedPhase = phase
        if phase == .connected { startQualityLoop() }
        if phase.isEnded { await performRecording { $0.callEnded() } }
        events.yield(.phase(uuid, phase))
        if phase.isEnded, !before.isEnded { letGoLater() }
    }

    /// Performs actions a state machine gave when the call was made (`CallStateMachine.incoming`, `.outgoing`).
    public func start(_ actions: [CallStateMachine.Action]) async {
        await execute(actions)
    }

    /// A description, candidate or restart request from the other party (`device`: the far device
    /// that sent it; a callee device's goes to its early path while the call rings).
    public func received(_ signal: SignalPayload, from device: DeviceID? = nil) async {
        if let device, let path = earlyPaths[device] {
            await path.negotiator.receive(signal)
        } else if let negotiator {
            await negotiator.receive(signal)
        } else {
            pendingSignals.append(signal)
        }
    }

    /// The network changed: ICE restarts (or, on the callee, is asked for).
    public func networkChanged() async {
        guard !machine.phase.isEnded else { return }
        for path in earlyPaths.values { await path.negotiator.restartIce() }
        await negotiator?.restartIce()
    }

    /// A VoIP push said the call rings: the server says whether it still does (a push may come late).
    public func checkPushedCall() {
        startChild { await self.askServerWhetherPushedCallRings() }
    }

    /// Signaling has a new session (after a server restart, or a resume the server could not
    /// serve): asks the server about the call (protocol v1, "Restarts and several nodes"). `ended`
    /// ends it with the server's reason; `call_not_found` means the server lost it, which then
    /// cannot be signalled any more: it ends with `server-lost-call`. No answer leaves it alone.
    public func recoverAfterNewSession() async {
        guard !machine.phase.isEnded else { return }
        let call = id
        let pending = await environment.signaling.submit { .callState(CallRequest(id: $0, call: call)) }
        do throws(SignalingError) {
            let ack = try await pending.answer()
            guard let state = try? ack.decodeResult(CallStateResult.self) else { return }
            if state.state == .ended {
                await perform { $0.remoteEnded(state.reason ?? .connectionLost) }
            } else if let recording = state.recording {
                // A restarted server keeps a recording that is on, not a request nobody answered.
                await performRecording { $0.server(recording) }
            }
        } catch where error.serverCode == .callNotFound {
            logger.notice("the server lost a call; ending it", metadata: ["call.id": "\(id)"])
            await perform { $0.remoteEnded(.serverLostCall) }
        } catch {
            // No answer in time, or the connection dropped again: the next new session asks again.
        }
    }

    /// The far side muted, held or took a recording step.
    public func remoteUpdated(_ update: CallUpdated) async {
        if let step = update.recording {
            await performRecording { $0.remote(step) }
        } else {
            events.yield(.remoteUpdated(uuid, muted: update.muted, held: update.held))
        }
    }

    // MARK: Recording with consent

    /// A step the user took: refused (thrown) when it does not fit; `file` is where this device
    /// records if the step leads to recording.
    public func performRecording(needsConnection: Bool, keeping file: (path: String, layout: RecordingLayout)? = nil,
                                 _ event: @Sendable (inout RecordingConsent) throws(RecordingConsent.Refusal) -> [RecordingConsent.Action]) async throws(RecordingConsent.Refusal) {
        if needsConnection {
            switch machine.phase {
            case .connecting, .connected: break
            default: throw .notConnected
            }
        }
        let actions = try event(&recording)
        if let file { recordingFile = file }
        await execute(actions)
    }

    /// A step from the far side, the server or the call's own course.
    private func performRecording(_ event: (inout RecordingConsent) -> [RecordingConsent.Action]) async {
        await execute(event(&recording))
    }

    private func execute(_ actions: [RecordingConsent.Action]) async {
        for action in actions {
            switch action {
            case .send(let step):
                let call = id
                let pending = await environment.signaling.submit { .callUpdate(CallUpdate(id: $0, call: call, recording: step)) }
                startChild {
                    do throws(SignalingError) {
                        _ = try await pending.answer()
                    } catch where error.code == .rejected {
                        // Only the server's refusal undoes the step: after a timeout it may well
                        // have taken it (the far side then records, and this side can still stop it).
                        await self.performRecording { $0.refused(step, message: error.description) }
                    } catch {
                        self.logger.warning("a recording step went unanswered", metadata: ["call.id": "\(self.id)", "error": "\(error)"])
                    }
                }
            case .startRecorder:
                do {
                    guard let peer, let file = recordingFile else { throw CallRecordingUnsupported() }
                    try await peer.startCallRecording(to: file.path, layout: file.layout)
                    // Other events came while the recorder started: a stop (or the call's end) that
                    // came meanwhile found nothing to stop, so it is stopped now.
                    if recording.state != .on(here: true), let file = await peer.stopCallRecording() {
                        events.yield(.recorded(uuid, file))
                    }
                } catch {
                    logger.error("could not start recording the call", metadata: ["call.id": "\(id)", "error": "\(error)"])
                    await performRecording { $0.recorderFailed("\(error)") }
                }
            case .stopRecorder:
                if let file = await peer?.stopCallRecording() { events.yield(.recorded(uuid, file)) }
            case .notify(let state, let change):
                events.yield(.recording(uuid, state, change))
            }
        }
    }

    // MARK: The state machine's actions

    private func execute(_ actions: [CallStateMachine.Action]) async {
        let call = id
        for action in actions {
            switch action {
            case .sendInvite:
                let (remote, media) = (machine.remote, machine.media)
                send({ .callInvite(CallInvite(id: $0, call: call, to: remote, media: media)) },
                     onSuccess: { [events, uuid] machine, ack in
                         if let result = try? ack.decodeResult(CallInviteResult.self) {
                             events.yield(.invited(uuid, devices: result.devices, pushed: result.pushed))
                         }
                         return machine.inviteAcknowledged()
                     },
                     onFailure: { machine, _ in machine.inviteFailed() })
            case .sendRinging(let early):
                send { .callRinging(CallRingingRequest(id: $0, call: call, early: early ? true : nil)) }
            case .sendAccept:
                send({ .callAccept(CallRequest(id: $0, call: call)) },
                     onSuccess: { machine, _ in machine.acceptAcknowledged() },
                     onFailure: { machine, error in machine.acceptFailed(error.serverCode) })
            case .sendDecline(let reason):
                send { .callDecline(CallDecline(id: $0, call: call, reason: reason)) }
            case .sendHangup(let reason):
                if let quality = quality?.callQuality {
                    send { .callReport(CallReport(id: $0, call: call, quality: quality)) }
                }
                send { .callHangup(CallHangup(id: $0, call: call, reason: reason)) }
            case .sendUpdate(let muted, let held):
                send { .callUpdate(CallUpdate(id: $0, call: call, muted: muted, held: held)) }
            case .reportIncoming:
                do {
                    try await environment.provider.reportIncomingCall(IncomingCallReport(call: uuid, caller: machine.remote,
                                                                                         callerName: machine.remoteName, video: machine.media.video,
                                                                                         callerAddress: machine.remoteAddress))
                } catch {
                    // The system refused (Do Not Disturb, blocked caller): decline for the user.
                    await perform { $0.remoteEnded(.declined) }
                    send { .callDecline(CallDecline(id: $0, call: call, reason: .busy)) }
                }
            case .reportStartedConnecting:
                await environment.provider.reportOutgoingCallStartedConnecting(uuid)
            case .reportConnected:
                await environment.provider.reportOutgoingCallConnected(uuid)
            case .reportEnded(let reason):
                await environment.provider.reportCallEnded(uuid, reason: reason)
            case .fulfill(let action):
                await environment.provider.fulfill(action)
            case .fail(let action):
                await environment.provider.fail(action)
            case .configureAudio:
                await environment.audio.configure(CallAudioConfiguration(video: machine.media.video))
            case .makePeerConnection(let polite, let early):
                // A child: an engine may take its time (a certificate, a pipeline), and the events
                // that come meanwhile (the call ended, an answer) must not wait for it.
                startChild { await self.makePeerConnection(polite: polite, early: early) }
            case .connectEarly(let device):
                startChild { await self.connectEarly(to: device) }
            case .takeEarlyPath(let device):
                await takeEarlyPath(of: device)
            case .startMedia:
                await peer?.startMedia()
            case .closePeerConnection:
                await closePeerConnection()
            case .setPeerMuted(let muted):
                await peer?.setMicrophoneMuted(muted)
            case .setPeerHeld(let held):
                await peer?.setOnHold(held)
            case .sendDTMF(let tones, let action):
                do {
                    // An engine that cannot send DTMF fails the action at once (CallKit tells the user).
                    guard let peer, peer.canSendDTMF else { throw CancellationError() }
                    try await peer.sendDTMF(tones)
                    await environment.provider.fulfill(action)
                } catch {
                    await environment.provider.fail(action)
                }
            }
        }
    }

    // MARK: Requests

    /// Queues a request behind the ones the call asked for before.
    private func send(_ make: @escaping @Sendable (String) -> ClientMessage,
                      onSuccess: (@Sendable (inout CallStateMachine, Ack) -> [CallStateMachine.Action])? = nil,
                      onFailure: (@Sendable (inout CallStateMachine, SignalingError) -> [CallStateMachine.Action])? = nil) {
        outboxSink.yield(Outgoing(make: make, onSuccess: onSuccess, onFailure: onFailure))
    }

    /// Hands the requests to the signaling client in order; the answers are awaited beside it.
    private func drainOutbox() async {
        for await request in outbox {
            let pending = await environment.signaling.submit(request.make)
            guard request.onSuccess != nil || request.onFailure != nil else { continue }
            startChild {
                do throws(SignalingError) {
                    let ack = try await pending.answer()
                    if let onSuccess = request.onSuccess { await self.perform { onSuccess(&$0, ack) } }
                } catch where error.code == .cancelled {
                    return
                } catch {
                    if let onFailure = request.onFailure { await self.perform { onFailure(&$0, error) } }
                }
            }
        }
    }

    private func askServerWhetherPushedCallRings() async {
        do {
            let call = id
            let state = try await environment.signaling.request { .callState(CallRequest(id: $0, call: call)) }
                .decodeResult(CallStateResult.self)
            if state.state == .ended { await perform { $0.remoteEnded(state.reason ?? .hangup) } }
        } catch let error as SignalingError {
            if error.serverCode == .callNotFound { await perform { $0.remoteEnded(.cancelled) } }
        } catch {
            logger.debug("could not ask for the pushed call's state", metadata: ["error": "\(error)"])
        }
    }

    // MARK: Media

    private func makePeerConnection(polite: Bool, early: Bool) async {
        let settings = environment.configuration
        // Connecting while ringing, the callee may keep its addresses from the caller until the answer.
        let configuration = PeerConnectionConfiguration(iceServers: await environment.iceServers(),
                                                        relayOnly: settings.relayOnly || (early && settings.relayOnlyWhileRinging),
                                                        media: machine.media, holdsMedia: early, call: id)
        let peer: any PeerConnection
        do {
            peer = try await environment.peers.makePeerConnection(configuration)
        } catch {
            logger.error("could not create a peer connection", metadata: ["call.id": "\(id)", "error": "\(error)"])
            await perform { $0.mediaFailed("media-failed") }
            return
        }
        let negotiator = Negotiator(peer: peer, polite: polite, maxIceRestarts: environment.configuration.maxIceRestarts, logger: logger,
            send: { [weak self] signal in await self?.sendSignal(signal) },
            report: { [weak self] outcome in await self?.negotiation(outcome) })
        guard !machine.phase.isEnded else {
            await peer.close()
            return
        }
        self.peer = peer
        self.negotiator = negotiator
        peerGeneration += 1
        let pending = pendingSignals
        pendingSignals = []
        // It ends when the peer connection closes (its events end).
        startChild { await negotiator.run() }
        for signal in pending { await negotiator.receive(signal) }
        await perform { $0.peerConnectionReady() }
    }

    /// A description, candidate or restart request from the negotiator: queued, not awaited, so
    /// candidates leave back to back behind their description. `device`: the callee device of an
    /// early path (the server needs it named while the call rings).
    private func sendSignal(_ signal: SignalPayload, to device: DeviceID? = nil) {
        let call = id
        send { .callSignal(CallSignal(id: $0, call: call, signal: signal, device: device)) }
    }

    // MARK: Connecting while ringing

    /// A path to a callee device that rings early: negotiated, ICE and DTLS connected, media held.
    private func connectEarly(to device: DeviceID) async {
        let configuration = PeerConnectionConfiguration(iceServers: await environment.iceServers(),
                                                        relayOnly: environment.configuration.relayOnly, media: machine.media, holdsMedia: true,
                                                        call: id)
        let peer: any PeerConnection
        do {
            peer = try await environment.peers.makePeerConnection(configuration)
        } catch {
            // The call goes on without it: a new connection is made if this device answers.
            logger.warning("could not connect while ringing", metadata: ["call.id": "\(id)", "device": "\(device)", "error": "\(error)"])
            return
        }
        let negotiator = Negotiator(peer: peer, polite: false, maxIceRestarts: environment.configuration.maxIceRestarts, logger: logger,
            send: { [weak self] signal in await self?.sendSignal(signal, to: device) },
            report: { [weak self] outcome in await self?.earlyNegotiation(outcome, of: device) })
        // The call was answered (by another device, or it ended) while this was being made.
        guard machine.phase == .ringing || machine.phase == .dialing, machine.earlyDevices.contains(device) else {
            await peer.close()
            return
        }
        earlyPaths[device] = EarlyPath(peer: peer, negotiator: negotiator)
        startChild { await negotiator.run() }
    }

    private func earlyNegotiation(_ outcome: Negotiator.Outcome, of device: DeviceID) async {
        if earlyPaths[device] != nil {
            earlyPaths[device]?.outcome = outcome
        } else if device == answeredDevice {
            await negotiation(outcome)
        }
    }

    /// `device` answered: its early path is the call's now and its media starts; the others close.
    private func takeEarlyPath(of device: DeviceID) async {
        let path = earlyPaths.removeValue(forKey: device)
        if let path {
            // Before any suspension: what its negotiation reports from now on is the call's.
            peer = path.peer
            negotiator = path.negotiator
            answeredDevice = device
            peerGeneration += 1
        }
        guard let path else {
            await closeEarlyPaths()
            startChild { await self.makePeerConnection(polite: false, early: false) }
            return
        }
        // A mute or hold set while it rang reaches the path before its media starts; the other
        // paths close after it, beside the call (closing a pipeline takes time the first packet
        // should not wait for).
        await perform { $0.peerConnectionReady() }
        guard !machine.phase.isEnded, peer != nil else { return }
        await path.peer.startMedia()
        let others = earlyPaths.values
        earlyPaths = [:]
        startChild {
            for other in others {
                await other.negotiator.close()
                await other.peer.close()
            }
        }
        if let outcome = path.outcome { await negotiation(outcome) }
    }

    private func closeEarlyPaths() async {
        let paths = earlyPaths.values
        earlyPaths = [:]
        for path in paths {
            await path.negotiator.close()
            await path.peer.close()
        }
    }

    private func negotiation(_ outcome: Negotiator.Outcome) async {
        switch outcome {
        case .connected:
            // (Its quality loop starts once the call is connected: while it rings, nothing flows.)
            await perform { $0.mediaConnected() }
        case .failed(let reason):
            await perform { $0.mediaFailed(reason) }
        }
    }

    /// Quality reports, the encoder's bitrate and whether media arrives, every `statsInterval`,
    /// for as long as this peer connection lasts (one loop per connection: ICE reconnecting does
    /// not start another).
    private func startQualityLoop() {
        guard let peer, qualityLoopFor != peerGeneration else { return }
        let generation = peerGeneration
        qualityLoopFor = generation
        let (interval, bitrate, noMediaAfter, clock) = (environment.configuration.statsInterval, environment.configuration.bitrate,
                                                        environment.configuration.noMediaAfter, environment.clock)
        startChild {
            var monitor = QualityMonitor()
            var controller = BitrateController(configuration: bitrate)
            var mediaFlows = false
            var arrivals = MediaArrivals(silenceAfter: noMediaAfter)
            while await self.qualityLoopFor == generation {
                // A read that fails (or that the engine gave up waiting for) skips one interval; the
                // loop ends with the connection, not with a read.
                guard let sample = try? await peer.statistics() else {
                    do { try await clock.sleep(for: interval) } catch { return }
                    continue
                }
                if let receiving = arrivals.add(sample) { await self.receiving(receiving) }
                if let report = monitor.add(sample) {
                    // No MOS without received packets; the encoder still learns what the far side lost.
                    if report.receivedPackets > 0 { await self.record(report) }
                    // The controller starts with the media: under loss the DTLS handshake can hold
                    // it back for seconds, and no receiver report comes before it flows.
                    mediaFlows = mediaFlows || report.bitrateKbps > 0
                    if mediaFlows, let setting = controller.update(report, now: sample.at) {
                        await peer.setAudioEncoding(setting)
                        self.events.yield(.bitrate(self.uuid, setting))
                    }
                }
                do { try await clock.sleep(for: interval) } catch { return }
            }
        }
    }

    private func receiving(_ receiving: Bool) async {
        events.yield(.receivingMedia(uuid, receiving))
        guard !receiving else { return }
        quality = nil
        await negotiator?.mediaStopped()
    }

    private func record(_ report: QualityReport) {
        quality = report
        events.yield(.quality(uuid, report))
    }

    private func closePeerConnection() async {
        // The recorder stops (and its file is closed) before the media it records goes.
        await performRecording { $0.callEnded() }
        await negotiator?.close()
        await peer?.close()
        peer = nil
        negotiator = nil
        qualityLoopFor = nil
        // Signals that came for no connection belong to none made later.
        pendingSignals = []
        await closeEarlyPaths()
    }

    // MARK: Tasks

    /// Runs `job` as a child task of `run()`.
    private func startChild(_ job: @escaping Job) {
        jobSink.yield(job)
    }

    /// Lets the call go once it has been kept its retention: `run()` returns.
    private func letGoLater() {
        let (retention, clock, jobs, outbox) = (environment.configuration.endedCallRetention, environment.clock, jobSink, outboxSink)
        startChild {
            try? await clock.sleep(for: retention)
            outbox.finish()
            jobs.finish()
        }
    }
}
