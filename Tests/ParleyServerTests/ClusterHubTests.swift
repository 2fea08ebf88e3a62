import Foundation
import NIOConcurrencyHelpers
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import ParleyTesting
import Testing

/// Hubs of one deployment in memory (`InMemoryDeployment`: the directory and mailboxes PostgreSQL
/// keeps, under the same rules): what crosses nodes, tested in milliseconds. `ClusterTests` runs the
/// same rules on real nodes and a real PostgreSQL.
@Suite("Several hubs in memory")
struct ClusterHubTests {
    let call: CallID = "7a1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f"

    /// `olderBuild`: the indices of the nodes the others count as of an older build.
    func nodes(_ count: Int = 2, olderBuild: Set<Int> = []) throws -> (InMemoryDeployment, [HubHarness]) {
        let store = try SQLiteStore(path: nil)
        let deployment = InMemoryDeployment(sharing: store)
        let clock = ManualClock()
        let hubs = (0..<count).map {
            HubHarness(node: deployment.join(olderBuild: olderBuild.contains($0)), of: deployment, store: store, clock: clock)
        }
        return (deployment, hubs)
    }

    /// A node with a hub, and a node without one, whose messages the test reads and sends itself.
    func nodeAndAPeer() throws -> (hub: HubHarness, node: InMemoryDeployment.Node, peer: InMemoryDeployment.Node) {
        let store = try SQLiteStore(path: nil)
        let deployment = InMemoryDeployment(sharing: store)
        let node = deployment.join()
        return (HubHarness(node: node, of: deployment, store: store, clock: ManualClock()), node, deployment.join())
    }

    /// Waits for a frame the device has not read yet.
    func heard<T>(_ device: TestDevice, _ what: String, _ match: @escaping (ServerMessage) -> T?) async throws -> T {
        var found: T?
        try await eventually(timeout: .seconds(5), what) {
            device.pending += device.sink.take()
            guard let index = device.pending.firstIndex(where: { match($0.message) != nil }) else { return false }
            found = match(device.pending.remove(at: index).message)
            return true
        }
        return try #require(found)
    }

    @Test func aCallAcrossTwoNodesRingsAnswersAndEnds() async throws {
        let (_, hubs) = try nodes()
        let alice = await hubs[0].device("alice", "a1")
        let bob = await hubs[1].device("bob", "b1")
        let invited = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        #expect(try invited.get().decodeResult(CallInviteResult.self).devices == 1, "bob's device on the other node rings")
        _ = try await heard(bob, "bob is rung") { if case .callIncoming(let m) = $0 { m } else { nil } }
        #expect(await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess, "forwarded to the call's node")
        _ = try await heard(alice, "alice hears the accept") { if case .callAccepted(let m) = $0 { m } else { nil } }
        #expect(await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        let ended = try await heard(bob, "bob hears the end") { if case .callEnded(let m) = $0 { m } else { nil } }
        #expect(ended.reason == .hangup)
    }

