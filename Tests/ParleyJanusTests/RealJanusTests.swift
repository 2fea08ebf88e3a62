import Foundation
import ParleyJanus
import ParleyServerTesting
import Testing

/// The client against a real Janus 1.1.2 in the tests' own network namespace.
@Suite("Janus client against a real Janus", .serialized, .enabled(if: JanusLab.enabled), .timeLimit(.minutes(5)))
struct RealJanusTests {
    @Test func tokensAdmitParticipantsAndEventsFollowThem() async throws {
        try await JanusLab.run { janus in
            let admin = try await JanusLab.client(janus)
            let moderator = try await AudioBridge.attach(admin)
            var options = AudioBridgeRoomOptions()
            options.secret = "s3cret"
            options.allowed = ["token-a"]
            let room = try await moderator.create(room: 77, options: options)
            #expect(room == 77)
            #expect(try await moderator.exists(room: 77))
            #expect(try await moderator.list().contains { $0.room == 77 } == false, "private rooms are not listed")

            let a = try await AudioBridge.attach(try await JanusLab.client(janus))
            await #expect(throws: JanusError.audioBridge(.unauthorized, reason: "Unauthorized (not in the allowed list)")) {
                _ = try await a.join(room: 77, display: "intruder", token: "wrong")
            }
            let alice = try await a.join(room: 77, display: "alice", token: "token-a", id: 1001)
            #expect(alice.id == 1001)

            try await moderator.allowed(room: 77, secret: "s3cret", action: "add", tokens: ["token-b"])
            let b = try await AudioBridge.attach(try await JanusLab.client(janus))
            let bob = try await b.join(room: 77, display: "bob", token: "token-b")
            #expect(bob.participants.map(\.display) == ["alice"])
            let aliceHears = EventRecorder(a.events)
            let bobHears = EventRecorder(b.events)
            try await aliceHears.wait("alice hears bob join") { if case .joined(77, let people) = $0 { people.map(\.id) == [bob.id] } else { false } }

            try await moderator.setMuted(true, room: 77, secret: "s3cret", id: bob.id)
            try await aliceHears.wait("alice hears bob muted") {
                if case .participantsUpdated(77, let update) = $0 { update.first { $0.id == bob.id }?.muted == true } else { false }
            }

            try await moderator.kick(room: 77, secret: "s3cret", id: bob.id)
            try await bobHears.wait("bob is told he was kicked") { $0 == .kicked(room: 77, id: bob.id) }
            try await aliceHears.wait("alice is told bob is gone") { $0 == .kicked(room: 77, id: bob.id) || $0 == .leaving(room: 77, id: bob.id) }

            try await moderator.destroy(room: 77, secret: "s3cret")
            try await aliceHears.wait("alice hears the room destroyed") { $0 == .destroyed(room: 77) }
        }
    }

    @Test func aClientThatStopsKeepalivesIsTimedOut() async throws {
        try await JanusLab.run(sessionTimeout: 2) { janus in
            let client = JanusClient(transport: try await JanusWebSocketTransport.connect(to: janus.url), keepalive: .seconds(3600))
            try await client.createSession()
            var ended = client.sessionEnded.makeAsyncIterator()
            let started = ContinuousClock.now
            #expect(await ended.next() == .sessionTimedOut)
            #expect(ContinuousClock.now - started < .seconds(10))
            await #expect(throws: JanusError.self) { _ = try await client.attach(plugin: AudioBridge.plugin) }
        }
    }

    /// The path to Janus goes silent without a reset: the keepalive goes unanswered, and the client
    /// says the connection is gone rather than wait on it (the room then joins again).
    @Test func aKeepaliveLeftUnansweredEndsTheSession() async throws {
        try await JanusLab.run { janus in
            let proxy = try TCPProxy()
            defer { proxy.stop() }
            proxy.connect(to: janus.port, host: janus.address)
            let client = JanusClient(transport: try await JanusWebSocketTransport.connect(to: "ws://127.0.0.1:\(proxy.port)"),
                                     keepalive: .milliseconds(500), requestTimeout: .seconds(1))
            try await client.createSession()
            try await Task.sleep(for: .seconds(1.5))  // keepalives answered meanwhile
            proxy.blackHole()
            let started = ContinuousClock.now
            // How the session ended, or nil if it had not within 10 s (a client that never notices).
            let ended = await withTaskGroup(of: JanusError?.self) { group in
                group.addTask {
                    var ends = client.sessionEnded.makeAsyncIterator()
                    return await ends.next()
                }
                group.addTask {
                    try? await Task.sleep(for: .seconds(10))
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first
            }
            #expect(ended == .disconnected, "the session did not end within 10 s of the path going silent")
            #expect(ContinuousClock.now - started < .seconds(6), "noticed within a keepalive, its timeout and the close's")
            await client.close()
        }
    }

    @Test func keepalivesKeepASessionAlive() async throws {
        try await JanusLab.run(sessionTimeout: 2) { janus in
            let client = JanusClient(transport: try await JanusWebSocketTransport.connect(to: janus.url), keepalive: .milliseconds(500))
            try await client.createSession()
            try await Task.sleep(for: .seconds(5))
            _ = try await client.attach(plugin: AudioBridge.plugin)
        }
    }
}

enum JanusLab {
    static let enabled = JanusServer.testsCanRun("real-Janus tests")

    static func run(sessionTimeout: Int = 60, _ body: (JanusServer) async throws -> Void) async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start(sessionTimeout: sessionTimeout)
        defer { janus.stop() }
        do {
            try await body(janus)
        } catch {
            print("janus log:\n\(janus.output.suffix(3000))")
            throw error
        }
    }

    static func client(_ janus: JanusServer) async throws -> JanusClient {
        let client = JanusClient(transport: try await JanusWebSocketTransport.connect(to: janus.url))
        try await client.createSession()
        return client
    }
}

/// Records every event of a stream, for waiting on one with a deadline.
final class EventRecorder: @unchecked Sendable {
    private let lock = NSLock()
    private var events: [AudioBridgeEvent] = []
    private var task: Task<Void, Never>?

    init(_ stream: AudioBridge.Events) {
        task = Task { [weak self] in
            for await event in stream { self?.lock.withLock { self?.events.append(event) } }
        }
    }

    var all: [AudioBridgeEvent] { lock.withLock { events } }

    func wait(_ what: String, timeout: Duration = .seconds(10), _ matches: @escaping (AudioBridgeEvent) -> Bool) async throws {
        do {
            try await eventually(timeout: timeout, what) { self.all.contains(where: matches) }
        } catch {
            throw TestFailure("\(what): not among \(all)")
        }
    }
}
