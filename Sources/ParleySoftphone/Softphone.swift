import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyNIOTransport
import ParleyProtocol

/// Why the softphone could not start or place a call, in words for the person at the keyboard.
public struct SoftphoneError: Error, CustomStringConvertible {
    public var description: String
    /// The server could not be reached at all (refused, no such name, no answer), rather than
    /// answering with a refusal.
    public var unreachable: Bool
    /// Set when trying again may help (no answer, a 5xx): what `start()` says before "; trying again
    /// in N s". Nil for what is final at once: refused, no such name, TLS, a 4xx.
    var retry: String?

    public init(_ description: String, unreachable: Bool = false) {
        self.description = description
        self.unreachable = unreachable
    }

    init(_ description: String, unreachable: Bool = false, retry: String?) {
        self.init(description, unreachable: unreachable)
        self.retry = retry
    }
}

public struct SoftphoneOptions: Sendable {
    /// The server's HTTP base URL (`http://127.0.0.1:8080`); signaling uses `/v1/signal` on it.
    public var server: URL
    public var user: UserID
    public var name: String?
    /// An access token; nil asks the server for a development token (development mode only).
    public var token: String?
    /// Calling a LAN listener (`server` is its address): tokens come from it, with its PIN if it
    /// asks for one, instead of from a server.
    public var lan: LANAccess?
    public var device: DeviceID
    public var media: MediaEngineConfiguration
    public var statsInterval: Duration = .seconds(1)
    /// Media only through the TURN relays the server hands out.
    public var relayOnly = false
    /// Connect audio calls while they ring (`CallManager.Configuration.connectWhileRinging`).
    public var connectWhileRinging = true
    /// One signaling connection attempt's limit.
    public var connectTimeout: Duration = .seconds(5)
    /// How long `start()` keeps trying to reach the server, fetch a token and connect, with
    /// backoff between tries, before it says what went wrong. Only what may pass is tried again (no
    /// answer, a 5xx such as 503 while the server shuts down); a refused connection, a name that
    /// does not resolve, TLS or a 4xx ends `start()` at once.
    public var startTimeout: Duration = .seconds(20)
    /// A JSON line here for every quality report and encoder change (benchmarks plot them).
    public var qualityLog: URL?

    public init(server: URL, user: UserID, name: String? = nil, token: String? = nil, device: DeviceID? = nil,
                media: MediaEngineConfiguration = MediaEngineConfiguration()) {
        self.server = server
        self.user = user
        self.name = name
        self.token = token
        self.device = device ?? DeviceID(rawValue: "cli-\(UUID().uuidString.prefix(8).lowercased())")!
        self.media = media
    }
}

/// How a caller gets into a LAN listener.
public struct LANAccess: Sendable {
    public var pin: String?
    public init(pin: String? = nil) { self.pin = pin }
}

/// One call's milestones and outcome, for the live status line and the summary.
public struct CallTimeline: Sendable {
    public var call: UUID
    public var remote: UserID
    public var outgoing: Bool
    public var started: ContinuousClock.Instant
    public var ringing: ContinuousClock.Instant?
    /// Incoming: when `Softphone.answer` was called (the tap).
    public var answered: ContinuousClock.Instant?
    public var connected: ContinuousClock.Instant?
    public var iceConnected: ContinuousClock.Instant?
    public var firstAudio: ContinuousClock.Instant?
    public var ended: ContinuousClock.Instant?
    public var endReason: EndReason?
    /// The last quality report; nil while nothing arrives (there is nothing to rate).
    public var quality: QualityReport?
    /// Whether media arrives from the far side (`CallEvent.receivingMedia`).
    public var receivingMedia = true
    public var bitrate: BitrateController.Setting?
    public var recording: URL?
    /// A video call's pictures received so far, and how many differed from the one before (a
    /// frozen picture's do not); nil for a voice call.
    public var video: (frames: Int, changed: Int)?
    /// The ICE candidate pair carrying the media now; nil before ICE connected.
    public var mediaPath: SelectedCandidatePair?
    /// From the invite's acknowledgement: the callee's ringing devices and pushes sent.
    public var devices: Int?
    public var pushed: Int?
    public var muted = false
    public var held = false
    /// Recording with consent: where it stands, every change so far, and the files this side made.
    public var callRecording: RecordingConsent.State = .off
    public var recordingChanges: [RecordingConsent.Change] = []
    public var recordedFiles: [CallRecordingFile] = []

