import Crypto
import Foundation
import Logging
import NIOConcurrencyHelpers
import ParleyJanus
import ParleyLocalServices
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import Testing

/// Protocol v1, "Restarts and several nodes": real servers on one real PostgreSQL, devices on
/// different nodes, over real WebSockets.
@Suite("Several nodes on one PostgreSQL", .serialized, .timeLimit(.minutes(5)))
struct ClusterTests {
    let call: CallID = "6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f"

    /// Two nodes on a fresh database; stopped, and the database removed, after `body`. Node `i`
    /// sends by `buses[i]` (direct links by default, as `parley serve`).
    func withNodes(_ count: Int = 2, buses: [NodeBus] = [.direct], configure: (inout ServerConfiguration) -> Void = { _ in },
                   _ body: ([LiveServer], TestDatabase) async throws -> Void) async throws {
        guard TestDatabase.canRun(.postgres, "cluster tests") else { return }
        let database = try await TestDatabase(.postgres)
        defer { database.close() }
        var nodes: [LiveServer] = []
        do {
            for index in 0..<count {
                nodes.append(try await LiveServer.start(databasePath: database.setting) {
                    configure(&$0)
                    $0.nodeBus = buses[index % buses.count]
                })
            }
            try await body(nodes, database)
        } catch {
            for node in nodes { try? await node.stop() }
            throw error
        }
        for node in nodes { try? await node.stop() }
    }

    /// Two nodes whose rooms are AudioBridge rooms on one real Janus (started, and stopped after `body`).
    func withJanusNodes(emptyRoomGrace: Duration? = nil, _ body: ([LiveServer], JanusServer) async throws -> Void) async throws {
        guard JanusAvailability.enabled else { return }
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        try await withNodes(configure: {
            $0.janus = JanusSettings(url: janus.url)
            if let emptyRoomGrace { $0.janus?.emptyRoomGrace = emptyRoomGrace }
        }) { nodes, _ in try await body(nodes, janus) }
    }

    static func incoming(_ frame: ServerFrame) -> CallIncoming? {
        if case .callIncoming(let message) = frame.message { message } else { nil }
    }

    static func ended(_ frame: ServerFrame) -> CallEnded? {
        if case .callEnded(let message) = frame.message { message } else { nil }
    }

    /// Sends `sdps` as the call's signals back to back (`<ids>-<index>`, answers left unread), and
    /// returns the descriptions `receiver` hears, in the order it hears them.
    func signalBackToBack(_ sdps: [String], _ type: String, ids: String, from sender: WSTestClient,
                          to receiver: WSTestClient) async throws -> [String] {
        for (index, sdp) in sdps.enumerated() {
            sender.send(.callSignal(CallSignal(id: "\(ids)-\(index)", call: call,
                                               signal: SignalPayload(description: SessionDescription(type: type, sdp: sdp)))))
        }
        var heard: [String] = []
        for _ in sdps {
            heard.append(try await receiver.expect { if case .callSignal(let m) = $0.message { m.signal.description?.sdp } else { nil } })
        }
        return heard
    }

    /// Alice on the first node invites bob on the second, and bob is rung: the call runs on the
    /// first node, and its frames have reached the second.
    func aliceRingsBob(_ nodes: [LiveServer], in database: TestDatabase) async throws -> (alice: WSTestClient, bob: WSTestClient) {
        let alice = try await nodes[0].device("alice", "a1")
        let bob = try await nodes[1].device("bob", "b1")
        try await published(1, devicesOf: "bob", in: database)
        #expect(try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
        _ = try await bob.expect(Self.incoming)
        return (alice, bob)
    }

    /// Waits until the nodes have published where `user`'s `count` devices are (presence rows go
    /// out in batches, a moment after the hello).
    func published(_ count: Int, devicesOf user: UserID, in database: TestDatabase) async throws {
        try await eventually("\(count) devices of \(user) in cluster_device") {
            try database.postgres?.psql("SELECT count(*) FROM cluster_device WHERE user_id = '\(user)'", database: database.name) == "\(count)"
        }
    }

    /// Node a's bus, then b's: direct links both ways, `NOTIFY` both ways, and one of each (a node
    /// on `NOTIFY` publishes no address, so the direct node sends to it by `NOTIFY` too).
    static let buses: [[NodeBus]] = [[.direct, .direct], [.postgres, .postgres], [.direct, .postgres]]

