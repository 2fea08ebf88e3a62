import Foundation
import Testing

/// `parley bench` and `parley bench relay`, short: each drives a real server through its clients,
/// which acknowledge frames as the SDK does, and fails when the server answers a frame of theirs with
/// an error (for three weeks every 32nd frame a bench client read was answered with an ack the server
/// could not read, and every figure the benchmarks printed included the server refusing it).
@Suite("Benchmark commands", .timeLimit(.minutes(5)))
struct BenchCommandTests {
    /// Runs `parley` with `arguments`; answers its exit status and everything it printed.
    func parley(_ arguments: [String]) throws -> (status: Int32, printed: String) {
        let executable = try #require(ServeProcessTests.executable, "swift build --build-tests builds the parley executable")
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, printed)
    }

    @Test func callSetupsRunWithEveryFrameTheClientsSendRead() throws {
        // 40 setups between two pairs: each client reads some 280 frames, and acknowledges every 32nd.
        let (status, printed) = try parley(["bench", "--connections", "4", "--calls", "40", "--concurrency", "2"])
        #expect(status == 0, "\(printed)")
        #expect(printed.contains("call setups            40 in"), "\(printed)")
    }

    @Test func theRelayRunsWithEveryFrameTheClientsSendRead() throws {
        let (status, printed) = try parley(["bench", "relay", "--idle", "0", "--pairs", "2", "--window", "4", "--seconds", "1", "--rounds", "1"])
        #expect(status == 0, "\(printed)")
        #expect(printed.contains("frames per core-second"), "\(printed)")
    }
}
