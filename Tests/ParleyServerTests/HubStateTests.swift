import Foundation
import ParleyProtocol
@testable import ParleyServer
import Testing

/// The session table's rules, as values: no hub, no connection, no clock.
@Suite("Session table")
struct SessionTableTests {
    let phone = DeviceKey(user: "alice", device: "phone")
    let laptop = DeviceKey(user: "alice", device: "laptop")

    struct NotWelcomed: Error {}

    /// A hello that must be welcomed, and what it came to.
    func hello(_ table: inout SessionTable, _ key: DeviceKey, resume: ResumeRequest? = nil, on connection: UInt64,
               devicesPerUser: Int = 4) throws -> (session: String, resumed: Bool, created: Bool, replaced: UInt64?,
                                                   replay: [Session.Buffered]) {
        let outcome = table.hello(key, resume: resume, on: connection, devicesPerUser: devicesPerUser)
        guard case .welcomed(let session, let resumed, let created, let replaced, let replay) = outcome else { throw NotWelcomed() }
        return (session, resumed, created, replaced, replay)
    }

    @Test func aHelloResumesOnlyTheSessionItNamesAndReplaysWhatWasNotAcknowledged() throws {
        var table = SessionTable(bufferLimit: 8, answerLimit: 4)
        let first = try hello(&table, phone, on: 1)
        #expect(!first.resumed && first.created && first.replaced == nil)
        for text in ["a", "b", "c"] { _ = table.number(for: phone) { seq in "\(text)\(seq)" } }
        table.modify(phone) { $0.acknowledge(through: 1) }
        #expect(table[phone]?.buffer.map(\.seq) == [2, 3], "what the device has is let go")
        table.detach(phone, connection: 1, now: .seconds(10))
        #expect(table.expired(at: .seconds(69), window: .seconds(60)).isEmpty)
        #expect(table.expired(at: .seconds(70), window: .seconds(60)) == [phone])

        let resumed = try hello(&table, phone, resume: ResumeRequest(session: first.session, lastSeq: 2), on: 2)
        #expect(resumed.resumed && !resumed.created && resumed.session == first.session)
        #expect(resumed.replay == [Session.Buffered(seq: 3, text: "c3")])
        #expect(table.expired(at: .seconds(1000), window: .seconds(60)).isEmpty, "a session with a connection never expires")

        // Another session's id, or a seq the server never sent: a new session, the old one replaced.
        let wrong = try hello(&table, phone, resume: ResumeRequest(session: "someone-else", lastSeq: 3), on: 3)
        #expect(!wrong.resumed && !wrong.created && wrong.session != first.session && wrong.replaced == 2)
        let ahead = try hello(&table, phone, resume: ResumeRequest(session: wrong.session, lastSeq: 9), on: 4)
        #expect(!ahead.resumed && ahead.replaced == 3)
        #expect(table.count == 1)
    }

    @Test func aResumeFromBeforeWhatAFullBufferDroppedGetsANewSession() throws {
        var table = SessionTable(bufferLimit: 2, answerLimit: 4)
        let first = try hello(&table, phone, on: 1)
        for _ in 1...3 { _ = table.number(for: phone) { "frame \($0)" } }
        // The buffer holds its limit: after the first frame, nothing is lost.
        let inTime = try hello(&table, phone, resume: ResumeRequest(session: first.session, lastSeq: 1), on: 2)
        #expect(inTime.resumed && inTime.replay.map(\.seq) == [2, 3])
        let late = try hello(&table, phone, resume: ResumeRequest(session: first.session, lastSeq: 0), on: 3)
        #expect(!late.resumed && late.replay.isEmpty)
        #expect(table[phone]?.nextSeq == 1, "a new session numbers from 1")
    }

