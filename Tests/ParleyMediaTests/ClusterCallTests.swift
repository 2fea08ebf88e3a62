import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import Testing

/// Protocol v1, "Restarts and several nodes", as users live it: two `parley serve` nodes on one
/// PostgreSQL behind HAProxy, two `parley` softphones in a call, each through its own door of the
/// load balancer to its own node; then the node that runs the call is killed, or every node is
/// restarted in turn for a deploy.
@Suite("A call across two nodes", .serialized, .timeLimit(.minutes(5)))
struct ClusterCallTests {
    typealias ServeProcess = ServerRestartCallTests.ServeProcess

    enum Disruption: String, CaseIterable, CustomTestStringConvertible {
        /// `kill -9` of the node running the call; its client reconnects to the other.
        case killTheCallsNode
        /// `kill -9` of the other node; its client reconnects to the node running the call.
        case killTheOtherNode
        /// SIGTERM and start again, one node after the other; both clients move twice.
        case rollingRestart
        /// Three nodes, and `kill -9` of the one running the call: one of the two left takes it
        /// over, not both; alice's door sends her to the third.
        case killTheCallsNodeOfThree
        /// PostgreSQL restarts under the nodes: each loses its listening connection and stops (it
        /// would otherwise run deaf), and is started again, as a supervisor does, once PostgreSQL
        /// is back. Every session is new then; the call is known from the database and goes on.
        case restartPostgreSQL
        var testDescription: String { rawValue }
    }

    /// A node whose LISTEN connection is lost hears no other node, and the others count it as gone
    /// (they take its calls over): it stops, with a failing status, rather than run deaf; its
    /// supervisor starts it again.
    @Test func aNodeThatLosesItsListeningConnectionStops() async throws {
        guard PostgresServer.testsCanRun("cluster call tests") else { return }
        let postgres = try await PostgresServer.start()
        defer { postgres.stop() }
        let name = try postgres.createDatabase()
        let node = try await ServeProcess(port: 0, database: postgres.url(database: name))
        defer { if node.process.isRunning { node.process.terminate() } }
        let listeners = "FROM pg_stat_activity WHERE application_name LIKE 'parley-node %'"
        #expect(try postgres.psql("SELECT count(*) \(listeners)", database: name) == "1", "the node listens")
        #expect(try postgres.psql("SELECT bool_and(pg_terminate_backend(pid)) \(listeners)", database: name) == "t")
        try await eventually(timeout: .seconds(20), "the node stops") { !node.process.isRunning }
        #expect(node.process.terminationStatus != 0, "a node that stops for a lost connection fails")
    }