    /// Bob's phone on the second node rings, answers, sends three candidates and a mute in a call
    /// that runs on the first node, where alice hears them in the order sent; his tablet is rung and
    /// then told the call was answered elsewhere. Answers the requests and replies that crossed
    /// nodes meanwhile, in the order sent ("unanswered call.ringing", "answered call.accept", "reply", …).
    func bobAnswersAndSignals(_ hubs: [HubHarness], in deployment: InMemoryDeployment)
        async throws -> (alice: TestDevice, bob: TestDevice, tablet: TestDevice, crossed: [String]) {
        let alice = await hubs[0].device("alice", "a1")
        let bob = await hubs[1].device("bob", "b1")
        let tablet = await hubs[1].device("bob", "b2")
        let before = deployment.sent.count
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = try await heard(bob, "bob is rung") { if case .callIncoming(let m) = $0 { m } else { nil } }
        _ = try await heard(tablet, "the tablet is rung") { if case .callIncoming(let m) = $0 { m } else { nil } }
        #expect(await bob.request { .callRinging(CallRingingRequest(id: $0, call: call)) }.isSuccess)
        _ = try await heard(alice, "alice hears bob's ringing") { if case .callRinging(let m) = $0 { m } else { nil } }
        #expect(await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        _ = try await heard(alice, "alice hears the accept") { if case .callAccepted(let m) = $0 { m } else { nil } }
        _ = try await heard(tablet, "the tablet stops ringing") { if case .callEnded(let m) = $0 { m } else { nil } }

        let candidates = (0..<3).map { IceCandidate(candidate: "candidate:\($0) 1 udp 2122260223 198.51.100.2 5000\($0) typ host") }
        for candidate in candidates {
            #expect(await bob.request { .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(candidate: .candidate(candidate)))) }.isSuccess)
        }
        #expect(await bob.request { .callUpdate(CallUpdate(id: $0, call: call, muted: true)) }.isSuccess)
        var heardCandidates: [String] = []
        for _ in candidates {
            heardCandidates.append(try await heard(alice, "alice hears bob's candidates") {
                if case .callSignal(let m) = $0, case .candidate(let c) = m.signal.candidate { c.candidate } else { nil }
            })
        }
        #expect(heardCandidates == candidates.map(\.candidate), "in the order sent")
        let update = try await heard(alice, "alice hears bob's update") { if case .callUpdated(let m) = $0 { m } else { nil } }
        #expect(update.muted == true && update.from.device == "b1")
        let crossed = deployment.sent.dropFirst(before).compactMap { sent -> String? in
            switch sent.message {
            case .request(let id, _, _, let frame):
                "\(id == NodeMessage.unanswered ? "unanswered" : "answered") \((try? WireCodec().decodeClientMessage(frame))?.type ?? frame)"
            case .reply: "reply"
            default: nil
            }
        }
        return (alice, bob, tablet, crossed)
    }

    /// Only bob's accept waits for the call's node's answer: his ringing, and once he has answered
    /// his signals and updates, cross once each, acknowledged by his own node. His tablet, which did
    /// not answer, is still asked of the call's node and refused there; after the end, so is the
    /// device that answered.
    @Test func onlyTheAcceptOfACallOnAnotherNodeWaitsForItsAnswer() async throws {
        let (deployment, hubs) = try nodes()
        let (alice, bob, tablet, crossed) = try await bobAnswersAndSignals(hubs, in: deployment)
        #expect(crossed == ["unanswered call.ringing", "answered call.accept", "reply"]
                    + Array(repeating: "unanswered call.signal", count: 3) + ["unanswered call.update"],
                "one reply came back: the accept's")