    @Test func aUserHasAtMostItsLimitOfDevicesAndARefusalChangesNothing() throws {
        var table = SessionTable(bufferLimit: 8, answerLimit: 4)
        _ = table.hello(phone, resume: nil, on: 1, devicesPerUser: 1)
        let refused = table.hello(laptop, resume: nil, on: 2, devicesPerUser: 1)
        #expect(refused == .refused(devices: 1))
        #expect(table[laptop] == nil && table.devices(of: "alice") == ["phone"])
        // The device that has a session may always come back.
        _ = try hello(&table, phone, on: 3, devicesPerUser: 1)
        // So may a new device once the old one's session has gone.
        _ = table.remove(phone)
        #expect(table.devices(of: "alice").isEmpty)
        #expect(try hello(&table, laptop, on: 4, devicesPerUser: 1).created)
    }

    @Test func onlyTheSessionsOwnConnectionHoldsItAndHeldSessionsAreNumberedButNotWritten() throws {
        var table = SessionTable(bufferLimit: 8, answerLimit: 4)
        _ = table.hello(phone, resume: nil, on: 1, devicesPerUser: 4)
        _ = table.hello(phone, resume: nil, on: 2, devicesPerUser: 4)
        table.detach(phone, connection: 1, now: .seconds(5))
        #expect(table.isConnected(phone), "the replaced connection's end leaves the new one in place")
        let live = table.number(for: phone) { "f\($0)" }
        #expect(live?.connection == 2)
        table.detach(phone, connection: 2, now: .seconds(5))
        let held = table.number(for: phone) { "f\($0)" }
        #expect(held?.connection == nil && held?.text == "f2")
        let none = table.number(for: laptop) { "f\($0)" }
        #expect(none == nil)
    }

    @Test func holdMakesASessionOnlyForADeviceThatHasNone() {
        var table = SessionTable(bufferLimit: 8, answerLimit: 4)
        let made = table.hold(phone, now: .seconds(1))
        let again = table.hold(phone, now: .seconds(2))
        #expect(made && !again)
        #expect(!table.isConnected(phone) && table.devices(of: "alice") == ["phone"])
        #expect(table.expired(at: .seconds(61), window: .seconds(60)) == [phone])
    }

    /// A session handed to another node (through JSON, as between nodes) goes on there as it would
    /// have here: a resume replays what was not acknowledged, numbering continues, remembered answers
    /// answer; and a node where the device has a session already does not take it.
    @Test func aHandedOverSessionResumesOnTheNodeThatAdoptsIt() throws {
        let codec = WireCodec()
        var old = SessionTable(bufferLimit: 8, answerLimit: 4)
        let first = try hello(&old, phone, on: 1)
        for text in ["a", "b", "c"] { _ = old.number(for: phone) { seq in "\(text)\(seq)" } }
        old.modify(phone) { $0.acknowledge(through: 1) }
        old.modify(phone) { $0.remember(.ack(Ack(re: "r1", result: .callState(CallStateResult(call: "6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f", state: .active)))), for: "r1") }
        let handover = try #require(old[phone]).handover { String(decoding: codec.encode(ServerFrame(seq: nil, message: $0)), as: UTF8.self) }
        let travelled = try JSONDecoder().decode(SessionHandover.self, from: JSONEncoder().encode(handover))

        var new = SessionTable(bufferLimit: 8, answerLimit: 4)
        #expect(new.adopt(travelled, now: .seconds(5)) { try? codec.decodeServerFrame($0).message })
        #expect(!new.isConnected(phone), "held for resume until the device's hello")
        #expect(new.expired(at: .seconds(65), window: .seconds(60)) == [phone])
        let resumed = try hello(&new, phone, resume: ResumeRequest(session: first.session, lastSeq: 1), on: 7)
        #expect(resumed.resumed && resumed.session == first.session && !resumed.created)
        #expect(resumed.replay == [Session.Buffered(seq: 2, text: "b2"), Session.Buffered(seq: 3, text: "c3")])
        #expect(new.number(for: phone) { "d\($0)" }?.text == "d4", "numbering goes on")
        #expect(new[phone]?.answer(for: "r1") == old[phone]?.answer(for: "r1"))

        var busy = SessionTable(bufferLimit: 8, answerLimit: 4)
        let own = try hello(&busy, phone, on: 1)
        #expect(!busy.adopt(travelled, now: .seconds(5)) { try? codec.decodeServerFrame($0).message })
        #expect(busy[phone]?.id == own.session, "its own session stays")
    }

