// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
import Logging
import ParleyKit
import ParleyProtocol
import ParleyRooms
import WebRTC

/// The composition root of an iPhone app for one signed-in user: the app's `CallSystem` (CallKit
/// and PushKit, made once at launch), the audio session, WebRTC, URLSession signaling and the network
/// monitor, wired to the SDK core. Make one when the user signs in, `signOut()` when they leave; the
/// next user's phone uses the same `CallSystem`:
///
/// ```swift
/// let phone = ParleyPhone(configuration: .init(
///     server: URL(string: "https://parley.example.com")!, device: deviceID,
///     topic: Bundle.main.bundleIdentifier!, pushEnvironment: .production,
///     token: { try await myBackend.parleyToken() }), system: appDelegate.system)
/// phone.start()
/// let call = try await phone.call("bob")
/// ```
public final class ParleyPhone: @unchecked Sendable {
    public struct Configuration: Sendable {
        /// The Parley server's HTTP base URL (signaling is `/v1/signal` on it).
        public var server: URL
        /// A stable id for this installation (keep it in the keychain).
        public var device: DeviceID
        /// The app's bundle id: VoIP pushes come on `<topic>.voip`.
        public var topic: String
        /// `sandbox` in development builds, `production` in TestFlight and App Store builds.
        public var pushEnvironment: VoIPRegistration.Environment
        /// A fresh access token for the signed-in user.
        public var token: @Sendable () async throws -> String
        public var client = ClientInfo(name: "parley-ios", version: "0.1.0")

        public init(server: URL, device: DeviceID, topic: String, pushEnvironment: VoIPRegistration.Environment,
                    token: @escaping @Sendable () async throws -> String) {
            self.server = server
            self.device = device
            self.topic = topic
            self.pushEnvironment = pushEnvironment
            self.token = token
        }
    }

    public let configuration: Configuration
    public let system: CallSystem
    public var callKit: CallKitProvider { system.callKit }
    public let audio: AppleAudioSession
    public let signaling: SignalingClient<ContinuousClock>
    public let calls: CallManager<ContinuousClock>
    private let pushes: VoIPPushCoordinator<ContinuousClock>
    private let network: NetworkPathMonitor
    private let peers: any PeerConnectionFactory
    private let transport: any SignalingTransport
    private let janus: RoomSession.JanusConnector
    private let logger: Logger
    private let lock = NSLock()
    /// The call manager, the push coordinator and the loops that hand them audio and network
    /// changes: one task's children, ended by `stop()`.
    private var running: Task<Void, Never>?

    /// - Parameters:
    ///   - peers: WebRTC unless given (tests give another engine).
    ///   - transport: signaling over URLSession unless given.
    ///   - janus: how voice rooms reach Janus: URLSession unless given.
    public init(configuration: Configuration, system: CallSystem, logger: Logger = Logger(label: "parley"),
                peers: (any PeerConnectionFactory)? = nil, transport: (any SignalingTransport)? = nil,
                janus: RoomSession.JanusConnector? = nil) {
        self.configuration = configuration
        self.system = system
        self.janus = janus ?? { try await URLSessionJanusTransport.connect(to: $0) }
        audio = AppleAudioSession(logger: logger)
        var signalingConfiguration = SignalingClient<ContinuousClock>.Configuration(
            url: Self.signalURL(configuration.server), device: configuration.device, client: configuration.client)
        signalingConfiguration.connectTimeout = .seconds(10)
        let transport = transport ?? URLSessionSignalingTransport()
        self.transport = transport
        signaling = SignalingClient(configuration: signalingConfiguration, transport: transport, clock: ContinuousClock(), logger: logger,
                                    tokens: configuration.token)
        let peers = peers ?? WebRTCPeerConnectionFactory(logger: logger)
        self.peers = peers
        self.logger = logger
        calls = CallManager(signaling: signaling, provider: system.callKit, audio: audio, peers: peers, clock: ContinuousClock(), logger: logger)
        pushes = VoIPPushCoordinator(
            source: system.pushes, calls: calls,
            registrar: HTTPDeviceRegistrar(server: configuration.server, device: configuration.device, token: configuration.token),
            configuration: .init(platform: .ios, topic: configuration.topic, environment: configuration.pushEnvironment),
            clock: ContinuousClock(), logger: logger)
        network = NetworkPathMonitor()
    }