        #expect(await tablet.request { .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(restartIce: true))) }.errorCode == .forbidden,
                "a device that did not answer is refused by the call's node")
        #expect(await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        _ = try await heard(bob, "bob hears the end") { if case .callEnded(let m) = $0 { m } else { nil } }
        #expect(await bob.request { .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(restartIce: true))) }.errorCode == .callEnded,
                "after the end, asked of the call's node again")
    }

    /// During a rolling upgrade: a call's node of an older build, which may run requests sent
    /// unanswered out of order, is sent every request for an answer. (That each goes only after the
    /// last one's answer is the endpoint's doing, which reads a device's next frame once the hub has
    /// answered the last; the devices here wait for each answer themselves, so ClusterTests sees it.)
    @Test func aCallsNodeOfAnOlderBuildIsSentEveryRequestForAnAnswer() async throws {
        let (deployment, hubs) = try nodes(olderBuild: [0])
        let (_, _, _, crossed) = try await bobAnswersAndSignals(hubs, in: deployment)
        let requests = ["call.ringing", "call.accept", "call.signal", "call.signal", "call.signal", "call.update"]
        #expect(crossed == requests.flatMap { ["answered \($0)", "reply"] }, "each for an answer, and answered")
    }

    /// What a device sends unanswered reaches the call's node in the order sent, however fast it
    /// comes: an answer's candidates must not overtake it (a browser refuses a candidate before the
    /// description it belongs to). Each request another node forwards for an answer runs in a task
    /// of its own there; these must not.
    @Test func requestsSentOnUnansweredRunInTheOrderSent() async throws {
        let (_, hubs) = try nodes()
        let alice = await hubs[0].device("alice", "a1")
        let bob = await hubs[1].device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = try await heard(bob, "bob is rung") { if case .callIncoming(let m) = $0 { m } else { nil } }
        #expect(await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        let sent = (0..<300).map { "v=0 \($0)" }
        for sdp in sent {
            #expect(await bob.request {
                .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(description: SessionDescription(type: "answer", sdp: sdp))))
            }.isSuccess)
        }
        var received: [String] = []
        try await eventually(timeout: .seconds(5), "alice hears every signal") {
            alice.pending += alice.sink.take()
            received = alice.pending.compactMap { if case .callSignal(let m) = $0.message { m.signal.description?.sdp } else { nil } }
            return received.count == sent.count
        }
        #expect(received == sent, "in the order sent")
    }

    /// A request sent on unanswered runs on the node that gets it, and nothing is sent back, even
    /// when it is refused; the node's next request is answered as ever.
    @Test func aRequestSentOnUnansweredIsRunAndNotAnswered() async throws {
        // The node without a hub sends the requests, as bob's node would.
        let (harness, node, other) = try nodeAndAPeer()
        var replies = other.messages.makeAsyncIterator()
        let alice = await harness.device("alice", "a1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        let bob = DeviceKey(user: "bob", device: "b1")
        func request(_ id: UInt64, _ message: ClientMessage) {
            let frame = String(decoding: WireCodec().encode(message), as: UTF8.self)
            other.send(.request(id: id, from: other.node, sender: bob, frame: frame), to: node.node)
        }
        let unknown: CallID = "00000000-4a5b-4c6d-8e7f-9a0b1c2d3e4f"
        request(NodeMessage.unanswered, .callSignal(CallSignal(id: "s1", call: unknown, signal: SignalPayload(restartIce: true))))
        request(NodeMessage.unanswered, .callRinging(CallRingingRequest(id: "r1", call: call)))
        request(7, .callState(CallRequest(id: "q1", call: call)))
        guard case .reply(let id, let result, _) = await replies.next() else { Issue.record("no reply"); return }
        #expect(id == 7, "the first thing sent back answers the request that asked for an answer")
        #expect(try result?.decoded(as: CallStateResult.self).state == .ringing)
        _ = try await heard(alice, "the unanswered ringing ran") { if case .callRinging(let m) = $0 { m } else { nil } }
    }

    /// Two nodes whose hubs write their calls through `FailingCallWrites` in front of the deployment's store.
    func nodesFailingCallWrites() throws -> (FailingCallWrites, [HubHarness], SQLiteStore) {
        let sqlite = try SQLiteStore(path: nil)
        let deployment = InMemoryDeployment(sharing: sqlite)
        let writes = FailingCallWrites(deployment.store)
        let clock = ManualClock()
        return (writes, (0..<2).map { _ in HubHarness(node: deployment.join(), store: sqlite, hubStore: writes, clock: clock) }, sqlite)
    }

    /// A new call is in the store before any other node hears of it: one that cannot be stored is
    /// refused ("try again") and rings no one, and leaves nothing behind; once the store takes writes
    /// again, the same invite rings.
    @Test func aNewCallThatCannotBeStoredIsRefusedAndRingsNoOne() async throws {
        let (writes, hubs, sqlite) = try nodesFailingCallWrites()
        let alice = await hubs[0].device("alice", "a1")
        let bob = await hubs[1].device("bob", "b1")
        writes.failing = .refusing
        let refused = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        #expect(refused.errorCode == .unavailable)
        #expect(try await sqlite.call(call) == nil, "nothing stored")
        writes.failing = .no
        let invited = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        #expect(try invited.get().decodeResult(CallInviteResult.self).devices == 1)
        _ = try await heard(bob, "bob is rung") { if case .callIncoming(let m) = $0 { m } else { nil } }
        // The node's messages arrive in order, and the end follows every ring: a ring of the
        // refused invite would be among what bob has heard by then.
        #expect(await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        _ = try await heard(bob, "bob hears the end") { if case .callEnded(let m) = $0 { m } else { nil } }
        #expect(!bob.pending.contains { if case .callIncoming = $0.message { true } else { false } },
                "rung once, by the invite that was stored")
    }

    /// A new call stored although its invite was refused (the store's answer lost on the way back):
    /// the same invite sent again from the same device rings it, and the call goes on; from another
    /// of the caller's devices, or to another callee, the id stays taken.
    @Test func anInviteSentAgainAfterItsStoredAnswerWasLostRings() async throws {
        let (writes, hubs, sqlite) = try nodesFailingCallWrites()
        let alice = await hubs[0].device("alice", "a1")
        let otherPhone = await hubs[0].device("alice", "a2")
        let bob = await hubs[1].device("bob", "b1")
        writes.failing = .losingAnswers
        let lost = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        #expect(lost.errorCode == .unavailable)
        #expect(try await sqlite.call(call) != nil, "stored all the same")
        writes.failing = .no
        #expect(await otherPhone.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.errorCode == .badRequest)
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "carol")) }.errorCode == .badRequest)
        let video = MediaSpec(audio: true, video: true)
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob", media: video)) }.errorCode == .badRequest)
        let again = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        #expect(try again.get().decodeResult(CallInviteResult.self).devices == 1, "rung by the invite sent again")
        _ = try await heard(bob, "bob is rung") { if case .callIncoming(let m) = $0 { m } else { nil } }
        #expect(await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess, "and the call goes on")
        _ = try await heard(alice, "alice hears the accept") { if case .callAccepted(let m) = $0 { m } else { nil } }
    }

    /// The handover (`NodeMessage.handover`): bob resumes on the other node with what he had not
    /// acknowledged, and a request he repeats there is answered from memory.
    @Test func aSessionResumedOnAnotherNodeIsHandedOver() async throws {
        let (deployment, hubs) = try nodes()
        let alice = await hubs[0].device("alice", "a1")
        let bob = await hubs[0].device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = try await heard(bob, "bob is rung") { if case .callIncoming(let m) = $0 { m } else { nil } }
        let accept = CallRequest(id: "accept-1", call: call)
        await bob.send(.callAccept(accept))
        let session = try #require(bob.welcome?.session)
        await bob.disconnect()

        let moved = await hubs[1].device("bob", "b1", resume: ResumeRequest(session: session, lastSeq: 0))
        #expect(moved.welcome?.resumed == true)
        let (there, here) = (await hubs[0].hub.isPresent("bob"), await hubs[1].hub.isPresent("bob"))
        #expect(!there && here, "the first node let the session go")
        let replayed = moved.events()
        #expect(replayed.contains { if case .callIncoming = $0 { true } else { false } }, "the ring, never acknowledged")
        #expect(replayed.contains { if case .ack(let ack) = $0 { ack.re == accept.id } else { false } }, "and the accept's answer")
        // Run again, the accept would be forwarded to the call's node, which answers the device that
        // answered with the same success: only what crosses tells the two apart.
        let crossed = deployment.sent.count
        await moved.send(.callAccept(accept))
        #expect(moved.events().contains { if case .ack(let ack) = $0 { ack.re == accept.id } else { false } },
                "the same id again: answered")
        #expect(deployment.sent.count == crossed, "from memory, here: nothing forwarded to the call's node")
    }

    /// A node stops while work it handed itself waits for another node's answer: a device held
    /// here was in a room of a node that left, and joins again where the room runs, on a node that
    /// does not answer. The hub's `run()` returns all the same. Only a sweep ended such a wait, and
    /// the sweeps stop with `run()`, which waits for that work: in CI a node stayed in its stop for
    /// good after PostgreSQL restarted under it.
    @Test func aNodeStopsWhileARejoinWaitsForASilentNode() async throws {
        // The node without a hub runs the room: the test answers for it, once.
        let (stopping, node, roomNode) = try nodeAndAPeer()
        #expect(try await roomNode.roomOwner("r1", claim: true) == roomNode.node)
        let forwarded = NIOLockedValueBox<[(id: UInt64, frame: String)]>([])
        let reading = Task {
            for await message in roomNode.messages {
                if case .request(let id, _, _, let frame) = message { forwarded.withLockedValue { $0.append((id, frame)) } }
            }
        }
        defer { reading.cancel() }

        let bob = await stopping.device("bob", "b1")
        async let joined = bob.request { .roomJoin(RoomJoin(id: $0, room: "r1")) }
        try await eventually(timeout: .seconds(5), "the join forwarded to the room's node") { forwarded.withLockedValue { $0.count == 1 } }
        roomNode.send(.reply(id: forwarded.withLockedValue { $0[0].id }, result: .done, error: nil), to: node.node)
        #expect(await joined.isSuccess)

        // Told that the room's node left: bob joins again where the room runs, the same node still.
        roomNode.send(.left(roomNode.node), to: node.node)
        try await eventually(timeout: .seconds(5), "the join made again") { forwarded.withLockedValue { $0.count == 2 } }
        #expect(forwarded.withLockedValue { $0[1].frame }.contains("room.join"))

        try await stopping.stopRunning()
    }

    /// The in-memory directory and mailboxes themselves, under `PostgresCluster`'s rules.
    @Test func theDeploymentTellsThePreviousHolderAndTheCallsNodeAndDeliversInOrder() async throws {
        let deployment = InMemoryDeployment(sharing: try SQLiteStore(path: nil))
        let (one, two, three) = (deployment.join(), deployment.join(), deployment.join())
        let bob = DeviceKey(user: "bob", device: "b1")
        one.holds(bob, true)
        #expect(try await two.remoteDevices(of: "bob") == [bob: one.node])
        #expect(try await one.remoteDevices(of: "bob").isEmpty, "a node's own devices are not remote")
        // A call of bob's runs on the third node.
        let record = CallRecord(call: call, caller: "alice", callee: "bob", callerDevice: "a1", media: .audioOnly, createdAt: 1)
        try await deployment.store.saveCalls([StoredCall(record: record, expiresAt: 2, owner: three.node)])
        #expect(try await one.owner(of: call) == three.node)

        two.holds(bob, true)
        var heardByOne = one.messages.makeAsyncIterator()
        var heardByThree = three.messages.makeAsyncIterator()
        #expect(await heardByOne.next() == .claimed(bob, by: two.node), "the node that held bob lets him go")
        #expect(await heardByThree.next() == .claimed(bob, by: two.node), "the node running his call delivers to the new one")
        for index in 0..<3 { two.send(.deliver(to: bob, frame: "\(index)", from: two.node), to: three.node) }
        for index in 0..<3 { #expect(await heardByThree.next() == .deliver(to: bob, frame: "\(index)", from: two.node)) }

        // The call's node dies: the others notice, and the first to ask takes the call over.
        deployment.crash(three)
        var departures = one.departures.makeAsyncIterator()
        #expect(await departures.next() == three.node)
        #expect(try await one.owner(of: call) == nil)
        #expect(try await one.adopt(nil).map(\.record.call) == [call])
        #expect(try await two.adopt(nil).isEmpty, "taken over once")
        two.leave()
        #expect(await heardByOne.next() == .left(two.node))
        #expect(try await one.remoteDevices(of: "bob").isEmpty)
    }
}