    /// A request id runs once: a repeat while it runs waits for its answer, a repeat after gets the
    /// answer again; the answer ends it only in the session it came in, and is numbered like any frame.
    @Test func aRequestRunsOnceAndItsAnswerIsRememberedInItsOwnSession() throws {
        var table = SessionTable(bufferLimit: 8, answerLimit: 4)
        let own = try hello(&table, phone, on: 1)
        table.modify(phone) { $0.name = "Alice" }
        #expect(table.begin("r1", in: phone) == .started(name: "Alice", address: nil))
        #expect(table.begin("r1", in: phone) == .running)
        #expect(table.begin("r1", in: laptop) == nil, "no session, nothing runs")

        let answer = ServerMessage.ack(Ack(re: "r1"))
        #expect(table.answer("r1", with: answer, ifSession: "another", in: phone) { "a\($0)" } == nil)
        #expect(table.begin("r1", in: phone) == .running, "an answer for another session ends nothing")

        let frame = try #require(table.answer("r1", with: answer, ifSession: own.session, in: phone) { "a\($0)" })
        #expect(frame.text == "a1" && frame.connection == 1)
        #expect(table[phone]?.inFlight.isEmpty == true)
        #expect(table.begin("r1", in: phone) == .answered(answer))
        #expect(table.begin("r2", in: phone) == .started(name: "Alice", address: nil))
    }

    /// A session remembers the answers to its last `answerLimit` request ids (a retried id gets the
    /// same answer, not a second execution); older ones are forgotten, so memory stays bounded.
    @Test func rememberedAnswersAreBounded() {
        var session = Session(id: "s", key: phone, bufferLimit: 16, answerLimit: 3)
        for index in 1...5 { session.remember(.ack(Ack(re: "r\(index)")), for: "r\(index)") }
        #expect(session.answer(for: "r1") == nil && session.answer(for: "r2") == nil)
        #expect(session.answer(for: "r5") == .ack(Ack(re: "r5")))
        #expect([3, 4, 5].allSatisfy { session.answer(for: "r\($0)") != nil })
    }
}

/// A deployment secret is read back exactly, and anything else in its place is refused, not trusted.
@Suite("Deployment secrets")
struct DeploymentSecretTests {
    @Test func madeSecretsReadBackAndOthersAreRefused() throws {
        let made = DeploymentSecret.make()
        let bytes = try DeploymentSecret.read(made, name: "rooms")
        #expect(bytes.count == 32 && bytes.map { String(format: "%02x", $0) }.joined() == made)
        for bad in [nil, "", String(made.dropLast()), "+f" + made.dropFirst(2), "é" + made.dropFirst(2), made.uppercased() + "0"] {
            #expect(throws: DeploymentSecret.Unreadable.self) { try DeploymentSecret.read(bad, name: "rooms") }
        }
    }
}

/// The room table's rules, as values.
@Suite("Room table")
struct RoomTableTests {
    let alice = DeviceKey(user: "alice", device: "a1")
    let bob = DeviceKey(user: "bob", device: "b1")
    let carol = DeviceKey(user: "carol", device: "c1")

