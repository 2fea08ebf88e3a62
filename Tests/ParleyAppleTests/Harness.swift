import AVFAudio
import CallKit
import Foundation
import Logging
import ParleyApple
import ParleyKit
import ParleyLocalServices
import ParleyNIOTransport
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import PushKit
import Testing
import WebRTC

/// An iPhone as far as Linux allows: `ParleyPhone` with its real adapters over the stand-ins for
/// CallKit, PushKit, AVFAudio and WebRTC's audio session; signaling over NIO (URLSession cannot
/// open a WebSocket on Linux) to a real server; media from the SDK's fake peer connection.
struct IPhone {
    let phone: ParleyPhone
    let peers: FakePeerConnectionFactory

    /// What the app made at launch, shared by every phone of the process (one per signed-in user).
    var calls: CallSystem { phone.system }
    var pushes: PushKitVoIPSource { phone.system.pushes }
    var system: CXProvider { phone.callKit.provider }

    /// Stops the phone; every action CallKit handed it was fulfilled or failed by then (on a device
    /// CallKit times out an open one, and a start or answer left open fails its call).
    func stop(sourceLocation: SourceLocation = #_sourceLocation) async {
        await phone.stop()
        #expect(system.standInOpenActions.isEmpty, "actions left open: \(system.standInOpenActions)", sourceLocation: sourceLocation)
    }

    /// The app at launch: its one CallKit provider and PushKit registry (PushKit's delegate on a
    /// queue of its own: the tests' main queue is not an app's run loop).
    static func launch() -> CallSystem {
        AVAudioSession.sharedInstance().standInReset()
        RTCAudioSession.sharedInstance().standInReset()
        return CallSystem(pushQueue: DispatchQueue(label: "test.pushkit"))
    }

    /// A user signs in on an app launched with `system` (a new launch if nil).
    static func start(_ server: LiveServer, user: UserID, device: DeviceID, holdPeers: Bool = false,
                      system: CallSystem? = nil) async throws -> IPhone {
        let system = system ?? launch()
        let peers = FakePeerConnectionFactory(name: "\(user)-iphone")
        if holdPeers { peers.holdCreation() }
        var logger = Logger(label: "test.iphone")
        logger.logLevel = .critical
        let phone = ParleyPhone(configuration: .init(server: URL(string: server.baseURL)!, device: device, topic: "net.parley.app",
                                                     pushEnvironment: .sandbox, token: { try await server.token(user) }),
                                system: system, logger: logger, peers: peers, transport: WebSocketSignalingTransport())
        phone.start()
        try await eventually("the iPhone connects") { await phone.signaling.session != nil }
        return IPhone(phone: phone, peers: peers)
    }

    /// The incoming calls CallKit was told of.
    var incoming: [UUID] {
        system.standInReports.compactMap { if case .incoming(let call, _, _, _) = $0 { call } else { nil } }
    }

    func ended(_ call: UUID) -> CXCallEndedReason? {
        for report in system.standInReports { if case .ended(call, let reason) = report { return reason } }
        return nil
    }
}

/// The other party: the SDK core with fake system ports, as the SDK's own tests use it.
final class OtherParty: @unchecked Sendable {
    let provider = FakeSystemCallProvider()
    let audio = FakeAudioSession()
    let peers: FakePeerConnectionFactory
    let signaling: SignalingClient<ContinuousClock>
    let manager: CallManager<ContinuousClock>
    private var task: Task<Void, Never>?

    init(_ server: LiveServer, user: UserID) {
        var configuration = SignalingClient<ContinuousClock>.Configuration(url: URL(string: server.signalURL)!, device: "laptop")
        configuration.backoff = .init(initial: .milliseconds(50), maximum: .milliseconds(500))
        signaling = SignalingClient(configuration: configuration, transport: WebSocketSignalingTransport(), clock: ContinuousClock(),
                                    logger: Logger(label: "test.other")) { try await server.token(user) }
        peers = FakePeerConnectionFactory(name: "\(user)-laptop")
        manager = CallManager(signaling: signaling, provider: provider, audio: audio, peers: peers, clock: ContinuousClock(),
                              logger: Logger(label: "test.other"))
    }

    func start() async throws {
        task = Task { [manager] in await manager.run() }
        try await eventually("the other party connects") { await self.signaling.session != nil }
    }

    func call(_ user: UserID) -> UUID {
        let call = UUID()
        provider.perform { .start($0, call: call, to: user, video: false) }
        return call
    }

    /// Stops it; the test fails if its app broke a CallKit rule or left an action open.
    func stop(sourceLocation: SourceLocation = #_sourceLocation) async {
        await signaling.stop()
        task?.cancel()
        #expect(provider.violations.isEmpty, "the other party broke CallKit's rules: \(provider.violations)", sourceLocation: sourceLocation)
        #expect(provider.openActions.isEmpty, "the other party left actions open: \(provider.openActions)", sourceLocation: sourceLocation)
    }
}

/// Every suite of this target, one at a time: the stand-ins hold what iOS holds once per process
/// (the audio session, WebRTC's audio session, the app's CallKit provider, the Local Network
/// permission, the path every monitor sees), so two suites running side by side would play one
/// iPhone's system to each other.
@Suite(.serialized)
enum OneIPhone {}
