import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import ParleyProtocol

/// What the platform's push service reports (PushKit on iOS).
public enum VoIPPushEvent: Sendable {
    /// The device's VoIP push token (new, or changed).
    case token(Data)
    /// The token is no longer valid (the user turned pushes off, the app was restored elsewhere).
    case tokenInvalidated
    /// A VoIP push the source has not reported. `completion` tells the system the push is handled;
    /// on iOS it must run only after the call was reported (`CallManager.handleVoIPPush` sees to that).
    case push(Data, completion: @Sendable () -> Void)
    /// A VoIP push the source reported to the system itself, inside the platform's callback, and
    /// completed: the calls take it from here (`CallManager.pushedCallReported`).
    case reported(VoIPPushReport)
}

/// Where VoIP pushes come from: PushKit on iOS (`PushKitVoIPSource`), nothing on Linux. A source
/// outlives the phones that listen to it (one per signed-in user): each `subscribe()` is a new
/// stream that starts with the token the source holds, and ends when a newer one begins.
public protocol VoIPPushSource: Sendable {
    func subscribe() -> AsyncStream<VoIPPushEvent>
}

/// What a VoIP push asks of the system, decided from its payload alone, so that a source can report
/// it inside the platform's callback, before any phone, actor or network is reached: iOS 13 and
/// later end an app that completes a VoIP push without reporting a call, and a cold launch from a
/// killed state has little time (apple-rules.md, 2).
public struct VoIPPushReport: Hashable, Sendable {
    /// A Parley call, as the push announces it.
    public struct Call: Hashable, Sendable {
        public var id: CallID
        public var from: UserID
        public var name: String?
        public var media: MediaSpec
    }

    /// What the system shows.
    public var report: IncomingCallReport
    /// The call it announces; nil when the payload is not Parley's.
    public var call: Call?
    /// Set when the call is to be ended as soon as it is reported: the payload is not a Parley
    /// call, or no phone is signed in to take it. The system is told before the push completes.
    public var endAtOnce: SystemEndReason?

    /// - Parameters:
    ///   - payload: the push's JSON (`{"parley": {...}}`, docs/push.md).
    ///   - phoneRunning: whether a signed-in phone will take the call. With none (signed out, a
    ///     stored session that could not be read) the call is reported, then ended as failed: the
    ///     caller's name stays in Recents, and nothing rings that cannot be answered.
    public init(payload: Data, phoneRunning: Bool) {
        guard let body = try? JSONDecoder().decode(Payload.self, from: payload).parley else {
            // Not Parley's: something must still be reported, then ended.
            report = IncomingCallReport(call: UUID(), caller: "unknown", callerName: nil, video: false)
            call = nil
            endAtOnce = .failed
            return
        }
        report = IncomingCallReport(call: body.call.uuid, caller: body.from.user, callerName: body.from.name, video: body.media.video)
        call = Call(id: body.call, from: body.from.user, name: body.from.name, media: body.media)
        endAtOnce = phoneRunning ? nil : .failed
    }

    private struct Payload: Decodable {
        struct Body: Decodable {
            struct From: Decodable {
                var user: UserID
                var name: String?
            }

            var call: CallID
            var from: From
            var media: MediaSpec
            var expiresAt: Int64
        }

        var parley: Body
    }
}

/// Registers a device with the server (`PUT /v1/devices/{device}`), with its VoIP token or without.
public protocol DeviceRegistrar: Sendable {
    func register(_ registration: DeviceRegistration) async throws
}

/// Connects a `VoIPPushSource` to the calls: each token is registered with the server (hex, with
/// the app's topic and the push environment it belongs to), and each push goes to
/// `CallManager.handleVoIPPush` with the system's completion. A registration that fails is tried
/// again with backoff until it succeeds or a newer token replaces it.
public actor VoIPPushCoordinator<C: Clock> where C.Duration == Duration {
    public struct Configuration: Sendable {
        public var platform: Platform
        /// The app's bundle id (the server sends VoIP pushes to `<topic>.voip`).
        public var topic: String
        /// `sandbox` for a development build's token, `production` for TestFlight and the App Store.
        public var environment: VoIPRegistration.Environment
        public var firstRetry: Duration = .seconds(1)
        public var maximumRetry: Duration = .seconds(60)

        public init(platform: Platform = .ios, topic: String, environment: VoIPRegistration.Environment) {
            self.platform = platform
            self.topic = topic
            self.environment = environment
        }
    }

    private let source: any VoIPPushSource
    private let calls: CallManager<C>
    private let registrar: any DeviceRegistrar
    private let configuration: Configuration
    private let clock: C
    private let logger: Logger
    private var registering: Task<Void, Never>?
    /// The registration the server has, once it said so.
    public private(set) var registered: DeviceRegistration?
    private var voip: VoIPRegistration?
    private var alerts: VoIPRegistration?

    public init(source: any VoIPPushSource, calls: CallManager<C>, registrar: any DeviceRegistrar, configuration: Configuration,
                clock: C, logger: Logger) {
        self.source = source
        self.calls = calls
        self.registrar = registrar
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
    }

    /// Handles the source's events until it ends or the task is cancelled.
    public func run() async {
        for await event in source.subscribe() {
            switch event {
            case .token(let token):
                voip = VoIPRegistration(token: Self.hex(token), topic: configuration.topic, environment: configuration.environment)
                register()
            case .tokenInvalidated:
                voip = nil
                register()
            case .push(let payload, let completion):
                // Not in a task of its own: pushes are reported in the order they came.
                await calls.handleVoIPPush(payload, completion: completion)
            case .reported(let push):
                await calls.pushedCallReported(push)
            }
        }
        registering?.cancel()
    }

    /// The app's notification token (`application(_:didRegisterForRemoteNotificationsWithDeviceToken:)`),
    /// for alerts such as a missed call: registered beside the VoIP token.
    public func alertToken(_ token: Data) {
        alerts = VoIPRegistration(token: Self.hex(token), topic: configuration.topic, environment: configuration.environment)
        register()
    }

    /// Signing out: the server forgets this device's tokens, so the next user's calls are not
    /// announced to the previous one (and the other way round).
    public func unregister() async throws {
        registering?.cancel()
        await registering?.value
        voip = nil
        alerts = nil
        try await registrar.register(DeviceRegistration(platform: configuration.platform))
        registered = nil
    }

    /// The token as APNs wants it in a request path: lowercase hex.
    public static func hex(_ token: Data) -> String {
        token.map { String(format: "%02x", $0) }.joined()
    }

    private func register() {
        let registration = DeviceRegistration(platform: configuration.platform, voip: voip, alerts: alerts)
        let previous = registering
        previous?.cancel()
        registering = Task {
            // One registration in flight at a time: a stale one must not land after a newer one.
            await previous?.value
            var wait = configuration.firstRetry
            while !Task.isCancelled {
                do {
                    try await registrar.register(registration)
                    self.registered = registration
                    return
                } catch {
                    logger.notice("could not register the device for VoIP pushes; trying again",
                                  metadata: ["error": "\(error)", "retry.seconds": "\(wait.components.seconds)"])
                }
                try? await clock.sleep(for: wait)
                wait = min(wait * 2, configuration.maximumRetry)
            }
        }
    }
}