    @Test func joiningTellsTheMembersAndAnswersThemAndARepeatOnlyUpdatesTheDisplay() {
        var rooms = RoomTable()
        let first = rooms.admit(RoomJoin(id: "1", room: "r", display: "Alice"), by: alice)
        #expect(first.others.isEmpty && first.deliveries.isEmpty)
        let second = rooms.admit(RoomJoin(id: "2", room: "r", display: "Bob"), by: bob)
        #expect(second.others == [RoomParticipant(user: "alice", device: "a1", display: "Alice")])
        #expect(second.deliveries == [Delivery(to: alice, message: .roomParticipantJoined(RoomParticipantJoined(
            room: "r", participant: RoomParticipant(user: "bob", device: "b1", display: "Bob"))))])

        let again = rooms.admit(RoomJoin(id: "3", room: "r", display: "Alice A."), by: alice)
        #expect(again.deliveries.isEmpty)
        #expect(rooms.members(of: "r").map(\.display) == ["Alice A.", "Bob"])
        #expect(rooms.rooms(of: alice) == ["r"])
    }

    @Test func aDeviceIdOfAnotherUserAndAFullRoomAreRefused() throws {
        var rooms = RoomTable()
        _ = rooms.admit(RoomJoin(id: "1", room: "r"), by: alice)
        _ = rooms.admit(RoomJoin(id: "2", room: "r"), by: bob)
        let impostor = DeviceKey(user: "mallory", device: "a1")
        #expect(throws: ErrorMessage(code: .badRequest, message: "device a1 is already in the room under another user")) {
            try rooms.checkJoin("r", by: impostor, limit: 4)
        }
        #expect(throws: ErrorMessage(code: .roomFull, message: "room r is full (2 devices)")) {
            try rooms.checkJoin("r", by: carol, limit: 2)
        }
        // A member joining again is not a newcomer, however full the room is.
        try rooms.checkJoin("r", by: bob, limit: 2)
    }

    @Test func leavingTellsTheOthersAndTheLastOneOutForgetsTheRoom() throws {
        var rooms = RoomTable()
        _ = rooms.admit(RoomJoin(id: "1", room: "r"), by: alice)
        _ = rooms.admit(RoomJoin(id: "2", room: "r"), by: bob)
        let stranger = rooms.leave("r", by: carol)
        #expect(stranger == nil, "a device that is not in the room changes nothing")
        let aliceLeft = rooms.leave("r", by: alice)
        let left = try #require(aliceLeft)
        #expect(!left.isEmpty)
        #expect(left.deliveries == [Delivery(to: bob, message: .roomParticipantLeft(RoomParticipantLeft(room: "r", user: "alice",
                                                                                                          device: "a1")))])
        #expect(rooms.rooms(of: alice).isEmpty)
        let bobLeft = rooms.leave("r", by: bob)
        let last = try #require(bobLeft)
        #expect(last.isEmpty && last.deliveries.isEmpty && rooms.members(of: "r").isEmpty)
        #expect(rooms.count == 0, "forgotten")
    }

    @Test func signalsGoFromAMemberToAMemberOnly() throws {
        var rooms = RoomTable()
        _ = rooms.admit(RoomJoin(id: "1", room: "r"), by: alice)
        _ = rooms.admit(RoomJoin(id: "2", room: "r"), by: bob)
        let payload = SignalPayload(restartIce: true)
        let delivery = try rooms.signal(RoomSignal(id: "3", room: "r", to: "b1", signal: payload), from: alice)
        #expect(delivery == Delivery(to: bob, message: .roomSignal(RoomSignalled(room: "r", from: Party(user: "alice", device: "a1"),
                                                                                 signal: payload))))
        #expect(throws: ErrorMessage(code: .notInRoom, message: "this device is not in room r")) {
            try rooms.signal(RoomSignal(id: "4", room: "r", to: "b1", signal: payload), from: carol)
        }
        #expect(throws: ErrorMessage(code: .notFound, message: "device c1 is not in room r")) {
            try rooms.signal(RoomSignal(id: "5", room: "r", to: "c1", signal: payload), from: alice)
        }
    }
}

/// The call table's bookkeeping around the call state machine, as a value.
@Suite("Call table")
struct CallTableTests {
    let alice = DeviceKey(user: "alice", device: "a1")
    let phone = DeviceKey(user: "bob", device: "phone")
    let laptop = DeviceKey(user: "bob", device: "laptop")

