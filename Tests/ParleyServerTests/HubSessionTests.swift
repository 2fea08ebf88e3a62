import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

@Suite("Hub: sessions, resume, timeouts")
struct HubSessionTests {
    let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"

    @Test func helloIsAnsweredWithWelcome() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let welcome = try #require(alice.welcome)
        #expect(welcome.re == "hello")
        #expect(welcome.user == "alice")
        #expect(welcome.device == "a1")
        #expect(welcome.resumed == false)
        #expect(welcome.heartbeat == 20)
        #expect(welcome.iceServers == [])
        let first = alice.sink.take()
        #expect(first.isEmpty)
        await alice.send(.ping(Ping(id: "p")))
        #expect(alice.sink.take().first?.seq == 1, "numbering starts at 1 after welcome")
    }

    @Test func framesBeforeHelloAreRefusedAndTheDeadlineHolds() async throws {
        let h = try HubHarness()
        let client = await h.open("alice")
        await client.send(.ping(Ping(id: "early")))
        let refused = client.sink.take()
        #expect(refused.count == 1)
        #expect(refused.first?.seq == nil)
        #expect(refused.first?.message == .error(ErrorMessage(re: "early", code: .badRequest, message: "the first frame must be hello")))
        await h.advance(.seconds(9))
        #expect(client.sink.closeCode == nil)
        await h.advance(.seconds(1))
        #expect(client.sink.closeCode == .helloTimeout)
    }

    @Test func resumeReplaysEveryMissedFrameInOrderWithItsSeq() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        let seen = bob.sink.take()
        let lastSeq = try #require(seen.last?.seq)
        await bob.disconnect()

        // While bob is away: ringing is cancelled, and another call rings.
        _ = await alice.request { .callHangup(CallHangup(id: $0, call: call)) }
        let second: CallID = "0b8a5f3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: second, to: "bob")) }
        await h.advance(.seconds(30))

        let resumed = await h.device("bob", "b1", resume: ResumeRequest(session: try #require(bob.welcome?.session), lastSeq: lastSeq))
        #expect(resumed.welcome?.resumed == true)
        #expect(resumed.welcome?.session == bob.welcome?.session)
        let replayed = resumed.pending
        #expect(replayed.map(\.seq) == [lastSeq + 1, lastSeq + 2])
        #expect(replayed.first?.message.endReason == .cancelled)
        guard case .callIncoming(let incoming)? = replayed.last?.message else { Issue.record("missed invite not replayed"); return }
        #expect(incoming.call == second)
        await resumed.send(.ping(Ping(id: "after")))
        #expect(resumed.sink.take().first?.seq == lastSeq + 3, "numbering continues")
    }

    @Test func framesSentButNotAcknowledgedAreResentOnResume() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        for index in 1...3 { await alice.send(.ping(Ping(id: "p\(index)"))) }
        #expect(alice.sink.take().map(\.seq) == [1, 2, 3])
        await alice.send(.ack(SeqAck(seq: 1)))
        await alice.disconnect()
        // From before the ack: the server kept only what was not acknowledged.
        let again = await h.device("alice", "a1", resume: ResumeRequest(session: try #require(alice.welcome?.session), lastSeq: 0))
        #expect(again.welcome?.resumed == true)
        #expect(again.pending.map(\.seq) == [2, 3])
    }

    @Test func aResumeTheServerCannotServeStartsANewSession() async throws {
        let h = try HubHarness { $0.limits.resumeBufferFrames = 2 }
        let alice = await h.device("alice", "a1")
        for index in 1...4 { await alice.send(.ping(Ping(id: "p\(index)"))) }
        await alice.disconnect()
        let session = try #require(alice.welcome?.session)
        let lossy = await h.device("alice", "a1", resume: ResumeRequest(session: session, lastSeq: 1))
        #expect(lossy.welcome?.resumed == false, "frame 2 was dropped, so resuming after 1 would lose it")
        #expect(lossy.welcome?.session != session)
        await lossy.disconnect()
        let unknown = await h.device("alice", "a1", resume: ResumeRequest(session: "no-such-session", lastSeq: 0))
        #expect(unknown.welcome?.resumed == false)
    }

    @Test func aSecondConnectionOfTheSameDeviceReplacesTheFirst() async throws {
        let h = try HubHarness()
        let first = await h.device("alice", "a1")
        let second = await h.device("alice", "a1")
        #expect(first.sink.closeCode == .replaced)
        #expect(second.sink.closeCode == nil)
        #expect(await h.hub.connectionCount == 1)
    }

    @Test func silenceClosesWith4002AndKeepsTheSession() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        await h.advance(.seconds(59))
        #expect(alice.sink.closeCode == nil)
        await h.advance(.seconds(1))
        #expect(alice.sink.closeCode == .heartbeatTimeout)
        let back = await h.device("alice", "a1", resume: ResumeRequest(session: try #require(alice.welcome?.session), lastSeq: 0))
        #expect(back.welcome?.resumed == true)
    }

    @Test func anExpiredTokenClosesWith4003() async throws {
        let h = try HubHarness()
        let client = await h.open("alice", tokenLifetime: 30)
        await client.send(.hello(Hello(id: "h", device: "a1")))
        await h.advance(.seconds(29))
        #expect(client.sink.closeCode == nil)
        await h.advance(.seconds(1))
        #expect(client.sink.closeCode == .tokenInvalid)
    }

    @Test func meshRoomsRelayAndRefuse() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        let room: RoomID = "standup"
        let first = try await alice.request { .roomJoin(RoomJoin(id: $0, room: room, display: "Alice")) }.get().decodeResult(RoomJoinResult.self)
        #expect(first.participants.isEmpty)
        #expect(first.media == .mesh)
        let second = try await bob.request { .roomJoin(RoomJoin(id: $0, room: room, display: "Bob")) }.get().decodeResult(RoomJoinResult.self)
        #expect(second.participants == [RoomParticipant(user: "alice", device: "a1", display: "Alice")])
        #expect(alice.events() == [.roomParticipantJoined(RoomParticipantJoined(room: room, participant: RoomParticipant(user: "bob", device: "b1", display: "Bob")))])

        let offer = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0\r\n"))
        #expect(await bob.request { .roomSignal(RoomSignal(id: $0, room: room, to: "a1", signal: offer)) }.isSuccess)
        #expect(alice.events() == [.roomSignal(RoomSignalled(room: room, from: Party(user: "bob", device: "b1"), signal: offer))])
        #expect(await bob.request { .roomSignal(RoomSignal(id: $0, room: room, to: "nobody", signal: offer)) }.errorCode == .notFound)

        let mallory = await h.device("mallory", "a1")
        #expect(await mallory.request { .roomJoin(RoomJoin(id: $0, room: room)) }.errorCode == .badRequest, "device id taken by another user")
        #expect(await mallory.request { .roomSignal(RoomSignal(id: $0, room: room, to: "a1", signal: offer)) }.errorCode == .notInRoom)
        #expect(await mallory.request { .roomLeave(RoomLeave(id: $0, room: room)) }.errorCode == .notInRoom)

        for index in 3...4 {
            let member = await h.device(UserID(rawValue: "user\(index)")!, DeviceID(rawValue: "d\(index)")!)
            #expect(await member.request { .roomJoin(RoomJoin(id: $0, room: room)) }.isSuccess)
        }
        let fifth = await h.device("user5", "d5")
        #expect(await fifth.request { .roomJoin(RoomJoin(id: $0, room: room)) }.errorCode == .roomFull)

        _ = alice.events()
        #expect(await bob.request { .roomLeave(RoomLeave(id: $0, room: room)) }.isSuccess)
        #expect(alice.events() == [.roomParticipantLeft(RoomParticipantLeft(room: room, user: "bob", device: "b1"))])
    }

    @Test func anExpiredSessionLeavesItsRooms() async throws {
        let h = try HubHarness { $0.heartbeat = 3600 }
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .roomJoin(RoomJoin(id: $0, room: "r")) }
        _ = await bob.request { .roomJoin(RoomJoin(id: $0, room: "r")) }
        _ = alice.events()
        await bob.disconnect()
        await h.advance(.seconds(59))
        #expect(alice.events().isEmpty, "held for resume, bob is still in the room")
        await h.advance(.seconds(1))
        #expect(alice.events() == [.roomParticipantLeft(RoomParticipantLeft(room: "r", user: "bob", device: "b1"))])
    }
}
