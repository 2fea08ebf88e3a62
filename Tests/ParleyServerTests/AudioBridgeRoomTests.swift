import Foundation
import ParleyJanus
import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

/// Rooms on a real Janus AudioBridge: the server creates the room, admits each device with its own
/// token, revokes and kicks on leave, and destroys the room once empty.
@Suite("AudioBridge rooms provisioned by the server", .serialized, .enabled(if: JanusAvailability.enabled))
struct AudioBridgeRoomTests {
    @Test func devicesAreAdmittedByTokenAndRevokedOnLeave() async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        let server = try await LiveServer.start {
            var settings = JanusSettings(url: janus.url)
            settings.emptyRoomGrace = .milliseconds(500)
            $0.janus = settings
        }
        let alice = try await server.device("alice", "a1")
        let bob = try await server.device("bob", "b1")

        let first = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Alice")) }.get().decodeResult(RoomJoinResult.self)
        #expect(first.media.mode == "audiobridge")
        let aliceTicket = try #require(first.media.janus)
        #expect(aliceTicket.url == janus.url)
        #expect(aliceTicket.room > 0 && aliceTicket.room < 1 << 53)
        let second = try await bob.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Bob")) }.get().decodeResult(RoomJoinResult.self)
        let bobTicket = try #require(second.media.janus)
        #expect(bobTicket.room == aliceTicket.room)
        #expect(bobTicket.token != aliceTicket.token)
        #expect(second.participants.map(\.device) == ["a1"])
        _ = try await alice.expect { if case .roomParticipantJoined(let joined) = $0.message { joined } else { nil } }

        // The tokens admit exactly their holders; the room is private and its secret the server's.
        let aliceJanus = try await AudioBridge.attach(try await Self.client(janus))
        let admitted = try await aliceJanus.join(room: aliceTicket.room, display: "Alice", token: aliceTicket.token, id: aliceTicket.participant)
        #expect(admitted.id == aliceTicket.participant)
        let outsider = try await AudioBridge.attach(try await Self.client(janus))
        await #expect(throws: JanusError.audioBridge(.unauthorized, reason: "Unauthorized (not in the allowed list)")) {
            _ = try await outsider.join(room: aliceTicket.room, display: "Mallory", token: "guess")
        }
        #expect(try await outsider.list().isEmpty, "the room is private")
        await #expect(throws: JanusError.self) { try await outsider.destroy(room: aliceTicket.room, secret: "parley") }

        // Alice leaves: her participant is kicked and her token no longer admits.
        let aliceHears = EventLog(aliceJanus.events)
        _ = try await alice.request { .roomLeave(RoomLeave(id: $0, room: "lobby")) }.get()
        try await eventually("alice kicked from Janus") { aliceHears.contains(.kicked(room: aliceTicket.room, id: aliceTicket.participant)) }
        let again = try await AudioBridge.attach(try await Self.client(janus))
        await #expect(throws: JanusError.audioBridge(.unauthorized, reason: "Unauthorized (not in the allowed list)")) {
            _ = try await again.join(room: aliceTicket.room, display: "Alice", token: aliceTicket.token)
        }

        // Bob leaves too: after the grace period the room is gone from Janus.
        #expect(try await again.exists(room: aliceTicket.room))
        _ = try await bob.request { .roomLeave(RoomLeave(id: $0, room: "lobby")) }.get()
        try await eventually(timeout: .seconds(5), "room destroyed") { try await again.exists(room: aliceTicket.room) == false }

        // A join after that creates the room again.
        let third = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby")) }.get().decodeResult(RoomJoinResult.self)
        #expect(try await again.exists(room: try #require(third.media.janus).room))
        try await server.stop()
    }

    @Test func aJoinWhileJanusIsDownIsUnavailable() async throws {
        let server = try await LiveServer.start { $0.janus = JanusSettings(url: "ws://127.0.0.1:\(try! freeTCPPort())") }
        let alice = try await server.device("alice", "a1")
        let answer = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby")) }
        #expect(answer.errorCode == .unavailable)
        try await server.stop()
    }

    static func client(_ janus: JanusServer) async throws -> JanusClient {
        let client = JanusClient(transport: try await JanusWebSocketTransport.connect(to: janus.url))
        try await client.createSession()
        return client
    }
}

enum JanusAvailability {
    static let enabled = JanusServer.testsCanRun("AudioBridge room tests")
}

final class EventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var events: [AudioBridgeEvent] = []
    init(_ stream: AsyncStream<AudioBridgeEvent>) {
        Task { [weak self] in for await event in stream { self?.lock.withLock { self?.events.append(event) } } }
    }
    func contains(_ event: AudioBridgeEvent) -> Bool { lock.withLock { events.contains(event) } }
}