    func call(_ id: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21", expiresAt: Int64 = 46_000) -> HubCall {
        var call = HubCall(id: id, caller: Party(user: "alice", device: "a1"), callee: "bob", media: .audioOnly,
                                    metadata: nil, createdAt: 1000, expiresAt: expiresAt)
        call.rang("phone")
        return call
    }

    @Test func anEventAnswersItsDeliveriesAndThePhaseItLeftAndAnEndedCallIsNoLongerLive() throws {
        var table = CallTable()
        let id = call().id
        table.insert(call())
        #expect(table.live(of: "alice") == [id] && table.live(of: "bob") == [id])
        let ringing = try #require(try table.apply(id, at: .seconds(1), wallClock: 1500) { call, _ throws(ErrorMessage) in
            try call.ringing(from: phone)
        })
        #expect(ringing.transition == nil && ringing.deliveries.map(\.to) == [alice])

        let accepted = try #require(try table.apply(id, at: .seconds(2), wallClock: 2000) { call, now throws(ErrorMessage) in
            try call.accept(from: phone, now: now)
        })
        #expect(accepted.transition?.from == .ringing && accepted.transition?.call.phase == .active)
        #expect(table.isInCall(phone) && !table.isInCall(laptop))

        // A refused event changes nothing.
        #expect(throws: ErrorMessage.self) {
            try table.apply(id, at: .seconds(3), wallClock: 3000) { call, now throws(ErrorMessage) in
                try call.hangup(from: DeviceKey(user: "mallory", device: "m"), detail: nil, now: now)
            }
        }
        #expect(table[id]?.phase == .active)

        let ended = try #require(try table.apply(id, at: .seconds(4), wallClock: 4000) { call, now throws(ErrorMessage) in
            try call.hangup(from: alice, detail: nil, now: now)
        })
        #expect(ended.transition?.from == .active && table[id]?.phase == .ended)
        #expect(table.live(of: "alice").isEmpty && table.live(of: "bob").isEmpty)
        #expect(try table.apply("00000000-0000-4000-8000-000000000000", at: .seconds(5), wallClock: 5000) { _, _ in [] } == nil)
    }

    @Test func endedCallsAreKeptForTheirRetentionAndUntilTheirRecordIsStored() throws {
        var table = CallTable()
        let id = call().id
        table.insert(call())
        _ = try table.apply(id, at: .seconds(10), wallClock: 2000) { call, now throws(ErrorMessage) in
            try call.hangup(from: alice, detail: nil, now: now)
        }
        table.evict(at: .seconds(69), retention: .seconds(60)) { _ in false }
        #expect(table[id] != nil)
        table.evict(at: .seconds(70), retention: .seconds(60)) { _ in true }
        #expect(table[id] != nil, "a call whose record is not stored yet stays")
        table.evict(at: .seconds(70), retention: .seconds(60)) { _ in false }
        #expect(table[id] == nil)
    }

    @Test func aLateDeviceRingsOnlyInCallsToItsUserThatStillRing() {
        var table = CallTable()
        table.insert(call(expiresAt: 46_000))
        table.insert(call("7f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21", expiresAt: 10_000))
        let rung = table.ring(laptop)
        #expect(rung.count == 2 && rung.allSatisfy { $0.rungDevices.contains("laptop") })
        #expect(table.ring(alice).isEmpty, "the caller's devices are not rung")
        #expect(table.ringing(expiredBy: 20_000) == ["7f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"])
    }
}

/// Where a node routes what is not for it alone, as a value: no hub, no PostgreSQL, no clock.
@Suite("Cluster routes")
struct ClusterRoutesTests {
    let phone = DeviceKey(user: "bob", device: "phone")
    let laptop = DeviceKey(user: "bob", device: "laptop")
    let call: CallID = "6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f"