    /// Connects and starts listening: calls, pushes, audio route changes, network changes.
    public func start() {
        let calls = self.calls, pushes = self.pushes, audio = self.audio, network = self.network
        lock.withLock {
            guard running == nil else { return }
            running = Task {
                await withDiscardingTaskGroup { group in
                    group.addTask { await calls.run() }
                    group.addTask { await pushes.run() }
                    group.addTask {
                        for await event in audio.events {
                            switch event {
                            case .route(let change): await calls.audioRouteChanged(change)
                            case .interruption(let interruption): await calls.audioInterrupted(interruption)
                            }
                        }
                    }
                    group.addTask { for await _ in network.changes { await calls.networkChanged() } }
                }
            }
        }
        network.start()
    }

    /// The app's notification token, from `application(_:didRegisterForRemoteNotificationsWithDeviceToken:)`
    /// (after `UNUserNotificationCenter` authorization): the server sends missed-call alerts to it.
    public func registerAlertToken(_ deviceToken: Data) async {
        await pushes.alertToken(deviceToken)
    }

    /// Signing out: the server forgets this device's push tokens, then everything stops.
    public func signOut() async {
        do {
            try await pushes.unregister()
        } catch {
            logger.notice("could not unregister the device's push tokens", metadata: ["error": "\(error)"])
        }
        await stop()
    }

    /// Stops everything. Calls in progress are ended by the server when the session lapses; the
    /// app's `CallSystem` goes on reporting VoIP pushes (and ending their calls) until the next phone.
    public func stop() async {
        network.stop()
        let running = lock.withLock { () -> Task<Void, Never>? in defer { self.running = nil }; return self.running }
        running?.cancel()
        await running?.value
        await signaling.stop()
        (transport as? URLSessionSignalingTransport)?.invalidate()
    }

    // MARK: What the app's UI does

    /// Calls `user` through CallKit; answers the call's id (events come on `calls.events`).
    public func call(_ user: UserID, video: Bool = false) async throws -> UUID {
        try await callKit.startCall(to: user, video: video)
    }

    public func answer(_ call: UUID) async throws { try await callKit.answer(call) }
    public func hangUp(_ call: UUID) async throws { try await callKit.end(call) }
    public func setMuted(_ call: UUID, _ muted: Bool) async throws { try await callKit.setMuted(call, muted) }
    public func setHeld(_ call: UUID, _ held: Bool) async throws { try await callKit.setHeld(call, held) }
    /// Answers the far side's request to record the call (the consent rules are the core's,
    /// `RecordingConsent`). This engine cannot record itself: asking to record is the Linux and
    /// browser clients' (`CallRecordingUnsupported`).
    public func answerRecording(_ call: UUID, consent: Bool) async throws { try await calls.answerRecording(call, consent: consent) }
    public func stopRecording(_ call: UUID) async throws { try await calls.stopRecording(call) }

    /// The WebRTC factory, when the phone's media is WebRTC: video calls' tracks come from it.
    public var webRTC: WebRTCPeerConnectionFactory? { peers as? WebRTCPeerConnectionFactory }

    /// Joins an AudioBridge voice room (the server runs with `--janus`). The audio session is
    /// activated for the room, since no CallKit call does it; `leave(_:)` gives it back.
    public func joinRoom(_ room: RoomID, display: String) async throws -> RoomSession {
        // A room takes the audio session itself, which would cut the audio of a CallKit call.
        guard await !calls.hasCallInProgress else { throw RoomError("end the call before joining a voice room") }
        let session = RoomSession(room: room, display: display, signaling: signaling, peers: peers, janus: janus, logger: logger)
        await audio.activateForRoom()
        do {
            try await session.join()
        } catch {
            await audio.deactivateAfterRoom()
            throw error
        }
        return session
    }

    public func leave(_ room: RoomSession) async {
        await room.leave()
        await audio.deactivateAfterRoom()
    }

    /// The speaker button: a temporary override the route policy keeps track of.
    public func setSpeaker(_ on: Bool) async { await calls.audioRouteChanged(.speakerButton(on: on)) }

    static func signalURL(_ server: URL) -> URL {
        var components = URLComponents(url: server, resolvingAgainstBaseURL: false)!
        components.scheme = server.scheme == "https" ? "wss" : "ws"
        components.path = "/v1/signal"
        return components.url!
    }
}
#endif
