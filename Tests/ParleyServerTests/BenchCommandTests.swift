import Foundation
import Testing

/// `parley bench` and `parley bench relay`, short: each drives a real server through its clients,
/// which acknowledge frames as the SDK does, and fails when the server answers a frame of theirs with
/// an error (for three weeks every 32nd frame a bench client read was answered with an ack the server
/// could not read, and every figure the benchmarks printed included the server refusing it).
@Suite("Benchmark commands", .timeLimit(.minutes(5)))
struct BenchCommandTests {
    @Test func callSetupsRunWithEveryFrameTheClientsSendRead() throws {
        // 40 setups between two pairs: each client reads some 280 frames, and acknowledges every 32nd.
        let (status, printed) = try ServeProcessTests.parley(["bench", "--connections", "4", "--calls", "40", "--concurrency", "2"])
        #expect(status == 0, "\(printed)")
        #expect(printed.contains("call setups            40 in"), "\(printed)")
        // The clients did acknowledge, so the server read their acks (an ack it could not read fails the run).
        let acks = printed.split(separator: "\n").first { $0.contains("client acks") }
            .flatMap { $0.split(separator: " ").dropFirst(2).first }.flatMap { Int($0) }
        #expect((acks ?? 0) > 0, "\(printed)")
    }

    /// `parley bench nodes`, short, on two nodes and a private PostgreSQL: every setup crosses
    /// nodes, and the nodes' own counts say what crossed: 13 messages a setup. Delivered: the ring,
    /// the caller's four signals and the end; forwarded to the call's node: the callee's ringing,
    /// accept and four signals, of which only the accept waits for an answer. The same on either
    /// bus: the call's node shows its version on its link, or in its notifications' numbers.
    @Test(arguments: ["direct", "postgres"])
    func twoNodesSendEachOtherThirteenMessagesASetup(bus: String) throws {
        guard TestDatabase.canRun(.postgres, "bench nodes") else { return }
        let (status, printed) = try ServeProcessTests.parley(["bench", "nodes", "--nodes", "2", "--connections", "10", "--calls", "20",
                                                              "--concurrency", "2", "--bus", bus])
        #expect(status == 0, "\(printed)")
        #expect(printed.contains("call setups            20 in"), "\(printed)")
        #expect(printed.contains("across nodes           13.00 messages per call setup (deliver 6.00, reply 1.00, request 1.00, request_unanswered 5.00)"),
                "\(printed)")
    }

    @Test func theRelayRunsWithEveryFrameTheClientsSendRead() throws {
        let (status, printed) = try ServeProcessTests.parley(["bench", "relay", "--idle", "0", "--pairs", "2", "--window", "4", "--seconds", "1", "--rounds", "1"])
        #expect(status == 0, "\(printed)")
        #expect(printed.contains("frames per core-second"), "\(printed)")
    }
}