    @Test func aDeviceIsWhereItWasLastClaimedAndOnlyItsHolderReleasesIt() {
        var routes = ClusterRoutes()
        routes.heard(phone, isOn: "n1")
        routes.heard(laptop, isOn: "n2")
        #expect(routes.remoteDevices(of: "bob") == ["phone", "laptop"])
        routes.claimed(phone, by: "n3")
        #expect(routes.holder(of: phone) == "n3")
        let byFormerHolder = routes.released(phone, by: "n1")
        #expect(!byFormerHolder, "a node that no longer holds it says nothing about it")
        #expect(routes.holder(of: phone) == "n3")
        let byHolder = routes.released(phone, by: "n3")
        #expect(byHolder)
        #expect(routes.holder(of: phone) == nil)
        routes.startedHere(laptop)
        #expect(routes.remoteDevices(of: "bob").isEmpty)
    }

    @Test func framesForAHandedOverSessionGoOnToWhereverItIsNow() {
        var routes = ClusterRoutes()
        #expect(routes.sendOn(phone) == nil)
        routes.handedOver(phone, to: "n2")
        #expect(routes.sendOn(phone) == "n2" && routes.holder(of: phone) == "n2")
        routes.claimed(phone, by: "n3")
        #expect(routes.sendOn(phone) == "n3", "it moved on again")
        let ended = routes.released(phone, by: "n3")
        #expect(ended)
        #expect(routes.sendOn(phone) == nil, "its session ended: nothing to send on")
        routes.handedOver(phone, to: "n2")
        routes.startedHere(phone)
        #expect(routes.sendOn(phone) == nil, "back here")
    }

    @Test func aCallsNodeIsWhatItsFramesSaidUntilItEnds() {
        var routes = ClusterRoutes()
        let party = Party(user: "alice", device: "a1")
        routes.heard(.callSignal(CallSignalled(call: call, from: party, signal: SignalPayload(restartIce: true))), from: "n1", for: phone)
        #expect(routes.owner(of: call) == "n1")
        // Taken over: its frames now come from another node, which runs it from then on.
        routes.heard(.callSignal(CallSignalled(call: call, from: party, signal: SignalPayload(restartIce: true))), from: "n2", for: phone)
        #expect(routes.owner(of: call) == "n2")
        routes.heard(.callEnded(CallEnded(call: call, reason: .hangup, endedAt: 1)), from: "n2", for: phone)
        #expect(routes.owner(of: call) == nil)
        routes.heard(.callSignal(CallSignalled(call: call, from: party, signal: SignalPayload(restartIce: true))), from: "n2", for: phone)
        #expect(routes.owner(of: call) == "n2")
        routes.forgetOwner(of: call)
        #expect(routes.owner(of: call) == nil)
    }