    func since(_ instant: ContinuousClock.Instant?) -> Duration? { instant.map { $0 - started } }
    public var timeToRinging: Duration? { since(ringing) }
    public var timeToConnected: Duration? { since(connected) }
    public var timeToIceConnected: Duration? { since(iceConnected) }
    public var timeToFirstAudio: Duration? { since(firstAudio) }
    /// Connected, and not one sound decoded from the far side: nothing was heard.
    public var heardNothing: Bool { connected != nil && firstAudio == nil }
    public var isEnded: Bool { ended != nil }
}

public enum SoftphoneEvent: Hashable, Sendable {
    /// `address`: where it comes from, on a LAN without a server.
    case incoming(UUID, from: UserID, name: String?, address: String?)
    case phase(UUID, CallStateMachine.Phase)
    case remoteUpdated(UUID, muted: Bool?, held: Bool?)
    /// No device of the callee is online and none could be woken by push.
    case calleeOffline(UUID)
    /// Recording with consent moved (the far side asks, agreed, declined, stopped).
    case recording(UUID, RecordingConsent.State, RecordingConsent.Change)
    /// A recording this softphone made is finished.
    case recorded(UUID, CallRecordingFile)
    /// Media stopped arriving from the far side (`false`, after `CallManager.Configuration.noMediaAfter`
    /// without a packet) or arrives again (`true`).
    case receivingMedia(UUID, Bool)
}

