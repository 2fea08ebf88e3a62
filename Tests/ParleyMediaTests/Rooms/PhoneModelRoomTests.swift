import Foundation
import Logging
import ParleyApple
import ParleyGStreamer
import ParleyJanus
import ParleyKit
import ParleyLocalServices
import ParleyNIOTransport
import ParleyProtocol
import ParleyServerTesting
import ParleySoftphone
import PushKit
import Testing
import WebRTC

final class MemorySessionStore: PhoneModel.SessionStore, @unchecked Sendable {
    private let lock = NSLock()
    private var session: PhoneModel.Session?
    func load() -> PhoneModel.Session? { lock.withLock { session } }
    func save(_ session: PhoneModel.Session?) { lock.withLock { self.session = session } }
    let device = DeviceID(rawValue: "ios-\(UUID().uuidString.prefix(8).lowercased())")!
    func installationDevice() -> DeviceID { device }
}

/// The example app's voice room, through its model, in a real AudioBridge room with a Linux client.
/// The iPhone's media is the GStreamer engine here (the WebRTC stand-in carries none); the rest —
/// model, ParleyPhone, RoomSession, the audio session adapter — is what runs on the phone.
@Suite("The example app's voice room", .serialized, .enabled(if: RoomLab.enabled), .timeLimit(.minutes(5)))
struct PhoneModelRoomTests {
    @MainActor
    static func model(server: LiveServer) throws -> PhoneModel {
        var media = MediaEngineConfiguration()
        media.input = .tone(hertz: 440)
        media.output = .null
        media.localAddresses = [TestNetwork.clientAddress]
        media.audioLevelIndication = true
        let engine = try GStreamerEngine(configuration: media, logger: testLogger)
        let system = CallSystem(pushQueue: DispatchQueue(label: "test.pushkit"))
        return PhoneModel(store: MemorySessionStore(), topic: "net.parley.app", pushEnvironment: .sandbox) { configuration in
            // NIO's WebSocket clients for signaling and Janus: URLSession cannot open one on Linux.
            ParleyPhone(configuration: configuration, system: system, logger: testLogger, peers: engine,
                        transport: WebSocketSignalingTransport(), janus: { try await JanusWebSocketTransport.connect(to: $0) })
        }
    }

    @Test func joinSeeWhoIsThereAndWhoTalksMuteAndLeave() async throws {
        try await RoomLab.run { lab in
            let bob = try await lab.phone("bob", input: .silence)
            let (_, bobHears) = try await lab.join(bob)
            let model = try await MainActor.run { try Self.model(server: lab.server) }
            await model.signIn(server: URL(string: lab.server.baseURL)!, user: "alice")
            await model.joinRoom("lobby")
            let problem = await MainActor.run { model.problem }
            #expect(problem == nil, "\(problem ?? "")")
            try await eventually("alice sees bob and herself") {
                await MainActor.run { Set(model.room?.members.map(\.display) ?? []) == ["alice", "bob"] }
            }
            try await eventually("the room's media is up") { await MainActor.run { model.room?.connected == true } }
            #expect(RTCAudioSession.sharedInstance().isAudioEnabled, "the room turned audio on")
            // Janus hears alice's tone: bob sees her talking.
            try await eventually(timeout: .seconds(15), "bob sees alice talk") { bobHears.talking(of: "alice").contains(true) }
            await model.toggleRoomMute()
            try await bobHears.wait("bob sees alice muted") { if case .muted(let member, true) = $0 { member.display == "alice" } else { false } }
            await model.leaveRoom()
            try await bobHears.wait("bob sees alice leave") { if case .memberLeft(let member) = $0 { member.display == "alice" } else { false } }
            #expect(await MainActor.run { model.room == nil })
            #expect(!RTCAudioSession.sharedInstance().isAudioEnabled, "leaving gave the audio back")
            await model.signOut()
        }
    }
}