    /// A call another node runs that a device here was rung for, or answered: the requests that
    /// node could refuse only because the call ended go there unanswered (a ringing of a device it
    /// rang; a signal or update, not a recording step, of the device that answered), until the
    /// call ends for the device (not for another device of its user), its frames come from another
    /// node, its node falls silent or leaves, or the device's session here goes.
    @Test func aCallsPartsHereAreKnownUntilTheCallEndsOrMoves() {
        var routes = ClusterRoutes()
        let tablet = DeviceKey(user: "bob", device: "tablet")
        let incoming = ServerMessage.callIncoming(CallIncoming(call: call, from: Party(user: "alice", device: "a1"), media: .audioOnly, expiresAt: 1))
        let signalled = ServerMessage.callSignal(CallSignalled(call: call, from: Party(user: "alice", device: "a1"), signal: SignalPayload(restartIce: true)))
        let ended = ServerMessage.callEnded(CallEnded(call: call, reason: .hangup, endedAt: 1))
        let ringing = ClientMessage.callRinging(CallRingingRequest(id: "1", call: call, early: true))
        let signal = ClientMessage.callSignal(CallSignal(id: "2", call: call, signal: SignalPayload(restartIce: true)))
        let muted = ClientMessage.callUpdate(CallUpdate(id: "3", call: call, muted: true))
        let recording = ClientMessage.callUpdate(CallUpdate(id: "4", call: call, recording: .requested))
        let hangup = ClientMessage.callHangup(CallHangup(id: "5", call: call))
        func unanswered(_ messages: [ClientMessage], by key: DeviceKey) -> [NodeID?] { messages.map { routes.unanswered($0, about: call, by: key) } }

        #expect(unanswered([ringing, signal], by: phone) == [nil, nil], "nothing heard of the call")
        routes.heard(incoming, from: "n1", for: phone)
        routes.heard(incoming, from: "n1", for: tablet)
        #expect(unanswered([ringing, signal, muted, hangup], by: phone) == ["n1", nil, nil, nil], "rung: its ringing only")
        routes.answered(call, by: phone, on: "n1")
        #expect(unanswered([ringing, signal, muted, recording, hangup], by: phone) == ["n1", "n1", "n1", nil, nil], "answered")
        #expect(routes.node(of: call, partOf: phone) == "n1")
        routes.heard(.callEnded(CallEnded(call: call, reason: .answeredElsewhere, endedAt: 1)), from: "n1", for: tablet)
        #expect(unanswered([ringing], by: tablet) == [nil], "the tablet's part ended")
        routes.heard(signalled, from: "n1", for: phone)
        #expect(unanswered([signal], by: phone) == ["n1"], "the end of another device's part is not the phone's")
        routes.heard(ended, from: "n1", for: phone)
        #expect(unanswered([ringing, signal], by: phone) == [nil, nil], "the call's end")
        #expect(routes.node(of: call, partOf: phone) == nil)

        routes.answered(call, by: phone, on: "n1")
        routes.heard(signalled, from: "n2", for: phone)
        #expect(routes.node(of: call, partOf: phone) == nil, "the call runs on another node now")
        routes.answered(call, by: phone, on: "n1")
        routes.forgetOwner(of: call)
        #expect(routes.node(of: call, partOf: phone) == nil, "its node fell silent")
        routes.answered(call, by: phone, on: "n1")
        routes.sessionGone(phone)
        #expect(routes.node(of: call, partOf: phone) == nil, "the device's session here went")
        routes.answered(call, by: phone, on: "n1")
        _ = routes.nodeLeft("n1")
        #expect(routes.node(of: call, partOf: phone) == nil, "its node left")
        #expect(routes.answered(NodeMessage.unanswered) == nil, "no wait answers to an unanswered request's id")
    }

    @Test func waitsEndOnceByAnswerDeadlineOrTheirNodeLeaving() {
        var routes = ClusterRoutes()
        let forward = routes.wait(.forward, on: "n1", until: .seconds(5))
        let handover = routes.wait(.handover, on: "n2", until: .seconds(2))
        let other = routes.wait(.forward, on: "n2", until: .seconds(9))
        #expect(Set([forward, handover, other]).count == 3)
        let early = routes.due(at: .seconds(1))
        #expect(early.isEmpty)
        let due = routes.due(at: .seconds(2))
        #expect(due.map(\.id) == [handover])
        let late = routes.answered(handover)
        #expect(late == nil, "ended at its deadline: a late answer finds nothing")
        let answer = routes.answered(forward)
        #expect(answer == .forward)
        let again = routes.answered(forward)
        #expect(again == nil, "answered once")
        routes.heard(phone, isOn: "n2")
        let left = routes.nodeLeft("n2")
        #expect(left.devices == [phone])
        #expect(left.waits.map(\.id) == [other])
        #expect(routes.holder(of: phone) == nil)
        let rest = routes.due(at: nil)
        #expect(rest.isEmpty)
    }

