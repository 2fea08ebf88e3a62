import CallKit
import Foundation
import Logging
@testable import ParleyApple
import ParleyKit
import ParleyLocalServices
import ParleyNIOTransport
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import PushKit
import Testing
import WebRTC

/// `eventually`, on the main actor, for the model's state.
@MainActor
func waitFor(_ message: String, timeout: Duration = .seconds(10), _ condition: @MainActor () async throws -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(5))
    }
    throw TestFailure("\(message) did not become true in time")
}

final class MemoryStore: PhoneModel.SessionStore, @unchecked Sendable {
    private let lock = NSLock()
    private var session: PhoneModel.Session?
    func load() -> PhoneModel.Session? { lock.withLock { session } }
    func save(_ session: PhoneModel.Session?) { lock.withLock { self.session = session } }
    let device = DeviceID(rawValue: "ios-\(UUID().uuidString.prefix(8).lowercased())")!
    func installationDevice() -> DeviceID { device }
}

extension OneIPhone {
    /// The example app's model, with the adapters over the stand-ins and a real server.
    @Suite("The example app's model", .serialized)
    @MainActor
    struct PhoneModelTests {
        static func model(store: MemoryStore = MemoryStore(), peers: FakePeerConnectionFactory,
                          system: CallSystem = CallSystem(pushQueue: DispatchQueue(label: "test.pushkit"))) -> PhoneModel {
            PhoneModel(store: store, topic: "net.parley.app", pushEnvironment: .sandbox) { configuration in
                var logger = Logger(label: "test.model")
                logger.logLevel = .critical
                return ParleyPhone(configuration: configuration, system: system, logger: logger, peers: peers,
                                   transport: WebSocketSignalingTransport())
            }
        }

        @Test func signInTakeACallControlItAndSeeItInTheHistory() async throws {
            let server = try await LiveServer.start()
            let store = MemoryStore()
            let peers = FakePeerConnectionFactory(name: "bob-model")
            let model = Self.model(store: store, peers: peers)
            await model.signIn(server: URL(string: server.baseURL)!, user: "bob", name: "Bob")
            #expect(model.signIn == .signedIn("bob"))
            #expect(store.load()?.user == "bob", "kept for the next launch")
            let phone = try #require(model.phone)
            try await waitFor("connected") { await phone.signaling.session != nil }

            let alice = OtherParty(server, user: "alice")
            try await alice.start()
            let id = alice.call("bob")
            try await waitFor("the call shows") { model.calls.first?.phase == .ringing && model.calls.first?.remote == "alice" }
            await model.answer(id)
            phone.callKit.provider.standInActivateAudioSession()
            try await waitFor("connected") { model.calls.first?.phase == .connected }
            await model.toggleMute(id)
            #expect(model.calls.first?.muted == true)
            try await waitFor("the microphone is off") { peers.connections.first?.muted == true }
            await model.hangUp(id)
            try await waitFor("the call is gone") { model.calls.isEmpty }
            try await waitFor("and in the history") { model.history.first?.call == CallID(uuid: id) }
            #expect(model.history.first?.caller == "alice")

            await model.signOut()
            #expect(model.signIn == .signedOut)
            #expect(store.load() == nil)
            #expect(phone.callKit.provider.standInOpenActions.isEmpty, "\(phone.callKit.provider.standInOpenActions)")
            await alice.stop()
            try await server.stop()
        }

        nonisolated static func productionServer() async throws -> LiveServer {
            try await LiveServer.start { $0.developmentMode = false }
        }

        @Test func badInputAndAServerThatGivesNoTokensSayWhatIsWrong() async throws {
            let model = Self.model(peers: FakePeerConnectionFactory(name: "x"))
            await model.signIn(server: URL(string: "http://127.0.0.1:9")!, user: "not a user")
            #expect(model.problem?.contains("is not a user id") == true)
            await model.signIn(server: URL(string: "http://127.0.0.1:9")!, user: "bob")
            #expect(model.signIn == .signedOut)
            #expect(model.problem?.contains("cannot be reached") == true)
            let production = try await Self.productionServer()
            await model.signIn(server: URL(string: production.baseURL)!, user: "bob")
            #expect(model.problem?.contains("does not hand out development tokens") == true)
            try await production.stop()
        }
    }
}