    @Test(arguments: buses)
    func aCallAcrossNodesRingsEveryDeviceAndTheFirstAcceptWins(buses: [NodeBus]) async throws {
        try await withNodes(buses: buses) { nodes, database in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1", name: "Alice")
            let bobPhone = try await b.device("bob", "b1")
            let bobLaptop = try await a.device("bob", "b2")
            try await published(2, devicesOf: "bob", in: database)

            let invited = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
                .decodeResult(CallInviteResult.self)
            #expect(invited.devices == 2, "bob's phone on the other node rings too")
            let rung = try await bobPhone.expect(Self.incoming)
            #expect(rung.from.user == "alice")
            #expect(rung.from.name == "Alice")
            _ = try await bobLaptop.expect(Self.incoming)

            // The phone, on the node that does not run the call, answers first: it wins there.
            #expect(try await bobPhone.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
            _ = try await alice.expect { if case .callAccepted(let m) = $0.message { m } else { nil } }
            let elsewhere = try await bobLaptop.expect(Self.ended)
            #expect(elsewhere.reason == .answeredElsewhere)
            #expect(try await bobLaptop.request { .callAccept(CallRequest(id: $0, call: call)) }.errorCode == .callAlreadyAnswered,
                    "a second accept, on the node that runs the call, gets what it gets on one node")

            // Offer and answer cross between the nodes both ways.
            #expect(try await alice.request {
                .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0 alice"))))
            }.isSuccess)
            let offer = try await bobPhone.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
            #expect(offer.from == Party(user: "alice", device: "a1"))
            #expect(try await bobPhone.request {
                .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(description: SessionDescription(type: "answer", sdp: "v=0 bob"))))
            }.isSuccess)
            let answer = try await alice.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
            #expect(answer.from == Party(user: "bob", device: "b1"))
            let state = try await bobPhone.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
            #expect(state.state == .active)

            #expect(try await bobPhone.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
            #expect(try await alice.expect(Self.ended).reason == .hangup)
            await a.server.hub.flushRecords()
            let history = try await b.http("GET", "/v1/calls", token: b.token("bob")).decode(CallList.self).calls
            #expect(history.map(\.call) == [call])
            #expect(history.first?.calleeDevice == "b1")
            #expect(history.first?.reason == .hangup)

            // Every message went the way the buses say, and none of them the other way.
            let sentByA = try #require(a.server.cluster?.sent), sentByB = try #require(b.server.cluster?.sent)
            if buses == [.direct, .direct] {
                #expect(sentByA.direct > 0 && sentByB.direct > 0, "a: \(sentByA), b: \(sentByB)")
                #expect(sentByA.notified == 0 && sentByB.notified == 0, "a: \(sentByA), b: \(sentByB)")
                #expect(sentByA.compact > 0 && sentByB.compact > 0, "the frames went as compact lines: a: \(sentByA), b: \(sentByB)")
            } else {
                #expect(sentByA.direct == 0 && sentByB.direct == 0, "a: \(sentByA), b: \(sentByB)")
                #expect(sentByA.notified > 0 && sentByB.notified > 0, "a: \(sentByA), b: \(sentByB)")
            }
        }
    }

    /// A node of an older build, as in a rolling upgrade, is sent the lines it reads: one that
    /// published version 1 (a build from before the compact lines) JSON only, and one that
    /// published version 2 (before requests were sent unanswered) compact lines as before. The
    /// call's frames cross both ways, compact towards the node that reads them.
    @Test(arguments: [1, 2])
    func aNodeOfAnOlderBuildIsSentTheLinesItReads(version: Int) async throws {
        try await withNodes { nodes, database in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let bob = try await b.device("bob", "b1")
            try await published(1, devicesOf: "bob", in: database)
            let older = try #require(b.server.cluster?.node)
            _ = try #require(try database.postgres?.psql("UPDATE cluster_node SET lines = \(version) WHERE node_id = '\(older)'", database: database.name))

            #expect(try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
            _ = try await bob.expect(Self.incoming)
            #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
            for (index, (from, to)) in [(alice, bob), (bob, alice), (alice, bob)].enumerated() {
                #expect(try await from.request {
                    .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0 \(index)"))))
                }.isSuccess)
                _ = try await to.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
            }
            #expect(try await bob.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
            _ = try await alice.expect(Self.ended)
            let toOlder = try #require(a.server.cluster?.sent), toNewer = try #require(b.server.cluster?.sent)
            if version == 1 {
                #expect(toOlder.direct > 0 && toOlder.compact == 0, "JSON to the node that reads only JSON: \(toOlder)")
            } else {
                #expect(toOlder.compact > 0, "compact lines to the node of version 2: \(toOlder)")
            }
            #expect(toNewer.compact > 0, "compact to the node that reads it: \(toNewer)")
            // What arrived, not what the sender counted.
            let heardByOlder = try #require(b.server.cluster?.heard), heardByNewer = try #require(a.server.cluster?.heard)
            if version == 1 {
                #expect(heardByOlder.json > 0 && heardByOlder.compact == 0, "heard by the node that reads only JSON: \(heardByOlder)")
            } else {
                #expect(heardByOlder.compact > 0, "heard by the node of version 2: \(heardByOlder)")
            }
            #expect(heardByNewer.compact > 0, "heard by the node that reads compact lines: \(heardByNewer)")
        }
    }

    /// A message too large for a link's frame, or for a notification, travels by its row in the
    /// database, and what is sent after it waits for it: the messages behind it keep their places.
    /// Signals sent back to back (none waits for its ack), the second one too large: the callee on
    /// the other node hears every one once, in the order sent, and all went by the nodes' bus. The
    /// callee's own, which its node acknowledges and sends on unanswered (it answered the call),
    /// likewise.
    @Test(arguments: [NodeBus.direct, .postgres])
    func aMessageTooLargeToTravelItselfKeepsItsPlace(bus: NodeBus) async throws {
        try await withNodes(buses: [bus]) { nodes, database in
            let (a, b) = (nodes[0], nodes[1])
            let (alice, bob) = try await aliceRingsBob(nodes, in: database)
            #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)

            let sdps = (0..<12).map { index in "v=0 \(index) " + (index == 1 ? String(repeating: "a", count: bus == .direct ? 61_000 : 9_000) : "") }
            let heard = try await signalBackToBack(sdps, "offer", ids: "signal", from: alice, to: bob)
            #expect(heard.map { $0.prefix(8) } == sdps.map { $0.prefix(8) }, "in the order sent")
            #expect(heard.map(\.utf8.count) == sdps.map(\.utf8.count), "whole")

            let heardByAlice = try await signalBackToBack(sdps, "answer", ids: "answer", from: bob, to: alice)
            #expect(heardByAlice.map { $0.prefix(8) } == sdps.map { $0.prefix(8) }, "the callee's in the order sent")
            #expect(heardByAlice.map(\.utf8.count) == sdps.map(\.utf8.count), "whole")
            for index in sdps.indices { #expect(try await bob.answer(to: "answer-\(index)").isSuccess) }

            let stored = try #require(try database.postgres?.psql("SELECT count(*) FROM cluster_message", database: database.name))
            #expect(stored == "2", "each large one went by its row")
            for node in [a, b] {
                let sent = try #require(node.server.cluster?.sent)
                if bus == .direct {
                    #expect(sent.notified == 0 && sent.direct > 0, "over the link: \(sent)")
                } else {
                    // No node links on this bus: each node notified at least its twelve signals.
                    #expect(sent.notified >= sdps.count, "by NOTIFY: \(sent)")
                }
            }
            #expect(b.server.metrics.exposition().contains(#"parley_node_messages_sent_total{kind="request_unanswered"} 12"# + "\n"),
                    "bob's node acknowledged his signals itself: \(b.server.metrics.exposition())")
        }
    }

    /// A node sends the node that runs a call its devices' requests unanswered only once that node
    /// has shown that it runs them in the order they come: here, as it linked to it
    /// (`Parley-Node-Version` 3).
    /// After a link from the call's node that shows no version (a build before, as in a rolling
    /// upgrade), the callee's node sends every one for an answer, each after the last one's.
    @Test func aCallsNodeThatShowedNoVersionIsSentEveryRequestForAnAnswer() async throws {
        try await withNodes { nodes, database in
            let (a, b) = (nodes[0], nodes[1])
            let (alice, bob) = try await aliceRingsBob(nodes, in: database)
            let (nodeA, nodeB) = (try #require(a.server.cluster?.node), try #require(b.server.cluster?.node))
            let cluster = try #require(b.server.cluster)
            #expect(cluster.runsUnansweredInOrder(nodeA), "node a linked to b to ring bob, and showed its version")

            let (older, status, _) = try await nodeLink(port: b.port, from: nodeA, to: nodeB, key: try linkKey(in: database))
            #expect(status == 101)
            try await eventually("b hears a's link without a version") { !cluster.runsUnansweredInOrder(nodeA) }
            #expect(try await bob.request { .callRinging(CallRingingRequest(id: $0, call: call)) }.isSuccess)
            #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
            // Sent back to back: the call's node runs requests that want an answer as they come, each
            // in a task of its own, so only bob's node sending each after the last one's answer
            // keeps them in order. (Those tasks nearly always start in the order made: this sees an
            // order broken, not every node that would send them all at once.)
            let sdps = (0..<12).map { "v=0 \($0)" }
            #expect(try await signalBackToBack(sdps, "answer", ids: "answer", from: bob, to: alice) == sdps, "in the order sent")
            for index in sdps.indices { #expect(try await bob.answer(to: "answer-\(index)").isSuccess) }
            let metrics = b.server.metrics.exposition()
            #expect(metrics.contains("parley_node_messages_sent_total{kind=\"request\"} 14\n")
                        && metrics.contains("parley_node_messages_sent_total{kind=\"request_unanswered\"} 0\n"), "\(metrics)")
            withExtendedLifetime(older) {}
        }
    }

    /// The same through PostgreSQL, where no node links: a node shows its version in the number of
    /// every line it notifies, beside its own id (`<count>v3@<node>`). After a line from the call's
    /// node that shows version 2, the callee's node sends requests for an answer, until a line
    /// shows 3 again; a line that another node hands on, naming the call's node as its sender,
    /// shows that node's version, not the call's node's.
    @Test func aCallsNodeOnNotifyThatShowedAnOlderVersionIsSentEveryRequestForAnAnswer() async throws {
        try await withNodes(buses: [.postgres, .postgres]) { nodes, database in
            let (a, b) = (nodes[0], nodes[1])
            let (alice, bob) = try await aliceRingsBob(nodes, in: database)
            let (nodeA, nodeB) = (try #require(a.server.cluster?.node), try #require(b.server.cluster?.node))
            let cluster = try #require(b.server.cluster)
            #expect(cluster.runsUnansweredInOrder(nodeA), "node a's notification ringing bob showed its version")

            func notify(_ number: String) throws {
                let line = #"\#(number) {"deliver":{"to":{"user":"nobody","device":"none"},"frame":"{}","from":"\#(nodeA)"}}"#
                _ = try #require(try database.postgres?.psql("SELECT pg_notify('parley_\(nodeB)', '\(line)')", database: database.name))
            }
            try notify("1v2@\(nodeA)")
            try await eventually("b hears a's line numbered as version 2") { !cluster.runsUnansweredInOrder(nodeA) }
            let relaying = "n0000000000aa"
            try notify("2v3@\(relaying)")
            try await eventually("b hears the line another node handed on") { cluster.runsUnansweredInOrder(relaying) }
            #expect(!cluster.runsUnansweredInOrder(nodeA), "what another node handed on shows that node's version, not a's")

            #expect(try await bob.request { .callRinging(CallRingingRequest(id: $0, call: call)) }.isSuccess)
            var metrics = b.server.metrics.exposition()
            #expect(metrics.contains("parley_node_messages_sent_total{kind=\"request\"} 1\n")
                        && metrics.contains("parley_node_messages_sent_total{kind=\"request_unanswered\"} 0\n"), "\(metrics)")
            // The call's node answered it in a line numbered as what it is, version 3.
            #expect(cluster.runsUnansweredInOrder(nodeA))
            #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
            #expect(try await bob.request {
                .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(description: SessionDescription(type: "answer", sdp: "v=0"))))
            }.isSuccess)
            #expect(try await alice.expect { if case .callSignal(let m) = $0.message { m.signal.description?.sdp } else { nil } } == "v=0")
            metrics = b.server.metrics.exposition()
            #expect(metrics.contains("parley_node_messages_sent_total{kind=\"request\"} 2\n")
                        && metrics.contains("parley_node_messages_sent_total{kind=\"request_unanswered\"} 1\n"), "\(metrics)")
        }
    }

    /// A server is a node of the deployment while it runs, and only then: made, it has joined nothing
    /// and holds no connection (the others, which count a node live while it listens, would send it
    /// calls it never hears); running, it listens; stopped, it has left and closed every connection.
    @Test func aServerIsANodeOnlyWhileItRuns() async throws {
        guard TestDatabase.canRun(.postgres, "cluster tests") else { return }
        let database = try await TestDatabase(.postgres)
        defer { database.close() }
        let postgres = try #require(database.postgres)
        /// The server's connections to the database, by application name (psql's own left out).
        func connections() throws -> String {
            try postgres.psql("""
                SELECT coalesce(string_agg(application_name, ',' ORDER BY application_name), '') FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()
                """, database: database.name)
        }
        var configuration = ServerConfiguration()
        configuration.port = 0
        configuration.databasePath = database.setting
        let (ports, port) = AsyncStream<Int>.makeStream()
        let warnings = Warnings()
        let logger = Logger(label: "test.node") { _ in warnings }
        let server = try await SignalingServer(configuration: configuration, logger: logger) { port.yield($0) }
        let node = try #require(server.cluster?.node)
        // (The connection that opened the store and migrated it closes a moment after.)
        try await eventually("made, not running: no connection, so not live for the other nodes") { try connections() == "" }
        #expect(try postgres.psql("SELECT count(*) FROM cluster_node WHERE node_id = '\(node)'", database: database.name) == "0",
                "and nothing published")

        let group = server.makeServiceGroup(signals: [])
        async let run: Void = {
            // A run that ends before it listens ends the wait for its port too.
            defer { port.finish() }
            try await group.run()
        }()
        for await _ in ports { break }
        #expect(try connections().split(separator: ",").contains("parley-node \(node)"), "running: it listens")
        #expect(try postgres.psql("SELECT count(*) FROM cluster_node WHERE node_id = '\(node)'", database: database.name) == "1",
                "and says where it takes links")

        await group.triggerGracefulShutdown()
        try await run
        try await eventually("stopped: every connection closed") { try connections() == "" }
        #expect(try postgres.psql("SELECT count(*) FROM cluster_node WHERE node_id = '\(node)'", database: database.name) == "0",
                "and it left")
        // Nothing queried the store before it ran (postgres-nio warns of that), or went wrong.
        #expect(warnings.logged == [])
    }

    /// A node on a new database, not running (its directory's queries need no join), and beside it
    /// bob's devices held on the nodes `held` names (given this node's id), and a call of alice's to
    /// bob that node `nlocked` runs.
    func idleNode(held: (NodeID) -> [(device: String, node: String)]) async throws -> (TestDatabase, PostgresStore, PostgresCluster) {
        let database = try await TestDatabase(.postgres)
        do {
            let postgres = try #require(database.postgres)
            let store = try #require(try await database.open() as? PostgresStore)
            let cluster = PostgresCluster(store: store, logger: TestDatabase.logger)
            let rows = held(cluster.node).map { "('bob', '\($0.device)', '\($0.node)')" }.joined(separator: ", ")
            _ = try postgres.psql("""
                INSERT INTO cluster_device (user_id, device_id, node_id) VALUES \(rows);
                INSERT INTO call (call_id, caller, callee, caller_device, audio, video, created_at, expires_at, owner_node)
                VALUES ('\(call)', 'alice', 'bob', 'a1', true, false, 1, 2, 'nlocked')
                """, database: database.name)
            return (database, store, cluster)
        } catch {
            database.close()
            throw error
        }
    }

    /// A node is live while its listening connection is. A query knows it by the lock the node
    /// holds on that connection, without reading every backend's activity; a node that holds no
    /// lock (one of an older version) by its connection's name; a node whose connection closed not
    /// at all. Only one connection holds a node's lock.
    @Test func aNodeIsLiveWhileItsListeningConnectionIs() async throws {
        guard TestDatabase.canRun(.postgres, "cluster tests") else { return }
        let (database, store, cluster) = try await idleNode { _ in [("locked", "nlocked"), ("older", "nolder"), ("gone", "ngone")] }
        defer { database.close() }
        let logger = TestDatabase.logger
        // The lock alone, on a connection not named as a node's.
        let locked = try await PostgresStore.connect(store.location, logger: logger, application: "not a node's name")
        try await PostgresCluster.lock("nlocked", on: locked, logger: logger)
        let older = try await PostgresStore.connect(store.location, logger: logger, application: PostgresCluster.applicationPrefix + "nolder")
        await #expect(throws: StoreError.self, "a second connection cannot take the lock") {
            try await PostgresCluster.lock("nlocked", on: older, logger: logger)
        }
        let bob = { (device: DeviceID) in DeviceKey(user: "bob", device: device) }
        #expect(try await cluster.remoteDevices(of: "bob") == [bob("locked"): "nlocked", bob("older"): "nolder"])
        #expect(try await cluster.owner(of: call) == "nlocked")
        #expect(try await cluster.adopt(call).isEmpty, "a live node's call is not taken over")
        try await locked.close()
        try await eventually("a node whose connection closed is gone") {
            try await cluster.remoteDevices(of: "bob") == [bob("older"): "nolder"]
        }
        #expect(try await cluster.owner(of: call) == nil)
        #expect(try await cluster.adopt(call).map(\.record.call) == [call], "and its call is taken over")
        try await older.close()
        try await eventually("an older node's too") { try await cluster.remoteDevices(of: "bob") == [:] }
        await store.close()
    }

    /// A new call's claim goes to PostgreSQL as one statement: it stores the call unless the id is
    /// taken (a call there is left as it was), and answers what the claim step by step answers: the
    /// id taken or not, where the callee's devices are held, the callee's devices and their push
    /// registrations. Of two claims of one id at once, one wins.
    @Test func aNewCallsClaimIsOneStatementThatStoresItUnlessItsIdIsTaken() async throws {
        guard TestDatabase.canRun(.postgres, "cluster tests") else { return }
        let (database, store, cluster) = try await idleNode { own in [("locked", "nlocked"), ("gone", "ngone"), ("here", own)] }
        defer { database.close() }
        let locked = try await PostgresStore.connect(store.location, logger: TestDatabase.logger, application: "a node")
        try await PostgresCluster.lock("nlocked", on: locked, logger: TestDatabase.logger)
        let voip = VoIPRegistration(token: String(repeating: "ab", count: 32), topic: "com.example.app.voip", environment: .sandbox)
        let alerts = VoIPRegistration(token: String(repeating: "cd", count: 32), topic: "com.example.app", environment: .production)
        try await store.upsertDevice(DeviceRecord(user: "bob", device: "phone", platform: .ios, voip: voip, alerts: alerts, updatedAt: 5))
        try await store.upsertDevice(DeviceRecord(user: "bob", device: "laptop", platform: .linux, voip: nil, alerts: nil, updatedAt: 6))
        // Ordered by the database's collation, as the store's own read orders them.
        try await store.upsertDevice(DeviceRecord(user: "bob", device: "Tablet", platform: .android, voip: nil, alerts: nil, updatedAt: 8))
        var own = voip
        own.token = String(repeating: "ef", count: 32)
        try await store.upsertDevice(DeviceRecord(user: "alice", device: "a1", platform: .ios, voip: own, alerts: nil, updatedAt: 7))

        // Every column a new call may leave NULL, left NULL and set, in turn.
        func newCall(_ id: CallID, to callee: UserID, extras: Bool) -> StoredCall {
            StoredCall(record: CallRecord(call: id, caller: "mallory", callee: callee, callerDevice: "m1",
                                          media: MediaSpec(audio: true, video: extras), createdAt: 10),
                       expiresAt: 40, callerName: extras ? "Mallory O'Brien" : nil,
                       metadata: extras ? .object(["topic": .string("tax"), "tags": .array([.number(1.5), .null])]) : nil,
                       owner: cluster.node)
        }
        let ids: [CallID] = ["0b9e8d7c-6b5a-4f3e-9d2c-1b0a9f8e7d6c", "1c0f9e8d-7c6b-4a5f-8e3d-2c1b0a9f8e7d",
                             "2d1a0f9e-8d7c-4b6a-9f4e-3d2c1b0a9f8e", "3e2b1a0f-9e8d-4c7b-8a5f-4e3d2c1b0a9f",
                             "4f3c2b1a-0f9e-4d8c-9b6a-5f4e3d2c1b0a", "5a4d3c2b-1a0f-4e9d-8c7b-6a5f4e3d2c1b"]
        // (one statement's id, the step-by-step claim's id, callee, with every column set)
        let cases: [(CallID, CallID, UserID, Bool)] = [(call, call, "bob", true), (ids[0], ids[1], "bob", true),
                                                       (ids[2], ids[3], "bob", false), (ids[4], ids[5], "carol", true)]
        for (one, stepwise, callee, extras) in cases {
            let claimed = try await cluster.claim(newCall(one, to: callee, extras: extras), store: store)
            let steps = try await InviteClaim.stepByStep(newCall(stepwise, to: callee, extras: extras), store: store, directory: cluster)
            #expect(claimed == steps, "\(one) to \(callee)")
        }
        let bob = try await cluster.claim(newCall(ids[0], to: "bob", extras: true), store: store)
        #expect(bob.taken, "an id claimed once is taken")
        #expect(bob.held == [DeviceKey(user: "bob", device: "locked"): "nlocked"], "devices on other live nodes only")
        #expect(Set(bob.devices.map(\.device)) == ["laptop", "phone", "Tablet"], "the callee's devices in the store, not another user's")
        let phone = bob.devices.first { $0.device == "phone" }
        #expect(phone?.voip == voip && phone?.alerts == alerts)

        // A taken id's call is left as it was; a free id's call is stored as given, the same both ways.
        let stored = try await store.unfinishedCalls()
        #expect(stored.first { $0.record.call == call }?.record.caller == "alice")
        for (one, stepwise, callee, extras) in cases.dropFirst() {
            var expected = newCall(one, to: callee, extras: extras)
            expected.owner = nil  // not among the columns a store reads back
            #expect(stored.first { $0.record.call == one } == expected)
            expected.record.call = stepwise
            #expect(stored.first { $0.record.call == stepwise } == expected)
        }
        let owners = try #require(database.postgres).psql("SELECT DISTINCT owner_node FROM call WHERE caller = 'mallory'",
                                                          database: database.name)
        #expect(owners == cluster.node)

        // An id another transaction is inserting: the claim waits for it, and then finds the id taken
        // (a read, then a write, would find it free and then write over that call).
        let contested: CallID = "6b5e4d3c-2b1a-4f0e-9d8c-7b6a5f4e3d2c"
        let other = try await PostgresStore.connect(store.location, logger: TestDatabase.logger, application: "another node")
        _ = try await other.query("BEGIN", logger: TestDatabase.logger)
        _ = try await other.query("""
            INSERT INTO call (call_id, caller, callee, caller_device, audio, video, created_at, expires_at, owner_node)
            VALUES (\(contested.rawValue), 'carol', 'bob', 'c1', true, false, 1, 2, 'nlocked')
            """, logger: TestDatabase.logger)
        let claiming = Task { try await cluster.claim(newCall(contested, to: "bob", extras: false), store: store) }
        try await eventually("the claim waits for the other transaction") {
            try database.postgres?.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'", database: database.name) == "1"
        }
        _ = try await other.query("COMMIT", logger: TestDatabase.logger)
        #expect(try await claiming.value.taken, "the id the other transaction inserted is taken")
        #expect(try await store.call(contested)?.caller == "carol", "and its call left as it was")
        try await other.close()
        try await locked.close()
        await store.close()
    }

    /// What a logger was told at warning level or above, by every copy of it.
    struct Warnings: LogHandler {
        private let messages = NIOLockedValueBox<[String]>([])
        var logged: [String] { messages.withLockedValue { $0 } }
        var logLevel = Logger.Level.warning
        var metadata: Logger.Metadata = [:]
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            messages.withLockedValue { $0.append("\(event.level): \(event.message)") }
        }
    }

    /// The deployment's key for node links, as the nodes keep it in the database.
    func linkKey(in database: TestDatabase) throws -> SymmetricKey {
        let hex = try #require(try database.postgres?.psql("SELECT value FROM deployment_secret WHERE name = 'node-links'",
                                                          database: database.name))
        return SymmetricKey(data: stride(from: 0, to: 64, by: 2).map { index in
            UInt8(hex[hex.index(hex.startIndex, offsetBy: index)...].prefix(2), radix: 16)!
        })
    }

    /// A link to the node listening on `port`, made as node `from` to node `to` would make it at
    /// `time` with `key`; `headers` beside (an older build shows no `Parley-Node-Version`).
    func nodeLink(port: Int, from: String, to: String, time: Int64 = Int64(Date().timeIntervalSince1970), key: SymmetricKey,
                  headers: [String: String] = [:]) async throws -> (RawWebSocket, status: Int, head: String) {
        let code = HMAC<SHA256>.authenticationCode(for: Data("parley-node-link \(from) \(to) \(time)".utf8), using: key)
        let authorization = code.map { String(format: "%02x", $0) }.joined()
        return try await RawWebSocket.upgrade(port: port, path: "/v1/cluster", headers: headers.merging(
            ["Parley-Node": "\(from) \(time)", "Authorization": "Bearer \(authorization)"]) { $1 })
    }

    /// A node link is another node of the deployment only: it shows an HMAC, with the key the
    /// nodes keep in the database, of the two nodes and its time. One without it, with another pair's,
    /// with a client's token, or from minutes ago (a link seen on the wire, replayed) is refused
    /// before the upgrade; one made with the key now is taken. A server with no cluster has no such path.
    @Test func aNodeLinkNeedsTheDeploymentsKeyForThePairAndTheTime() async throws {
        try await withNodes(buses: [.direct]) { nodes, database in
            let (a, b) = (nodes[0], nodes[1])
            let nodeA = try #require(a.server.cluster?.node), nodeB = try #require(b.server.cluster?.node)
            #expect(try database.postgres?.psql("SELECT count(*) FROM cluster_node WHERE node_id IN ('\(nodeA)', '\(nodeB)')",
                                                database: database.name) == "2", "both nodes published where they take links")
            let key = try linkKey(in: database)
            func link(from: String, to: String, time: Int64, key: SymmetricKey = key) async throws -> Int {
                try await nodeLink(port: b.port, from: from, to: to, time: time, key: key).status
            }
            let now = Int64(Date().timeIntervalSince1970)
            #expect(try await link(from: nodeA, to: nodeB, time: now) == 101, "the deployment's key, now: a node")
            #expect(try await link(from: nodeA, to: nodeB, time: now - 300) == 401, "the same, five minutes old")
            #expect(try await link(from: nodeA, to: nodeA, time: now) == 401, "another pair's")
            #expect(try await link(from: nodeA, to: nodeB, time: now, key: SymmetricKey(size: .bits256)) == 401, "another key")
            #expect(try await RawWebSocket.upgrade(port: b.port, path: "/v1/cluster", headers: ["Parley-Node": "\(nodeA) \(now)"]).status == 401)
            // A client's access token is not a node's key.
            let token = try await b.token("mallory")
            #expect(try await RawWebSocket.upgrade(port: b.port, path: "/v1/cluster",
                                                   headers: ["Parley-Node": "\(nodeA) \(now)", "Authorization": "Bearer \(token)"]).status == 401)
            let alone = try await LiveServer.start()
            let status = try await RawWebSocket.upgrade(port: alone.port, path: "/v1/cluster", headers: ["Parley-Node": "\(nodeA) \(now)"]).status
            try await alone.stop()
            #expect(status == 404)
        }
    }

    @Test func aDeviceThatConnectsToAnotherNodeWhileACallRingsIsRungAndNobodyElseHearsTheCall() async throws {
        try await withNodes { nodes, _ in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let carol = try await b.device("carol", "c1")
            _ = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
            let bob = try await b.device("bob", "b1")
            #expect(try await bob.expect(Self.incoming).call == call)
            // Another user's request about the call, on either node, learns nothing.
            #expect(try await carol.request { .callAccept(CallRequest(id: $0, call: call)) }.errorCode == .callNotFound)
            #expect(try await carol.request { .callState(CallRequest(id: $0, call: call)) }.errorCode == .callNotFound)
            #expect(try await bob.request { .callDecline(CallDecline(id: $0, call: call)) }.isSuccess)
            #expect(try await alice.expect(Self.ended).reason == .declined)
            #expect(try await carol.next(timeout: .milliseconds(300)) == nil, "carol heard nothing of it")
        }
    }

    /// A load balancer sends a device's reconnect to the other node while the first still runs:
    /// the session resumes there, every frame not yet acknowledged is replayed once and in order,
    /// frames sent meanwhile arrive, and a request re-sent under its id is answered, not run again.
    @Test func aReconnectThatALoadBalancerSendsToAnotherNodeResumesWithNothingLostOrRunTwice() async throws {
        try await withNodes { nodes, database in
            let (a, b) = (nodes[0], nodes[1])
            let balancer = try await HAProxy.start(preferences: [[a.port, b.port]], roundRobin: true)
            defer { balancer.stop() }
            let door = "ws://127.0.0.1:\(balancer.ports[0])/v1/signal"
            let alice = try await a.device("alice", "a1")

            let bob = try await WSTestClient.connect(url: door, token: b.token("bob"))
            let session = try await bob.hello(device: "b1")
            let first = await a.server.hub.isPresent("bob") ? a : b
            let other = first === a ? b : a
            try await published(1, devicesOf: "bob", in: database)
            _ = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
            let ringSeq = try await bob.expect { frame in Self.incoming(frame).flatMap { _ in frame.seq } }
            bob.send(.ack(SeqAck(seq: ringSeq)))
            // What follows bob reads but does not acknowledge: the frames a resume must replay.
            let accept = CallRequest(id: "accept-1", call: call)
            bob.send(.callAccept(accept))
            #expect(try await bob.answer(to: accept.id).isSuccess)
            _ = try await alice.expect { if case .callAccepted(let m) = $0.message { m } else { nil } }
            let offer = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0 alice"))
            #expect(try await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer)) }.isSuccess)
            _ = try await bob.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
            let answer = CallSignal(id: "answer-1", call: call, signal: SignalPayload(description: SessionDescription(type: "answer", sdp: "v=0 bob")))
            bob.send(.callSignal(answer))
            #expect(try await bob.answer(to: answer.id).isSuccess)
            _ = try await alice.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
            // Until the first node has seen bob's connection close, what it sends him goes to that connection.
            let connected = await first.server.hub.connectionCount
            await bob.close()
            try await eventually("the first node has seen bob go") { await first.server.hub.connectionCount == connected - 1 }
            #expect(await first.server.hub.isPresent("bob"), "and holds his session for resume")
            // Sent while bob is away: kept in his session on the first node.
            let candidate = SignalPayload(candidate: .candidate(IceCandidate(candidate: "candidate:1 1 udp 1 198.51.100.7 5000 typ host",
                                                                            sdpMid: "0", sdpMLineIndex: 0)))
            #expect(try await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: candidate)) }.isSuccess)

            let again = try await WSTestClient.connect(url: door, token: b.token("bob"))
            let resumed = try await again.hello(device: "b1", resume: ResumeRequest(session: session.session, lastSeq: ringSeq))
            #expect(resumed.resumed, "resumed on the other node")
            #expect(resumed.session == session.session)
            #expect(await other.server.hub.isPresent("bob"), "the balancer sent the reconnect to the other node")
            #expect(await !first.server.hub.isPresent("bob"), "the first node let the session go")
            // Replayed, in order (the test client fails a frame that comes twice or out of order).
            var replayed: [String] = []
            while let frame = try await again.next(timeout: .milliseconds(500)) {
                switch frame.message {
                case .ack(let ack): replayed.append("ack \(ack.re)")
                case .callSignal(let signal): replayed.append(signal.signal == offer ? "offer" : signal.signal == candidate ? "candidate" : "another signal")
                default: replayed.append(frame.message.type)
                }
            }
            #expect(replayed == ["ack accept-1", "offer", "ack answer-1", "candidate"])
            // Requests again under their ids, after the move: the remembered answers. Run again, the
            // answer would reach alice twice. (The accept run again answers as it did, its device
            // having answered: ClusterHubTests sees that it is not forwarded.)
            again.send(.callAccept(accept))
            #expect(try await again.answer(to: accept.id).isSuccess)
            again.send(.callSignal(answer))
            #expect(try await again.answer(to: answer.id).isSuccess)
            #expect(try await alice.next(timeout: .milliseconds(500)) == nil, "alice heard nothing again")
            // The call goes on through the node bob is on now.
            #expect(try await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
            #expect(try await again.expect(Self.ended).reason == .hangup)
        }
    }

    /// Three nodes: bob's session moves from the first to the second while his call runs on the
    /// third. The third hears where bob is now (and until it does, the first sends on what it still
    /// gets for him): the call's frames reach him, in order, and his hangup ends the call.
    @Test func aSessionThatMovedHearsItsCallRunningOnAThirdNode() async throws {
        try await withNodes(3) { nodes, database in
            let (a, b, c) = (nodes[0], nodes[1], nodes[2])
            let alice = try await c.device("alice", "a1")
            let bob = try await WSTestClient.connect(url: a.signalURL, token: a.token("bob"))
            let session = try await bob.hello(device: "b1")
            try await published(1, devicesOf: "bob", in: database)
            _ = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
            let ringSeq = try await bob.expect { frame in Self.incoming(frame).flatMap { _ in frame.seq } }
            #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
            await bob.close()
            try await eventually("a has seen bob go") { await a.server.hub.connectionCount == 0 }
            #expect(await a.server.hub.isPresent("bob"), "and holds his session for resume")

            let again = try await WSTestClient.connect(url: b.signalURL, token: b.token("bob"))
            #expect(try await again.hello(device: "b1", resume: ResumeRequest(session: session.session, lastSeq: ringSeq)).resumed)
            for index in 0..<3 {
                let sdp = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0 alice \(index)"))
                #expect(try await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: sdp)) }.isSuccess)
                let heard = try await again.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
                #expect(heard.signal == sdp, "the call's frames reach bob on his new node, in order")
            }
            // An id of its own: the session remembers the answers to bob's requests on the first node.
            again.send(.callHangup(CallHangup(id: "hangup-1", call: call)))
            #expect(try await again.answer(to: "hangup-1").isSuccess)
            #expect(try await alice.expect(Self.ended).reason == .hangup)
        }
    }

    @Test func theNodeRunningACallStopsAndTheCallGoesOnOnTheOther() async throws {
        try await withNodes { nodes, database in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let bob = try await b.device("bob", "b1")
            try await published(1, devicesOf: "bob", in: database)
            _ = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
            _ = try await bob.expect(Self.incoming)
            #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
            let nodeA = try #require(a.server.cluster?.node), other = try #require(b.server.cluster)
            #expect(other.runsUnansweredInOrder(nodeA))

            // The node alice is on, which runs the call, stops (a deploy): she comes back on the other.
            try await a.stop()
            #expect(await alice.closeCode() == 1001)
            let aliceAgain = try await b.device("alice", "a1")
            let state = try await aliceAgain.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
            #expect(state.state == .active)
            // The other node takes the call over: signals and the hangup work as before.
            try await eventually("the call is taken over") {
                try await aliceAgain.request {
                    .callSignal(CallSignal(id: $0, call: call, signal: SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0 restart"))))
                }.isSuccess
            }
            _ = try await bob.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
            #expect(try await bob.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
            #expect(try await aliceAgain.expect(Self.ended).reason == .hangup)
            await b.server.hub.flushRecords()
            let history = try await b.http("GET", "/v1/calls", token: b.token("alice")).decode(CallList.self).calls
            #expect(history.map(\.call) == [call], "one call")
            #expect(history.first?.reason == .hangup)
            #expect(history.first?.answeredAt != nil)
            try await eventually("the other node forgets what the one that left showed") { !other.runsUnansweredInOrder(nodeA) }
        }
    }

    @Test func aRoomRunsOnTheNodeWhereItWasFirstJoinedAndItsMembersMeetAcrossNodes() async throws {
        try await withNodes { nodes, _ in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let bob = try await b.device("bob", "b1")
            let carol = try await b.device("carol", "c1")
            let first = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Alice")) }.get()
                .decodeResult(RoomJoinResult.self)
            #expect(first.participants.isEmpty)
            let second = try await bob.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Bob")) }.get()
                .decodeResult(RoomJoinResult.self)
            #expect(second.participants.map(\.device) == ["a1"], "bob, on the other node, meets alice")
            let joined = try await alice.expect { if case .roomParticipantJoined(let m) = $0.message { m } else { nil } }
            #expect(joined.device == "b1")

            let offer = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0 bob"))
            #expect(try await bob.request { .roomSignal(RoomSignal(id: $0, room: "lobby", to: "a1", signal: offer)) }.isSuccess)
            let heard = try await alice.expect { if case .roomSignal(let m) = $0.message { m } else { nil } }
            #expect(heard.from == Party(user: "bob", device: "b1"))
            let answer = SignalPayload(description: SessionDescription(type: "answer", sdp: "v=0 alice"))
            #expect(try await alice.request { .roomSignal(RoomSignal(id: $0, room: "lobby", to: "b1", signal: answer)) }.isSuccess)
            _ = try await bob.expect { if case .roomSignal(let m) = $0.message { m } else { nil } }
            // Carol is not in the room: she can signal no one in it.
            #expect(try await carol.request { .roomSignal(RoomSignal(id: $0, room: "lobby", to: "a1", signal: offer)) }.errorCode == .notInRoom)

            #expect(try await bob.request { .roomLeave(RoomLeave(id: $0, room: "lobby")) }.isSuccess)
            let left = try await alice.expect { if case .roomParticipantLeft(let m) = $0.message { m } else { nil } }
            #expect(left.device == "b1")
            #expect(try await bob.request { .roomLeave(RoomLeave(id: $0, room: "lobby")) }.errorCode == .notInRoom)
        }
    }

    @Test func anAudioBridgeRoomIsOneJanusRoomWhateverNodeItsMembersAreOn() async throws {
        try await withJanusNodes { nodes, janus in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let bob = try await b.device("bob", "b1")
            let first = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Alice")) }.get()
                .decodeResult(RoomJoinResult.self)
            let second = try await bob.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Bob")) }.get()
                .decodeResult(RoomJoinResult.self)
            let aliceTicket = try #require(first.media.janus), bobTicket = try #require(second.media.janus)
            #expect(bobTicket.room == aliceTicket.room, "one Janus room, provisioned by the node that runs it")
            #expect(bobTicket.token != aliceTicket.token)
            #expect(second.participants.map(\.device) == ["a1"])
            _ = try await alice.expect { if case .roomParticipantJoined(let m) = $0.message { m } else { nil } }
            #expect(try await bob.request { .roomLeave(RoomLeave(id: $0, room: "standup")) }.isSuccess)
            _ = try await alice.expect { if case .roomParticipantLeft(let m) = $0.message { m } else { nil } }
        }
    }

    /// A member of a voice room connects to another node (its own node went away, or the load
    /// balancer moved it): it keeps its place in the room, as a new session on the same node does,
    /// and its Janus participant is not kicked.
    @Test func aRoomMemberThatMovesToAnotherNodeKeepsItsPlace() async throws {
        try await withJanusNodes { nodes, janus in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let ticket = try #require(try await alice.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Alice")) }.get()
                .decodeResult(RoomJoinResult.self).media.janus)
            let aliceJanus = try await AudioBridgeRoomTests.enter(janus, with: ticket, as: "Alice")
            let aliceHears = aliceJanus.hears

            let aliceMoved = try await b.device("alice", "a1")
            #expect(await alice.closeCode() == 1001, "the old node let her session go")
            let bob = try await b.device("bob", "b1")
            let joined = try await bob.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Bob")) }.get()
                .decodeResult(RoomJoinResult.self)
            #expect(joined.participants.map(\.device) == ["a1"], "alice is still in the room")
            let told = try await aliceMoved.expect { if case .roomParticipantJoined(let m) = $0.message { m } else { nil } }
            #expect(told.device == "b1", "and is told of newcomers where she is now")
            #expect(!aliceHears.contains(.kicked(room: ticket.room, id: ticket.participant)))
            #expect(try await aliceMoved.request { .roomLeave(RoomLeave(id: $0, room: "standup")) }.isSuccess)
            try await eventually("her participant kicked once she leaves") { aliceHears.contains(.kicked(room: ticket.room, id: ticket.participant)) }
            try? await aliceJanus.bridge.client.destroy()
        }
    }

    /// The node that runs a room goes away. Bob, on the other node, never lost his session: his
    /// node joins him again where the room runs now. Alice, whose session was on the node that went,
    /// comes back through the other and joins again. A newcomer finds both, and they signal each other.
    @Test func aRoomKeepsItsMembersWhenTheNodeThatRanItGoesAway() async throws {
        try await withNodes { nodes, _ in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let bob = try await b.device("bob", "b1")
            #expect(try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Alice")) }.isSuccess)
            #expect(try await bob.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Bob")) }.isSuccess)
            _ = try await alice.expect { if case .roomParticipantJoined(let m) = $0.message { m } else { nil } }

            try await a.stop()
            let aliceBack = try await b.device("alice", "a1")
            let back = try await aliceBack.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Alice")) }.get()
                .decodeResult(RoomJoinResult.self)
            if !back.participants.contains(where: { $0.device == "b1" }) {
                // Bob's node joined him again after alice's join: she is told, as of any member who joins.
                let joined = try await aliceBack.expect { if case .roomParticipantJoined(let m) = $0.message { m } else { nil } }
                #expect(joined.device == "b1")
            }
            let carol = try await b.device("carol", "c1")
            let found = try await carol.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "Carol")) }.get()
                .decodeResult(RoomJoinResult.self)
            #expect(Set(found.participants.map(\.device)) == ["a1", "b1"], "both members from before the node went away")
            let offer = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0 bob"))
            #expect(try await bob.request { .roomSignal(RoomSignal(id: $0, room: "lobby", to: "a1", signal: offer)) }.isSuccess)
            let heard = try await aliceBack.expect { if case .roomSignal(let m) = $0.message { m } else { nil } }
            #expect(heard.from == Party(user: "bob", device: "b1"))
        }
    }

    /// The same with an AudioBridge room: alice names her Janus participant when she joins again,
    /// bob's node names his, and the node that runs the room now keeps both admissions: a newcomer
    /// finds both, nobody is kicked from Janus, and each one's token is still taken back on leave.
    @Test func anAudioBridgeRoomKeepsItsMembersAndTheirAdmissionsWhenItsNodeGoesAway() async throws {
        try await withJanusNodes { nodes, janus in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let bob = try await b.device("bob", "b1")
            let aliceTicket = try #require(try await alice.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Alice")) }.get()
                .decodeResult(RoomJoinResult.self).media.janus)
            let bobTicket = try #require(try await bob.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Bob")) }.get()
                .decodeResult(RoomJoinResult.self).media.janus)
            let aliceJanus = try await AudioBridgeRoomTests.enter(janus, with: aliceTicket, as: "Alice")
            let bobJanus = try await AudioBridgeRoomTests.enter(janus, with: bobTicket, as: "Bob")

            try await a.stop()
            let aliceBack = try await b.device("alice", "a1")
            let back = try await aliceBack.request {
                .roomJoin(RoomJoin(id: $0, room: "standup", display: "Alice", participant: aliceTicket.participant))
            }.get().decodeResult(RoomJoinResult.self)
            #expect(back.media.janus == aliceTicket, "her admission kept by the node that runs the room now")
            if !back.participants.contains(where: { $0.device == "b1" }) {
                _ = try await aliceBack.expect { if case .roomParticipantJoined(let m) = $0.message { m.device == "b1" ? m : nil } else { nil } }
            }
            let carol = try await b.device("carol", "c1")
            let found = try await carol.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Carol")) }.get()
                .decodeResult(RoomJoinResult.self)
            #expect(Set(found.participants.map(\.device)) == ["a1", "b1"])
            #expect(!aliceJanus.hears.contains(.kicked(room: aliceTicket.room, id: aliceTicket.participant)))
            #expect(!bobJanus.hears.contains(.kicked(room: bobTicket.room, id: bobTicket.participant)))

            // Bob leaves: the node that runs the room now kicks his participant and takes his token back.
            #expect(try await bob.request { .roomLeave(RoomLeave(id: $0, room: "standup")) }.isSuccess)
            try await eventually("bob kicked once he leaves") { bobJanus.hears.contains(.kicked(room: bobTicket.room, id: bobTicket.participant)) }
            let probe = try await AudioBridge.attach(try await AudioBridgeRoomTests.client(janus))
            await #expect(throws: JanusError.audioBridge(.unauthorized, reason: "Unauthorized (not in the allowed list)")) {
                _ = try await probe.join(room: bobTicket.room, display: "Bob", token: bobTicket.token)
            }
            try? await aliceJanus.bridge.client.destroy()
            try? await bobJanus.bridge.client.destroy()
        }
    }

    /// The node running an AudioBridge room stops (a deploy; a crash leaves Janus the same): the
    /// members keep talking in the Janus room, and whoever joins through another node joins that
    /// same room, with them in it — not a new room of the same name.
    @Test func anAudioBridgeRoomOutlivesTheNodeThatRanIt() async throws {
        try await withJanusNodes(emptyRoomGrace: .milliseconds(300)) { nodes, janus in
            let (a, b) = (nodes[0], nodes[1])
            let alice = try await a.device("alice", "a1")
            let aliceTicket = try #require(try await alice.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Alice")) }.get()
                .decodeResult(RoomJoinResult.self).media.janus)
            let alicesClient = try await AudioBridgeRoomTests.enter(janus, with: aliceTicket, as: "Alice")
            let (aliceJanus, aliceHears) = (alicesClient.bridge, alicesClient.hears)

            try await a.stop()
            let bob = try await b.device("bob", "b1")
            let bobTicket = try #require(try await bob.request { .roomJoin(RoomJoin(id: $0, room: "standup", display: "Bob")) }.get()
                .decodeResult(RoomJoinResult.self).media.janus)
            #expect(bobTicket.room == aliceTicket.room, "the room's Janus room, found by the node that runs the room now")
            let bobsClient = try await AudioBridgeRoomTests.enter(janus, with: bobTicket, as: "Bob")
            let bobJanus = bobsClient.bridge
            #expect(bobsClient.others.map(\.id) == [aliceTicket.participant], "alice is still in it, and bob hears her")
            #expect(!aliceHears.contains(.destroyed(room: aliceTicket.room)))
            #expect(!aliceHears.contains(.kicked(room: aliceTicket.room, id: aliceTicket.participant)))

            // Bob leaves: the node's own list is empty, but alice is still in the room on Janus, so
            // it stays; once she leaves Janus too, it is destroyed.
            try await bobJanus.leave()
            #expect(try await bob.request { .roomLeave(RoomLeave(id: $0, room: "standup")) }.isSuccess)
            try await Task.sleep(for: .seconds(1))  // checks that nothing happens: the room is not destroyed under alice
            #expect(try await bobJanus.exists(room: aliceTicket.room), "alice is still talking in it")
            #expect(!aliceHears.contains(.destroyed(room: aliceTicket.room)))
            try await aliceJanus.leave()
            try await eventually("the room destroyed once nobody is in it") { try await bobJanus.exists(room: aliceTicket.room) == false }
            try? await aliceJanus.client.destroy()
            try? await bobJanus.client.destroy()
        }
    }
}