    /// The joins to make again when a node goes away: those of devices held here in rooms that
    /// node ran, once each, with what the last join said and the participant its ack named; none
    /// for a room left, joined anew, or of a device whose session here ended or moved.
    @Test func roomsElsewhereAreJoinedAgainOnlyWhenTheirNodeLeaves() {
        var routes = ClusterRoutes()
        let tablet = DeviceKey(user: "alice", device: "a2"), laptop = DeviceKey(user: "bob", device: "b1")
        routes.joined(RoomJoin(id: "1", room: "lobby", display: "Alice", participant: 7), by: phone, on: "n1")
        routes.joined(RoomJoin(id: "2", room: "lobby", display: "Alice!", participant: 8), by: phone, on: "n1")
        routes.joined(RoomJoin(id: "3", room: "standup", display: "Alice"), by: phone, on: "n2")
        routes.joined(RoomJoin(id: "4", room: "lobby"), by: tablet, on: "n1")
        routes.joined(RoomJoin(id: "5", room: "lobby"), by: laptop, on: "n1")
        routes.joined(RoomJoin(id: "6", room: "yard"), by: laptop, on: "n1")
        routes.left("yard", by: laptop)
        routes.sessionGone(tablet)
        routes.admitted(9, to: "lobby", by: phone, on: "n1")
        routes.admitted(10, to: "lobby", by: phone, on: "n2")  // not where phone joined it: nothing
        routes.left("standup", by: phone, on: "n1")  // joined on n2: nothing
        let left = routes.nodeLeft("n1")
        #expect(left.rejoins.map(\.key) == [laptop, phone], "in the order of the devices")
        #expect(left.rejoins.map(\.join.id) == ["5", "2"], "the last join of each room, and not a room left")
        #expect(left.rejoins.last?.join.participant == 9, "the participant its node's ack named")
        #expect(routes.nodeLeft("n1").rejoins.isEmpty, "once")
        #expect(routes.nodeLeft("n2").rejoins.map(\.join.room) == ["standup"])
    }
}

/// The compact lines of the node messages a call setup sends most (`NodeLine`).
@Suite("Compact node lines")
struct NodeLineTests {
    let bob = DeviceKey(user: "bob", device: "b1:phone")
    let call: CallID = "6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f"

    @Test func theHotMessagesReadBackAsTheyWereWithTheirFramesAsIs() throws {
        let frame = #"{"call":"6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f","sdp":"v=0 a b\r\n","type":"call.signal","x":"é \" \\ "}"#
        let messages: [NodeMessage] = [
            .deliver(to: bob, frame: frame, from: "n-1", about: DeliveredFrame(type: "call.signal", call: call)),
            .deliver(to: bob, frame: "{}", from: "n-1", about: DeliveredFrame(type: "room.signal", call: nil)),
            .request(id: 42, from: "n-2", sender: bob, frame: frame),
            .reply(id: 7, result: .done, error: nil),
        ]
        for message in messages {
            let line = try #require(NodeLine.compact(message), "\(message)")
            #expect(!line.contains("\n"))
            #expect(!line.hasPrefix("{"), "not taken for JSON")
            #expect(NodeLine.parse(line[...]) == message)
        }
        #expect(NodeLine.compact(messages[0])?.hasSuffix(frame) == true, "the frame is carried as it is, not escaped")
    }

    @Test func whatDoesNotFitTheFormGoesAsJSON() {
        #expect(NodeLine.compact(.request(id: 1, from: "n", sender: bob, frame: "{\n\"type\":\"ping\"}")) == nil, "a newline would end the line")
        #expect(NodeLine.compact(.deliver(to: bob, frame: "{}", from: "n")) == nil, "no word on what it is (an older sender)")
        #expect(NodeLine.compact(.reply(id: 1, result: nil, error: ErrorMessage(code: .callNotFound, message: "no"))) == nil)
        #expect(NodeLine.compact(.reply(id: 1, result: .fields(["x": .bool(true)]), error: nil)) == nil)
        #expect(NodeLine.compact(.left("n")) == nil)
    }

    @Test func malformedLinesAreNotRead() {
        for line in ["D bob", "D bob b1 n t - ", "D bad/user b1 n t - {}", "D bob b1 n t not-a-call {}", "Q x n bob b1 {}",
                     "Q 1 n bob", "A", "A x", "A 1 2", "X 1", "{\"left\":{}}", ""] {
            #expect(NodeLine.parse(line[...]) == nil, "\(line)")
        }
    }
}
