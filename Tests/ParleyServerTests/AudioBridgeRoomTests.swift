import Crypto
import Foundation
import ParleyJanus
import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

/// Rooms on a real Janus AudioBridge: the server creates the room, admits each device with its own
/// token, revokes and kicks on leave, and destroys the room once empty.
@Suite("AudioBridge rooms provisioned by the server", .serialized, .enabled(if: JanusAvailability.enabled), .timeLimit(.minutes(5)))
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

    /// `room.leave` is acknowledged only once Janus no longer admits the device's token. The server
    /// reaches Janus slowly here (a proxy holds back each frame 300 ms either way), and a join
    /// with the old token goes to Janus directly right after the ack: when the revocation ran on a
    /// task of its own after the ack, that join got in every time.
    @Test func aTokenAdmitsNoOneOnceTheLeaveIsAcknowledged() async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        let slowLink = try TCPProxy()
        defer { slowLink.stop() }
        slowLink.connect(to: janus.port, host: janus.address)
        let server = try await LiveServer.start { $0.janus = JanusSettings(url: "ws://127.0.0.1:\(slowLink.port)") }
        let alice = try await server.device("alice", "a1")
        let joined = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Alice")) }.get().decodeResult(RoomJoinResult.self)
        let ticket = try #require(joined.media.janus)
        let probe = try await AudioBridge.attach(try await Self.client(janus))

        slowLink.delay = .milliseconds(300)
        let left = try await alice.request { .roomLeave(RoomLeave(id: $0, room: "lobby")) }.get()
        #expect(try left.decodeResult(RoomLeaveResult.self).revocationPending == nil, "Janus could be reached")
        await #expect(throws: JanusError.audioBridge(.unauthorized, reason: "Unauthorized (not in the allowed list)")) {
            _ = try await probe.join(room: ticket.room, display: "Alice", token: ticket.token)
        }
        try await server.stop()
    }

    /// Janus out of reach when a device leaves: it has left all the same, the ack says the
    /// revocation is still to come, and once Janus can be reached again the token is removed.
    @Test func aLeaveWhileJanusIsOutOfReachIsRevokedWhenItIsBack() async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        let link = try TCPProxy()
        defer { link.stop() }
        link.connect(to: janus.port, host: janus.address)
        let server = try await LiveServer.start { $0.janus = JanusSettings(url: "ws://127.0.0.1:\(link.port)") }
        let alice = try await server.device("alice", "a1")
        let bob = try await server.device("bob", "b1")
        let joined = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Alice")) }.get().decodeResult(RoomJoinResult.self)
        let ticket = try #require(joined.media.janus)
        _ = try await bob.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Bob")) }.get()

        // The server's connection to Janus breaks, and nothing new gets through.
        link.connect(to: try freeTCPPort())
        link.cut()
        let left = try await alice.request { .roomLeave(RoomLeave(id: $0, room: "lobby")) }.get()
        #expect(try left.decodeResult(RoomLeaveResult.self).revocationPending == true)
        _ = try await bob.expect { if case .roomParticipantLeft(let gone) = $0.message { gone } else { nil } }

        // Janus within reach again: the token stops admitting, without anyone asking.
        link.connect(to: janus.port, host: janus.address)
        let probe = try await AudioBridge.attach(try await Self.client(janus))
        try await eventually(timeout: .seconds(10), "the token is revoked") {
            do {
                _ = try await probe.join(room: ticket.room, display: "Alice", token: ticket.token)
                try await probe.leave()
                return false
            } catch JanusError.audioBridge(.unauthorized, _) {
                return true
            }
        }
        try await server.stop()
    }

    @Test func aJoinWhileJanusIsDownIsUnavailable() async throws {
        let server = try await LiveServer.start { $0.janus = JanusSettings(url: "ws://127.0.0.1:\(try! freeTCPPort())") }
        let alice = try await server.device("alice", "a1")
        let answer = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby")) }
        #expect(answer.errorCode == .unavailable)
        try await server.stop()
    }

    /// A join still waiting for Janus when its device starts a new session (a hello without
    /// resume): the admission is taken back once Janus answers, nobody hears that the device joined,
    /// and the new session neither gets the old request's answer nor finds it under that id.
    @Test func aJoinThatOutlivesItsSessionIsTakenBackAndAnsweredToNoOne() async throws {
        try await Self.withBobInTheLobby(emptyRoomGrace: .milliseconds(300)) { janus, h, bob in
            // Janus stops answering: alice's join waits for it, and alice says hello again meanwhile.
            let pid = janus.process.processIdentifier
            kill(pid, SIGSTOP)
            let alice = await h.device("alice", "a1")
            await alice.send(.roomJoin(RoomJoin(id: "join", room: "lobby", display: "Alice")))
            let again = await h.device("alice", "a1")
            #expect(again.welcome?.resumed == false)
            kill(pid, SIGCONT)

            // Janus answers the joins in order: carol's answer comes after alice's admission is over.
            let carol = await h.device("carol", "c1")
            await carol.send(.roomJoin(RoomJoin(id: "carol-join", room: "lobby", display: "Carol")))
            guard case .ack(let carolJoined) = try await Self.answer("carol-join", to: carol) else { throw TestFailure("carol could not join") }
            #expect(try carolJoined.decodeResult(RoomJoinResult.self).participants.map(\.device) == ["b1"])
            // Bob hears the room's news in order: had alice's admission been kept, he would have
            // heard her join before carol's.
            #expect(try await Self.roomNews(of: bob, through: "+c1") == ["+c1"], "alice's old session's join put no one in the room")
            #expect(again.events().allSatisfy { $0.requestID != "join" })
            // The new session runs its own request of that id.
            await again.send(.ping(Ping(id: "join")))
            #expect(again.events() == [.ack(Ack(re: "join"))])

            // In Janus too: once bob and carol leave, the room is empty and goes, which it would
            // not with alice's admission kept.
            let room = try #require(try carolJoined.decodeResult(RoomJoinResult.self).media.janus).room
            for (device, id) in [(bob, "bob-leave"), (carol, "carol-leave")] {
                await device.send(.roomLeave(RoomLeave(id: id, room: "lobby")))
                guard case .ack = try await Self.answer(id, to: device) else { throw TestFailure("\(id) was refused") }
            }
            let probe = try await AudioBridge.attach(try await Self.client(janus))
            try await eventually("the empty room is destroyed") { try await !probe.exists(room: room) }
        }
    }

    /// A leave sent while the device's join still waits for Janus waits for the join, then leaves:
    /// it is acknowledged (not answered `not_in_room`), the others hear the device join and leave,
    /// and nobody finds it in the room afterwards.
    @Test func aLeaveSentWhileItsJoinWaitsForJanusLeavesOnceTheJoinIsDone() async throws {
        try await Self.withBobInTheLobby { janus, h, bob in
            // Janus stops answering: alice's join waits for it, and her leave comes meanwhile.
            let pid = janus.process.processIdentifier
            kill(pid, SIGSTOP)
            let alice = await h.device("alice", "a1")
            await alice.send(.roomJoin(RoomJoin(id: "join", room: "lobby", display: "Alice")))
            async let leaving: Void = alice.send(.roomLeave(RoomLeave(id: "leave", room: "lobby")))
            // Janus goes on whatever the check finds, or the test would wait for it forever.
            let leaveWaits = (try? await eventually("the leave waits for the join") { await h.hub.leavesWaiting(for: alice.key, in: "lobby") == 1 }) != nil
            kill(pid, SIGCONT)
            #expect(leaveWaits, "the leave came while the join waited for Janus")
            await leaving
            // Both answered by now (the leave waited for the join): the join's ack first, then the leave's.
            let answers = alice.events().filter { $0.requestID != nil }
            #expect(answers.map(\.requestID) == ["join", "leave"])
            guard answers.count == 2, case .ack = answers[0], case .ack = answers[1] else {
                throw TestFailure("alice's join and leave were answered \(answers)")
            }

            let carol = await h.device("carol", "c1")
            await carol.send(.roomJoin(RoomJoin(id: "carol-join", room: "lobby", display: "Carol")))
            guard case .ack(let carolJoined) = try await Self.answer("carol-join", to: carol) else { throw TestFailure("carol could not join") }
            #expect(try carolJoined.decodeResult(RoomJoinResult.self).participants.map(\.device) == ["b1"])
            #expect(try await Self.roomNews(of: bob, through: "+c1") == ["+a1", "-a1", "+c1"])
        }
    }

    /// What `device` hears of devices joining ("+d1") and leaving ("-d1") rooms, in order, up to
    /// and with `last`. `events()` hands each event over once: they are gathered across the checks.
    static func roomNews(of device: TestDevice, through last: String) async throws -> [String] {
        var heard: [String] = []
        try await eventually("\(last) heard") {
            heard += device.events().compactMap { message -> String? in
                switch message {
                case .roomParticipantJoined(let joined): "+\(joined.device)"
                case .roomParticipantLeft(let left): "-\(left.device)"
                default: nil
                }
            }
            return heard.contains(last)
        }
        return heard
    }

    /// Janus running, a hub provisioning rooms on it, and bob in its room "lobby".
    static func withBobInTheLobby(emptyRoomGrace: Duration? = nil,
                                  _ body: (JanusServer, HubHarness, TestDevice) async throws -> Void) async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        let h = try HubHarness {
            var settings = JanusSettings(url: janus.url)
            if let emptyRoomGrace { settings.emptyRoomGrace = emptyRoomGrace }
            $0.janus = settings
        }
        let bob = await h.device("bob", "b1")
        await bob.send(.roomJoin(RoomJoin(id: "bob-join", room: "lobby", display: "Bob")))
        guard case .ack = try await answer("bob-join", to: bob) else { throw TestFailure("bob could not join") }
        try await body(janus, h, bob)
    }

    /// The answer to request `id` once the device has it.
    static func answer(_ id: String, to device: TestDevice) async throws -> ServerMessage {
        var answer: ServerMessage?
        try await eventually("an answer to \(id)") {
            answer = device.events().first { $0.requestID == id }
            return answer != nil
        }
        return answer!
    }

    /// The server restarts under a room (on SQLite, which keeps the room key). The room goes on in
    /// Janus, and joins on the restarted server are into that same room. Alice's session starts anew
    /// and her `room.join` names the participant she is in Janus: the server keeps that admission —
    /// the same participant and token, no kick — and lists her to newcomers again. Bob cannot name
    /// her participant as his own, nor keep one Janus no longer has; and the restarted server still
    /// takes her token back when she leaves.
    @Test func aRoomOutlivesItsServersRestartAndItsMemberKeepsItsAdmission() async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        let database = try await TestDatabase(.sqlite)
        defer { database.close() }
        let configure: (inout ServerConfiguration) -> Void = { $0.janus = JanusSettings(url: janus.url) }
        let first = try await LiveServer.start(databasePath: database.setting, configure: configure)
        let alice = try await first.device("alice", "a1")
        let aliceTicket = try #require(try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Alice")) }.get()
            .decodeResult(RoomJoinResult.self).media.janus)
        let aliceJanus = try await Self.enter(janus, with: aliceTicket, as: "Alice")
        try await first.stop()

        let second = try await LiveServer.start(databasePath: database.setting, configure: configure)
        let aliceAgain = try await second.device("alice", "a1")
        let rejoined = try await aliceAgain.request {
            .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Alice", participant: aliceTicket.participant))
        }.get().decodeResult(RoomJoinResult.self)
        #expect(rejoined.media.janus == aliceTicket, "the same admission: participant and token")

        let bob = try await second.device("bob", "b1")
        let bobJoined = try await bob.request {
            .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Bob", participant: aliceTicket.participant))
        }.get().decodeResult(RoomJoinResult.self)
        #expect(bobJoined.participants.map(\.device) == ["a1"], "alice is listed to a newcomer again")
        let bobTicket = try #require(bobJoined.media.janus)
        #expect(bobTicket.room == aliceTicket.room, "the same Janus room (the room key is in the database)")
        #expect(bobTicket.participant != aliceTicket.participant, "alice's participant is not bob's to name")
        let bobJanus = try await Self.enter(janus, with: bobTicket, as: "Bob")
        #expect(bobJanus.others.map(\.id) == [aliceTicket.participant], "alice still talks in it")
        #expect(!aliceJanus.hears.contains(.destroyed(room: aliceTicket.room)))
        // Bob leaves Janus and joins again naming his participant: Janus no longer has it, so it is a new admission.
        try await bobJanus.bridge.leave()
        let bobAgain = try #require(try await bob.request {
            .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Bob", participant: bobTicket.participant))
        }.get().decodeResult(RoomJoinResult.self).media.janus)
        #expect(bobAgain.participant != bobTicket.participant && bobAgain.token != bobTicket.token)
        #expect(!aliceJanus.hears.contains(.kicked(room: aliceTicket.room, id: aliceTicket.participant)))

        // She leaves: the restarted server knew her token and participant, and takes both back.
        #expect(try await aliceAgain.request { .roomLeave(RoomLeave(id: $0, room: "lobby")) }.isSuccess)
        try await eventually("alice kicked once she leaves") { aliceJanus.hears.contains(.kicked(room: aliceTicket.room, id: aliceTicket.participant)) }
        let probe = try await AudioBridge.attach(try await Self.client(janus))
        await #expect(throws: JanusError.audioBridge(.unauthorized, reason: "Unauthorized (not in the allowed list)")) {
            _ = try await probe.join(room: aliceTicket.room, display: "Alice", token: aliceTicket.token)
        }
        try? await aliceJanus.bridge.client.destroy()
        try? await bobJanus.bridge.client.destroy()
        try await second.stop()
    }

    /// A participant id proves whom it was issued to: it checks for its room and device under its
    /// key, and for no other room, device or key; every id is one Janus takes.
    @Test func aParticipantIdIsCheckedAgainstItsRoomDeviceAndKey() {
        let key = SymmetricKey(data: [UInt8](repeating: 7, count: 32)), otherKey = SymmetricKey(data: [UInt8](repeating: 8, count: 32))
        let alice = DeviceKey(user: "alice", device: "a1")
        for nonce: UInt32 in [1, 2, 77, (1 << 21) - 1] {
            let id = AudioBridgeRooms.participant(room: "lobby", device: alice, nonce: nonce, key: key)
            #expect((1..<(1 << 53)).contains(id))
            #expect(AudioBridgeRooms.isIssued(id, room: "lobby", device: alice, key: key))
            #expect(!AudioBridgeRooms.isIssued(id, room: "standup", device: alice, key: key))
            #expect(!AudioBridgeRooms.isIssued(id, room: "lobby", device: DeviceKey(user: "alice", device: "a2"), key: key))
            #expect(!AudioBridgeRooms.isIssued(id, room: "lobby", device: DeviceKey(user: "bob", device: "a1"), key: key))
            #expect(!AudioBridgeRooms.isIssued(id, room: "lobby", device: alice, key: otherKey))
            #expect(!AudioBridgeRooms.isIssued(id ^ 1, room: "lobby", device: alice, key: key))
        }
        #expect(!AudioBridgeRooms.isIssued(12345, room: "lobby", device: alice, key: key), "an id with no nonce")
        let id = AudioBridgeRooms.participant(room: "lobby", device: alice, nonce: 5, key: key)
        #expect(AudioBridgeRooms.token(room: "lobby", device: alice, participant: id, key: key)
                != AudioBridgeRooms.token(room: "lobby", device: alice, participant: id, key: otherKey))
    }

    /// A room's Janus number and secret come from the room key alone: the same on every node and
    /// after a restart, different for another room or another deployment, in JSON's exact range.
    @Test func roomNumbersAndSecretsAreDerivedFromTheRoomKey() {
        let key = SymmetricKey(data: [UInt8](repeating: 7, count: 32)), otherKey = SymmetricKey(data: [UInt8](repeating: 8, count: 32))
        let standup = AudioBridgeRooms.derive("standup", key: key)
        #expect(AudioBridgeRooms.derive("standup", key: key) == standup)
        #expect(AudioBridgeRooms.derive("standup", key: otherKey).number != standup.number)
        #expect(AudioBridgeRooms.derive("standup", key: otherKey).secret != standup.secret)
        #expect(AudioBridgeRooms.derive("lobby", key: key).number != standup.number)
        #expect((1..<(1 << 53)).contains(standup.number))
        #expect(standup.secret.count == 64)
    }

    /// A client in the Janus room a `room.join` ticket names, joined as the SDK joins it (the
    /// ticket's token and participant id), with what it hears logged from before it joins.
    struct JanusMember {
        let bridge: AudioBridge
        let hears: EventLog
        let others: [AudioBridgeParticipant]
    }

    static func enter(_ janus: JanusServer, with ticket: RoomMedia.Janus, as display: String) async throws -> JanusMember {
        let bridge = try await AudioBridge.attach(try await client(janus))
        let hears = EventLog(bridge.events)
        let joined = try await bridge.join(room: ticket.room, display: display, token: ticket.token, id: ticket.participant)
        return JanusMember(bridge: bridge, hears: hears, others: joined.participants)
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
    init(_ stream: AudioBridge.Events) {
        Task { [weak self] in for await event in stream { self?.lock.withLock { self?.events.append(event) } } }
    }
    func contains(_ event: AudioBridgeEvent) -> Bool { lock.withLock { events.contains(event) } }
}