    /// The fewest quality reports any of the logs holds so far.
    static func reports(in logs: [URL]) -> Int {
        logs.map { log in
            ((try? String(contentsOf: log, encoding: .utf8)) ?? "").split(separator: "\n").filter { $0.contains(#""mos":"#) }.count
        }.min() ?? 0
    }

    @Test(arguments: Disruption.allCases)
    func theCallGoesOnWithAudioInEveryWindowAndEndsOnceRecorded(_ disruption: Disruption) async throws {
        guard PostgresServer.testsCanRun("cluster call tests") else { return }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-cluster-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let postgres = try await PostgresServer.start()
        defer { postgres.stop() }
        let name = try postgres.createDatabase()
        let database = postgres.url(database: name)
        let owner = { try postgres.psql("SELECT owner_node FROM call", database: name) }

        var one = try await ServeProcess(port: 0, database: database)
        defer { stopProcess(one.process, with: SIGTERM, grace: 10) }
        var two = try await ServeProcess(port: 0, database: database)
        defer { stopProcess(two.process, with: SIGTERM, grace: 10) }
        let three = disruption == .killTheCallsNodeOfThree ? try await ServeProcess(port: 0, database: database) : nil
        defer { if let three { stopProcess(three.process, with: SIGTERM, grace: 10) } }
        // Alice's door prefers node one, Bob's node two; each falls back to the other (to the
        // third first, if there is one).
        let balancer = try await HAProxy.start(preferences: [[one.port] + [three?.port, two.port].compactMap { $0 },
                                                             [two.port] + [three?.port, one.port].compactMap { $0 }])
        defer { balancer.stop() }
        let aliceDoor = "http://127.0.0.1:\(balancer.ports[0])", bobDoor = "http://127.0.0.1:\(balancer.ports[1])"
        let seconds = 12.0

        let nodes = { [one.port, two.port, three?.port].compactMap { $0 }.map { "http://127.0.0.1:\($0)" } }
        let logs = [directory.appendingPathComponent("alice.jsonl"), directory.appendingPathComponent("bob.jsonl")]
        let listener = try SoftphoneCommandTests.start(["listen", "--server", bobDoor, "--as", "bob", "--play", "tone:660",
                                                        "--record", directory.appendingPathComponent("bob.wav").path, "--once", "--answer", "auto",
                                                        "--quality-log", logs[1].path])
        defer { if listener.0.isRunning { listener.0.terminate() } }
        try await CallChecks.waitForSessions(1, on: nodes(), "bob registers")
        let caller = try SoftphoneCommandTests.start(["call", "bob", "--server", aliceDoor, "--as", "alice", "--play", "tone:440",
                                                      "--record", directory.appendingPathComponent("alice.wav").path,
                                                      "--duration", "\(Int(seconds))", "--quality-log", logs[0].path])
        defer { if caller.0.isRunning { caller.0.terminate() } }

        // The disruption comes while both hear each other, on a call run by node one (alice's).
        try await CallChecks.waitUntilHearing(logs)
        let first = try owner()
        #expect(first.hasPrefix("n"), "the call has a node: \(first)")
        switch disruption {
        case .killTheCallsNode, .killTheCallsNodeOfThree:
            await one.stop(SIGKILL)
        case .killTheOtherNode:
            await two.stop(SIGKILL)
        case .rollingRestart:
            await one.stop(SIGTERM)
            one = try await ServeProcess(port: one.port, database: database)
            // Node two goes only once both phones are on a node again and hear each other anew.
            try await CallChecks.waitForSessions(2, on: nodes(), "both phones are on a node again")
            try await CallChecks.waitUntilHearing(logs, reports: Self.reports(in: logs) + 2)
            await two.stop(SIGTERM)
            two = try await ServeProcess(port: two.port, database: database)
        case .restartPostgreSQL:
            try await postgres.restart()
            for node in [one, two] {
                // A stop past its bound is cancelled, and a stop that ignores that too ends the process.
                try await eventually(timeout: SignalingServer.stopLimit + .seconds(20), "the node on port \(node.port) stops") {
                    !node.process.isRunning
                }
                #expect(node.process.terminationStatus != 0, "a node that lost its listening connection fails, for its supervisor to see")
            }
            one = try await ServeProcess(port: one.port, database: database)
            two = try await ServeProcess(port: two.port, database: database)
        }

        // The call moved where its node went away: another node took it over (and, in a rolling
        // restart, another after it).
        if disruption == .killTheOtherNode {
            // Read once the node that is left knows bob again (he was on node two): by then it has
            // had every chance to take the call from itself, wrongly.
            try await CallChecks.waitForSessions(2, on: [nodes()[0]], "bob is back, on node one")
            #expect(try owner() == first, "the node running the call kept it")
        } else {
            try await eventually("another node runs the call") { try owner() != first }
        }
        let (alice, bob) = await CallChecks.finish(caller: caller, listener: listener, seconds: seconds)
        #expect(alice.status == 0, "\(alice.output)\(alice.errors)")
        #expect(bob.status == 0, "\(bob.output)\(bob.errors)")
        #expect(alice.output.contains("call with bob ended: hung up"), "\(alice.output)")
        #expect(bob.output.contains("ended"), "\(bob.output)")

        // Audio went on through it all: every half second of both recordings, to the end.
        try CallChecks.expectToneInEveryWindow(directory, seconds: seconds)

        // One call, ended once by the hangup, with the whole duration, whichever node is asked.
        #expect(try postgres.psql("SELECT count(*) FROM call", database: name) == "1", "one row of the call in the database")
        for door in [aliceDoor, bobDoor] {
            let calls = try await CallChecks.calls(of: "alice", at: door)
            #expect(calls.count == 1, "\(calls)")
            #expect(calls.first?.reason == .hangup)
            #expect((calls.first?.duration ?? 0) >= seconds - 1, "answered before, ended after")
        }
        await one.stop(SIGTERM)
        await two.stop(SIGTERM)
        await three?.stop(SIGTERM)
    }
}