/// A headless softphone: the SDK's call manager with the GStreamer engine, a WebSocket signaling
/// client, and a provider that takes commands instead of CallKit's UI.
public actor Softphone {
    public nonisolated let events: AsyncStream<SoftphoneEvent>
    public nonisolated let engine: GStreamerEngine
    public nonisolated let options: SoftphoneOptions
    private let eventSink: AsyncStream<SoftphoneEvent>.Continuation
    private let provider = HeadlessCallProvider()
    private let audio = EngineAudioSession()
    private let logger: Logger
    private var signaling: SignalingClient<ContinuousClock>?
    private var manager: CallManager<ContinuousClock>?
    /// The call manager and the loops that hear it, the provider and the engine: one task, its
    /// children ended by `stop()`.
    private var running: Task<Void, Never>?
    private var timelines: [UUID: CallTimeline] = [:]
    private var qualityLogHandle: FileHandle?
    /// Each call's peer connections, as made: connecting while ringing, a caller has one for each
    /// callee device that rings, and keeps the answering one's.
    private var peers: [UUID: [GStreamerPeerConnection]] = [:]

    public init(options: SoftphoneOptions, logger: Logger) throws {
        self.options = options
        self.logger = logger
        engine = try GStreamerEngine(configuration: options.media, logger: logger)
        (events, eventSink) = AsyncStream.makeStream()
        if let url = options.qualityLog {
            // Opened now, so a path that cannot be written is said before any call, not lost after.
            do {
                if !FileManager.default.fileExists(atPath: url.path),
                   !FileManager.default.createFile(atPath: url.path, contents: nil) {
                    throw SoftphoneError("cannot create the quality log \(url.path)")
                }
                let handle = try FileHandle(forWritingTo: url)
                try handle.seekToEnd()
                qualityLogHandle = handle
            } catch let error as SoftphoneError {
                throw error
            } catch {
                throw SoftphoneError("cannot write the quality log \(url.path): \(error.localizedDescription)")
            }
        }
    }

    /// Connects to the server; throws with a clear message when it is down or refuses the token.
    /// - Parameter onRetry: told, in a sentence, each time a try failed in a way that may pass and
    ///   another follows ("no answer from the Parley server at …; trying again in 2 s").
    public func start(onRetry: @escaping @Sendable (String) -> Void = { _ in }) async throws {
        do {
            try await connect(onRetry: onRetry)
        } catch {
            await GStreamerEngine.finishWarmUp()
            throw error
        }
    }

    private func connect(onRetry: @escaping @Sendable (String) -> Void) async throws {
        let deadline = ContinuousClock.now + options.startTimeout
        let firstToken = try await makeClient(until: deadline, onRetry: onRetry)
        var told = 0
        while let signaling, await signaling.session == nil {
            // The call manager reads the client's events: its failures are read as they stand.
            if let failure = await signaling.lastConnectFailure, failure.attempt > told {
                told = failure.attempt
                let error = Self.explain(failure.error, at: Self.serverName(options.server, lan: options.lan != nil))
                guard let wait = failure.retryIn else {
                    await stop()
                    throw error
                }
                if let retry = error.retry, ContinuousClock.now + wait < deadline {
                    onRetry("\(retry); trying again in \(Self.words(wait)) s")
                }
            }
            guard ContinuousClock.now < deadline else {
                await stop()
                throw await Self.diagnose(server: options.server, token: firstToken, waited: options.startTimeout)
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// "the Parley server at http://…", or the LAN listener when calling one.
    static func serverName(_ server: URL, lan: Bool) -> String {
        "\(lan ? "the LAN listener" : "the Parley server") at \(server.absoluteString)"
    }

    /// A failed signaling connection in words: final, or with what to say while trying again.
    static func explain(_ error: SignalingConnectError, at server: String) -> SoftphoneError {
        switch (error.code, error.httpStatus) {
        case (.refused, _):
            let hint = server.hasPrefix("the LAN listener") ? "has it left the network?" : "is `parley serve` running?"
            return SoftphoneError("cannot reach \(server): connection refused (\(hint))", unreachable: true, retry: nil)
        case (.nameNotFound, _):
            return SoftphoneError("cannot reach \(server): \(error.message)", unreachable: true, retry: nil)
        case (.tls, _):
            return SoftphoneError("cannot reach \(server): \(error.message)", retry: nil)
        case (.timeout, _):
            return SoftphoneError("cannot reach \(server): no answer", unreachable: true, retry: "no answer from \(server)")
        case (.upgradeRefused, 401?):
            return SoftphoneError("\(server) did not accept the token (401)", retry: nil)
        case (.upgradeRefused, 503?):
            return SoftphoneError("\(server) is shutting down (503); try again in a moment", retry: "\(server) is shutting down (503)")
        case (.upgradeRefused, let status?) where (400..<500).contains(status):
            return SoftphoneError("\(server) refused the signaling connection (HTTP \(status))", retry: nil)
        case (.upgradeRefused, let status?):
            return SoftphoneError("\(server) answered the signaling connection with HTTP \(status)",
                                  retry: "\(server) answered the signaling connection with HTTP \(status)")
        case (.upgradeRefused, nil):
            return SoftphoneError("\(server) did not take the signaling connection", retry: "\(server) did not take the signaling connection")
        case (.other, _):
            return SoftphoneError("cannot connect to \(server): \(error.message)", unreachable: true,
                                  retry: "cannot connect to \(server) (\(error.message))")
        }
    }

    /// A request that got no HTTP answer, classified as the signaling transport classifies its
    /// failures (`SignalingConnectError`): only no answer in time, or a failure it cannot name, is
    /// worth another try.
    static func unanswered(_ error: any Error, at server: String, host: String?) -> SoftphoneError {
        guard let error = error as? URLError else {
            return explain(SignalingConnectError(.other, message: "\(error)"), at: server)
        }
        switch error.code {
        // libcurl reports every failed TCP connect so; on a reachable host that is a refusal.
        case .cannotConnectToHost:
            return explain(SignalingConnectError(.refused, message: "connection refused"), at: server)
        case .cannotFindHost, .dnsLookupFailed:
            return explain(SignalingConnectError(.nameNotFound, message: "the name \(host ?? "") does not resolve"), at: server)
        case .secureConnectionFailed, .serverCertificateUntrusted, .serverCertificateHasBadDate, .serverCertificateHasUnknownRoot,
             .serverCertificateNotYetValid:
            return explain(SignalingConnectError(.tls, message: "the TLS handshake failed (\(error.localizedDescription))"), at: server)
        case .timedOut:
            return explain(SignalingConnectError(.timeout, message: "no answer"), at: server)
        default:
            return explain(SignalingConnectError(.other, message: error.localizedDescription), at: server)
        }
    }

    /// A wait in seconds as said, to the tenth above: "0.3" for 250 ms, "2".
    static func words(_ duration: Duration) -> String {
        let seconds = (duration.seconds * 10).rounded(.up) / 10
        return seconds.rounded() == seconds ? "\(Int(seconds))" : String(format: "%.1f", seconds)
    }

    /// Why the signaling connection did not come up, asked of the server in plain HTTP: the
    /// signaling path answers a request that is not an upgrade as it would have refused one.
    static func diagnose(server: URL, token: String, waited: Duration) async -> SoftphoneError {
        var request = URLRequest(url: server.appendingPathComponent("v1/signal"))
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        request.timeoutInterval = 3
        let seconds = Int(waited.seconds)
        guard let (data, response) = try? await URLSession.shared.dataCancellably(for: request), let http = response as? HTTPURLResponse else {
            return SoftphoneError("cannot reach the Parley server at \(server.absoluteString): no signaling connection in \(seconds) s")
        }
        let message = (try? JSONDecoder().decode(ErrorBody.self, from: data))?.error.message
        switch http.statusCode {
        case 401: return SoftphoneError("the server at \(server.absoluteString) did not accept the token (401\(message.map { ": \($0)" } ?? ""))")
        case 503: return SoftphoneError("the server at \(server.absoluteString) is shutting down (503); try again in a moment")
        default:
            return SoftphoneError("the server at \(server.absoluteString) answers, but no signaling connection came up in \(seconds) s (HTTP \(http.statusCode) without an upgrade)")
        }
    }

    struct ErrorBody: Decodable {
        struct Detail: Decodable { var message: String }
        var error: Detail
    }

    // MARK: Push

    /// Registers this device for VoIP pushes, as an iPhone app does after sign-in with PushKit's
    /// token; a call to its user then wakes it while it has no connection (`handleVoIPPush`).
    /// - Parameter alerts: the app's notification token, for alerts such as a missed call.
    public func registerForVoIPPushes(_ registration: VoIPRegistration, alerts: VoIPRegistration? = nil) async throws {
        try await Self.registerForVoIPPushes(registration, alerts: alerts, options: options)
    }

    /// The same, without a softphone (and its media engine): what `parley listen --register-voip` does.
    public static func registerForVoIPPushes(_ registration: VoIPRegistration, alerts: VoIPRegistration? = nil,
                                             options: SoftphoneOptions) async throws {
        var token = options.token ?? ""
        if token.isEmpty { token = try await Self.developmentToken(server: options.server, user: options.user, name: options.name) }
        var request = URLRequest(url: options.server.appendingPathComponent("v1/devices/\(options.device)"))
        request.httpMethod = "PUT"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        request.httpBody = try JSONEncoder().encode(DeviceRegistration(platform: .linux, voip: registration, alerts: alerts))
        request.timeoutInterval = 5
        let (_, response) = try await URLSession.shared.dataCancellably(for: request)
        guard let http = response as? HTTPURLResponse, http.statusCode == 200 else {
            throw SoftphoneError("the server refused the device registration (status \((response as? HTTPURLResponse)?.statusCode ?? 0))")
        }
    }

    /// A VoIP push woke this device (PushKit's `didReceiveIncomingPush` on an iPhone): the SDK
    /// reports the call at once, then connects, asks the server whether the call still rings, and
    /// the call is answered like any other (`events` says `.incoming`).
    public func handleVoIPPush(_ payload: Data) async throws {
        if manager == nil { _ = try await makeClient(until: .now + options.startTimeout, failFast: false, onRetry: { _ in }) }
        await manager?.handleVoIPPush(payload) {}
    }

    /// The signaling client and the call manager, connecting in the background; answers the token
    /// of the first connection.
    /// - Parameter failFast: whether the client's first connection gives up on what will not pass
    ///   (`start()` waits and says so); a device woken by a push keeps trying, as before.
    private func makeClient(until deadline: ContinuousClock.Instant, failFast: Bool = true,
                            onRetry: @Sendable (String) -> Void) async throws -> String {
        let server = options.server
        try await Self.retrying(until: deadline, onRetry: onRetry) { try await Self.checkReachable(server) }
        let fixedToken = options.token
        let user = options.user, name = options.name, lan = options.lan
        // A LAN listener's token is kept for reconnects: asking again spends a PIN try each time,
        // and the listener refuses a second token for a user id that is still connected.
        let lanTokens = LANTokenCache()
        let fresh: @Sendable () async throws -> String = {
            if let lan {
                if let token = lanTokens.valid() { return token }
                let token = try await Self.lanToken(listener: server, user: user, name: name, pin: lan.pin)
                lanTokens.keep(token, for: .seconds(11 * 3600))
                return token
            }
            return try await Self.developmentToken(server: server, user: user, name: name)
        }
        let firstToken: String
        if let fixedToken {
            firstToken = fixedToken
        } else {
            firstToken = try await Self.retrying(until: deadline, onRetry: onRetry) { try await fresh() }
        }
        var configuration = SignalingClient<ContinuousClock>.Configuration(url: Self.signalURL(server), device: options.device,
                                                                          client: ClientInfo(name: "parley-cli", version: "0.1.0"))
        configuration.connectTimeout = options.connectTimeout
        configuration.backoff = .init(initial: .milliseconds(200), maximum: .seconds(5))
        // Someone waits on `start()`: a refused first connection is said at once.
        configuration.firstConnectFailsFast = failFast
        let tokens = TokenSource(first: firstToken)
        let signaling = SignalingClient(configuration: configuration, transport: WebSocketSignalingTransport(), clock: ContinuousClock(),
                                        logger: logger) {
            if let token = tokens.takeFirst() { return token }
            if let fixedToken { return fixedToken }
            return try await fresh()
        }
        var managerConfiguration = CallManager<ContinuousClock>.Configuration()
        managerConfiguration.statsInterval = options.statsInterval
        managerConfiguration.relayOnly = options.relayOnly
        managerConfiguration.connectWhileRinging = options.connectWhileRinging
        let manager = CallManager(signaling: signaling, provider: provider, audio: audio, peers: engine, clock: ContinuousClock(),
                                  logger: logger, configuration: managerConfiguration)
        self.signaling = signaling
        self.manager = manager
        running = Task {
            await withDiscardingTaskGroup { group in
                group.addTask { await manager.run() }
                group.addTask { for await event in manager.events { await self.handle(event) } }
                group.addTask { for await notice in self.provider.notices { await self.handle(notice) } }
                group.addTask { for await peer in self.engine.peerConnections { await self.adopt(peer) } }
            }
        }
        return firstToken
    }

    /// Tries `attempt` until it succeeds, fails for good, or `deadline` passes, with backoff
    /// (0.25 s doubling to 2 s): only what may pass (`SoftphoneError.retry`) is tried again, and
    /// `onRetry` is told each time.
    static func retrying<T>(until deadline: ContinuousClock.Instant, onRetry: @Sendable (String) -> Void,
                            _ attempt: () async throws -> T) async throws -> T {
        var delay = Duration.milliseconds(250)
        while true {
            do {
                return try await attempt()
            } catch let error as SoftphoneError where error.retry != nil && ContinuousClock.now + delay < deadline {
                onRetry("\(error.retry!); trying again in \(words(delay)) s")
                try await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(2))
            }
        }
    }

    public func stop() async {
        // Calls still up are hung up, so the far side hears of it now rather than at a timeout.
        for (call, timeline) in timelines where !timeline.isEnded { provider.end(call) }
        let deadline = ContinuousClock.now + .seconds(2)
        while timelines.values.contains(where: { !$0.isEnded }), ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
        await signaling?.stop()
        running?.cancel()
        await running?.value
        running = nil
        for peer in peers.values.joined() { await peer.close() }
        try? qualityLogHandle?.close()
        qualityLogHandle = nil
        eventSink.finish()
        await GStreamerEngine.finishWarmUp()
    }

    /// The signaling client, for tests that cut the connection.
    public var signalingClient: SignalingClient<ContinuousClock>? { signaling }

    // MARK: Commands

    public func call(_ user: UserID, video: Bool = false) -> UUID {
        let call = UUID()
        timelines[call] = CallTimeline(call: call, remote: user, outgoing: true, started: .now)
        provider.startCall(call, to: user, video: video)
        return call
    }

    public func answer(_ call: UUID) {
        if timelines[call]?.answered == nil { timelines[call]?.answered = .now }
        provider.answer(call)
    }
    public func hangUp(_ call: UUID) { provider.end(call) }

    public func setMuted(_ call: UUID, _ muted: Bool) {
        timelines[call]?.muted = muted
        provider.setMuted(call, muted)
    }

    public func setHeld(_ call: UUID, _ held: Bool) {
        timelines[call]?.held = held
        provider.setHeld(call, held)
    }

    /// Asks the far side to let this softphone record the call to an Ogg/Opus file at `path`.
    public func requestRecording(_ call: UUID, to path: String, layout: RecordingLayout = .mixed) async throws {
        guard let manager else { throw SoftphoneError("not started") }
        try await manager.requestRecording(call, to: path, layout: layout)
    }

    /// Answers the far side's request to record the call.
    public func answerRecording(_ call: UUID, consent: Bool) async throws {
        guard let manager else { throw SoftphoneError("not started") }
        try await manager.answerRecording(call, consent: consent)
    }

    /// Stops recording the call (either side may), or withdraws a request.
    public func stopRecording(_ call: UUID) async throws {
        guard let manager else { throw SoftphoneError("not started") }
        try await manager.stopRecording(call)
    }

    /// Restarts ICE on every call, as after a network change, and reconnects signaling.
    public func networkChanged() async { await manager?.networkChanged() }

    public func timeline(of call: UUID) -> CallTimeline? {
        guard var timeline = timelines[call] else { return nil }
        if let peer = peer(of: call) {
            timeline.firstAudio = peer.remoteAudioStartedAt
            timeline.iceConnected = peer.iceConnectedAt
            timeline.recording = peer.recording
            if peer.video { timeline.video = (peer.receivedVideoFrames, peer.receivedVideoChanges) }
            timeline.mediaPath = peer.selectedCandidatePair
        }
        return timeline
    }

    public func peerConnection(of call: UUID) -> GStreamerPeerConnection? { peer(of: call) }

    /// The call's peer connection: the last made whose media is not held (the others are paths
    /// made while ringing to devices that did not answer), else the last.
    private func peer(of call: UUID) -> GStreamerPeerConnection? {
        guard let made = peers[call] else { return nil }
        return made.last { !$0.holdsMedia } ?? made.last
    }

    // MARK: Events

    private func handle(_ event: CallEvent) {
        switch event {
        case .phase(let call, let phase):
            let now = ContinuousClock.now
            switch phase {
            case .ringing: if timelines[call]?.ringing == nil { timelines[call]?.ringing = now }
            case .connected: if timelines[call]?.connected == nil { timelines[call]?.connected = now }
            case .ended(let reason):
                timelines[call]?.ended = now
                timelines[call]?.endReason = reason
                logTimeline(call)
            default: break
            }
            eventSink.yield(.phase(call, phase))
        case .quality(let call, let report):
            timelines[call]?.quality = report
            logQuality(call, #""mos":\#(report.mos),"listeningMos":\#(report.listeningMos),"rttMs":\#(report.rttMs),"jitterMs":\#(report.jitterMs),"lossPct":\#(report.lossPct),"remoteLossPct":\#(report.remoteLossPct.map { String($0) } ?? "null"),"receivedKbps":\#(report.bitrateKbps),"burstRatio":\#(report.burstRatio),"codecKbps":\#(report.codecKbps),"receiveLatencyMs":\#(peer(of: call).map { String($0.receiveLatencyMs) } ?? "null")"#)
        case .bitrate(let call, let setting):
            timelines[call]?.bitrate = setting
            logQuality(call, #""bitrateKbps":\#(setting.bitrateKbps),"fec":\#(setting.fec),"expectedLossPct":\#(setting.expectedLossPct),"frameMs":\#(setting.frameMs)"#)
        case .remoteUpdated(let call, let muted, let held):
            eventSink.yield(.remoteUpdated(call, muted: muted, held: held))
        case .invited(let call, let devices, let pushed):
            timelines[call]?.devices = devices
            timelines[call]?.pushed = pushed
            if timelines[call]?.ringing == nil, devices > 0 { timelines[call]?.ringing = .now }
            if devices == 0, pushed == 0 {
                eventSink.yield(.calleeOffline(call))
            }
        case .recording(let call, let state, let change):
            timelines[call]?.callRecording = state
            timelines[call]?.recordingChanges.append(change)
            eventSink.yield(.recording(call, state, change))
        case .recorded(let call, let file):
            timelines[call]?.recordedFiles.append(file)
            eventSink.yield(.recorded(call, file))
        case .receivingMedia(let call, let receiving):
            timelines[call]?.receivingMedia = receiving
            if !receiving { timelines[call]?.quality = nil }
            eventSink.yield(.receivingMedia(call, receiving))
        case .incoming, .route, .pausedByInterruption:
            break  // incoming calls are announced by the provider (`HeadlessCallProvider.Notice`)
        }
    }

    /// The call's moments in Unix milliseconds, once it ended (`timeline`; null where it never came),
    /// so that a benchmark can set them beside another process's on the same clock.
    private func logTimeline(_ call: UUID) {
        guard options.qualityLog != nil, let timeline = timeline(of: call) else { return }
        let (wall, now) = (Date().timeIntervalSince1970, ContinuousClock.now)
        func unixMs(_ instant: ContinuousClock.Instant?) -> String {
            instant.map { String(format: "%.1f", (wall - (now - $0).seconds) * 1000) } ?? "null"
        }
        let moments = [("started", timeline.started), ("ringing", timeline.ringing), ("answered", timeline.answered),
                       ("iceConnected", timeline.iceConnected), ("connected", timeline.connected),
                       ("firstAudio", timeline.firstAudio), ("ended", timeline.ended)]
        logQuality(call, #""outgoing":\#(timeline.outgoing),"timeline":{"# + moments.map { #""\#($0.0)":\#(unixMs($0.1))"# }.joined(separator: ",") + "}")
    }

    /// Appends `fields` (JSON members) with the call and the seconds since it connected.
    private func logQuality(_ call: UUID, _ fields: String) {
        guard let url = options.qualityLog else { return }
        let connected = timelines[call]?.connected
        let seconds = connected.map { (ContinuousClock.now - $0).seconds } ?? 0
        let line = #"{"call":"\#(call.uuidString.lowercased())","t":\#((seconds * 1000).rounded() / 1000),\#(fields)}"# + "\n"
        do {
            try qualityLogHandle?.write(contentsOf: Data(line.utf8))
        } catch {
            // A full disk mid-call must not end the call: said once, and the log stops.
            logger.warning("the quality log stopped", metadata: ["file": "\(url.path)", "error": "\(error)"])
            qualityLogHandle = nil
        }
    }

    private func handle(_ notice: HeadlessCallProvider.Notice) {
        switch notice {
        case .incoming(let report):
            timelines[report.call] = CallTimeline(call: report.call, remote: report.caller, outgoing: false, started: .now, ringing: .now)
            eventSink.yield(.incoming(report.call, from: report.caller, name: report.callerName, address: report.callerAddress))
        case .ended:
            break
        }
    }

    /// A peer connection belongs to the call it was made for (or, from an engine told no call, to
    /// the call that is connecting without one).
    private func adopt(_ peer: GStreamerPeerConnection) {
        let waiting = timelines.values.filter { !$0.isEnded && peers[$0.call] == nil }.sorted { $0.started < $1.started }
        guard let call = peer.call?.uuid ?? waiting.first?.call else { return }
        peers[call, default: []].append(peer)
    }

    // MARK: Server

    static func signalURL(_ server: URL) -> URL {
        var components = URLComponents(url: server, resolvingAgainstBaseURL: false)!
        components.scheme = server.scheme == "https" ? "wss" : "ws"
        components.path = "/v1/signal"
        return components.url!
    }

    /// Asks `/healthz`, so that a server that is down is said before a token is asked for.
    static func checkReachable(_ server: URL) async throws {
        var request = URLRequest(url: server.appendingPathComponent("healthz"))
        request.timeoutInterval = 3
        let response: URLResponse
        do {
            (_, response) = try await URLSession.shared.dataCancellably(for: request)
        } catch {
            throw unanswered(error, at: serverName(server, lan: false), host: server.host)
        }
        if let http = response as? HTTPURLResponse, http.statusCode >= 500 {
            throw notReady(server, status: http.statusCode)
        }
    }

    /// A 5xx: 503 while the server shuts down, worth another try either way.
    static func notReady(_ server: URL, status: Int) -> SoftphoneError {
        let state = "\(serverName(server, lan: false)) \(status == 503 ? "is shutting down (503)" : "is not ready (HTTP \(status))")"
        return SoftphoneError("\(state); try again in a moment", retry: state)
    }

    /// A development token from the server (only a server in development mode gives them).
    public static func developmentToken(server: URL, user: UserID, name: String?) async throws -> String {
        var request = URLRequest(url: server.appendingPathComponent("v1/dev/tokens"))
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = try JSONEncoder().encode(DevTokenRequest(user: user, name: name))
        request.timeoutInterval = 5
        let data: Data, response: URLResponse
        do {
            (data, response) = try await URLSession.shared.dataCancellably(for: request)
        } catch {
            throw unanswered(error, at: serverName(server, lan: false), host: server.host)
        }
        if let http = response as? HTTPURLResponse, http.statusCode >= 500 { throw notReady(server, status: http.statusCode) }
        guard let http = response as? HTTPURLResponse, http.statusCode == 200 else {
            throw SoftphoneError("the server gives development tokens only in development mode: pass --token (mint one with `parley token`)")
        }
        return try JSONDecoder().decode(DevTokenResponse.self, from: data).token
    }
}

extension Softphone {
    /// A token from a LAN listener (`parley listen --lan`), given its PIN when it asks for one.
    public static func lanToken(listener: URL, user: UserID, name: String?, pin: String?) async throws -> String {
        var request = URLRequest(url: listener.appendingPathComponent("v1/lan/tokens"))
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = try JSONEncoder().encode(LANTokenRequest(user: user, name: name, pin: pin))
        request.timeoutInterval = 5
        let data: Data, response: URLResponse
        do {
            (data, response) = try await URLSession.shared.dataCancellably(for: request)
        } catch {
            throw unanswered(error, at: serverName(listener, lan: true), host: listener.host)
        }
        guard let http = response as? HTTPURLResponse else { throw SoftphoneError("no HTTP answer from \(listener.absoluteString)") }
        guard http.statusCode == 200 else {
            let message = (try? JSONDecoder().decode(ErrorBody.self, from: data))?.error.message ?? "HTTP \(http.statusCode)"
            throw SoftphoneError("the LAN listener at \(listener.absoluteString) refused: \(message)")
        }
        return try JSONDecoder().decode(DevTokenResponse.self, from: data).token
    }
}

/// A LAN listener's token, until shortly before it expires.
private final class LANTokenCache: @unchecked Sendable {
    private let lock = NSLock()
    private var token: (value: String, until: ContinuousClock.Instant)?
    func valid() -> String? { lock.withLock { token.flatMap { ContinuousClock.now < $0.until ? $0.value : nil } } }
    func keep(_ value: String, for lifetime: Duration) { lock.withLock { token = (value, .now + lifetime) } }
}

/// Hands out the token fetched at start once, then defers to fresh ones.
private final class TokenSource: @unchecked Sendable {
    private let lock = NSLock()
    private var first: String?
    init(first: String) { self.first = first }
    func takeFirst() -> String? { lock.withLock { defer { first = nil }; return first } }
}
