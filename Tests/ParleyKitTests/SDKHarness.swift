import Foundation
import Logging
@testable import ParleyKit
import ParleyNIOTransport
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

/// One app on one device: the SDK with fake system parts, talking to the real server.
final class SDKDevice: @unchecked Sendable {
    let user: UserID
    let signaling: SignalingClient<ContinuousClock>
    let provider = FakeSystemCallProvider()
    let audio = FakeAudioSession()
    let peers: FakePeerConnectionFactory
    let manager: CallManager<ContinuousClock>
    private var task: Task<Void, Never>?
    private let lock = NSLock()
    private var log: [CallEvent] = []

    init(_ server: LiveServer, user: UserID, device: DeviceID, transport: any SignalingTransport = WebSocketSignalingTransport(),
         configure: (inout CallManager<ContinuousClock>.Configuration) -> Void = { _ in }) {
        self.user = user
        signaling = makeClient(server, user: user, device: device, transport: transport)
        peers = FakePeerConnectionFactory(name: "\(user)-\(device)")
        var configuration = CallManager<ContinuousClock>.Configuration()
        configuration.statsInterval = .milliseconds(100)
        configure(&configuration)
        manager = CallManager(signaling: signaling, provider: provider, audio: audio, peers: peers, clock: ContinuousClock(),
                              logger: Logger(label: "test.sdk"), configuration: configuration)
        let events = manager.events
        Task { [weak self] in for await event in events { self?.lock.withLock { self?.log.append(event) } } }
    }

    func start() async throws {
        task = Task { await manager.run() }
        try await eventually { await signaling.session != nil }
    }

    /// Stops the device; the test fails if the app broke a CallKit rule or left an action open
    /// (CallKit would have timed it out, and the user seen the call fail), or asked the audio
    /// session for what iOS refuses.
    func stop(sourceLocation: SourceLocation = #_sourceLocation) async {
        await signaling.stop()
        task?.cancel()
        #expect(provider.violations.isEmpty, "\(user) broke CallKit's rules: \(provider.violations)", sourceLocation: sourceLocation)
        #expect(provider.openActions.isEmpty, "\(user) left actions open: \(provider.openActions)", sourceLocation: sourceLocation)
        #expect(audio.refusals.isEmpty, "\(user) asked the audio session what iOS refuses: \(audio.refusals)", sourceLocation: sourceLocation)
    }

    var events: [CallEvent] { lock.withLock { log } }

    func phase(_ call: UUID) async -> CallStateMachine.Phase? { await manager.phase(of: call) }

    /// The user starts a call from the app (through the system, as CallKit would).
    func call(_ user: UserID, video: Bool = false) -> (call: UUID, action: ProviderActionID) {
        let call = UUID()
        let action = provider.perform { .start($0, call: call, to: user, video: video) }
        return (call, action)
    }

    func incomingCall() -> UUID? {
        provider.records.compactMap { if case .incoming(let report) = $0 { report.call } else { nil } }.last
    }
}
