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
    }

    @Test func theRelayRunsWithEveryFrameTheClientsSendRead() throws {
        let (status, printed) = try ServeProcessTests.parley(["bench", "relay", "--idle", "0", "--pairs", "2", "--window", "4", "--seconds", "1", "--rounds", "1"])
        #expect(status == 0, "\(printed)")
        #expect(printed.contains("frames per core-second"), "\(printed)")
    }
}
