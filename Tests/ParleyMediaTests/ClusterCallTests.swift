import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyProtocol
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
        var testDescription: String { rawValue }
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
        defer { if one.process.isRunning { one.process.terminate() } }
        var two = try await ServeProcess(port: 0, database: database)
        defer { if two.process.isRunning { two.process.terminate() } }
        // Alice's door prefers node one, Bob's node two; each falls back to the other.
        let balancer = try await HAProxy.start(preferences: [[one.port, two.port], [two.port, one.port]])
        defer { balancer.stop() }
        let aliceDoor = "http://127.0.0.1:\(balancer.ports[0])", bobDoor = "http://127.0.0.1:\(balancer.ports[1])"
        let seconds = 18.0

        let listener = try SoftphoneCommandTests.start(["listen", "--server", bobDoor, "--as", "bob", "--play", "tone:660",
                                                        "--record", directory.appendingPathComponent("bob.wav").path, "--once", "--answer", "auto"])
        defer { if listener.0.isRunning { listener.0.terminate() } }
        try await Task.sleep(for: .seconds(1))  // bob registers
        let caller = try SoftphoneCommandTests.start(["call", "bob", "--server", aliceDoor, "--as", "alice", "--play", "tone:440",
                                                      "--record", directory.appendingPathComponent("alice.wav").path,
                                                      "--duration", "\(Int(seconds))"])
        defer { if caller.0.isRunning { caller.0.terminate() } }

        try await Task.sleep(for: .seconds(4))  // the call is connected and talking, run by node one (alice's)
        let first = try owner()
        #expect(first.hasPrefix("n"), "the call has a node: \(first)")
        switch disruption {
        case .killTheCallsNode:
            await one.stop(SIGKILL)
        case .killTheOtherNode:
            await two.stop(SIGKILL)
        case .rollingRestart:
            await one.stop(SIGTERM)
            try await Task.sleep(for: .seconds(1))
            one = try await ServeProcess(port: one.port, database: database)
            try await Task.sleep(for: .seconds(3))
            await two.stop(SIGTERM)
            try await Task.sleep(for: .seconds(1))
            two = try await ServeProcess(port: two.port, database: database)
        }

        // The call moved where its node went away: another node took it over (and, in a rolling
        // restart, another after it).
        if disruption == .killTheOtherNode {
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
        for door in [aliceDoor, bobDoor] {
            let calls = try await CallChecks.calls(of: "alice", at: door)
            #expect(calls.count == 1, "\(calls)")
            #expect(calls.first?.reason == .hangup)
            #expect((calls.first?.duration ?? 0) >= seconds - 1, "answered before, ended after")
        }
        await one.stop(SIGTERM)
        await two.stop(SIGTERM)
    }
}
