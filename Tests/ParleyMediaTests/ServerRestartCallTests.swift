import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyProtocol
import ParleyServerTesting
import Testing

/// Protocol v1, "Restarts and several nodes", as users live it: two `parley` softphones in a call,
/// and the `parley serve` between them dies (`kill -9`) or is restarted for a deploy (SIGTERM).
@Suite("A server restart mid-call", .serialized, .timeLimit(.minutes(5)))
struct ServerRestartCallTests {
    /// `parley serve` as a process; answers once it listens.
    final class ServeProcess: @unchecked Sendable {
        let process = Process()
        let port: Int

        init(port: Int, database: String) async throws {
            guard let executable = SoftphoneCommandTests.executable else { throw TestFailure("swift build --build-tests builds parley") }
            process.executableURL = executable
            process.arguments = ["serve", "--port", "\(port)", "--database", database, "--log-level", "error"]
            let output = Pipe()
            process.standardOutput = output
            try process.run()
            let printed: String = try await offThePool {
                var printed = ""
                while !printed.contains("/v1/dev/tokens") {
                    let chunk = output.fileHandleForReading.availableData
                    if chunk.isEmpty { break }
                    printed += String(decoding: chunk, as: UTF8.self)
                }
                return printed
            }
            guard let range = printed.range(of: #"127\.0\.0\.1:(\d+)"#, options: .regularExpression),
                  let listening = Int(printed[range].split(separator: ":").last!) else {
                throw TestFailure("parley serve did not say where it listens: \(printed)")
            }
            self.port = listening
        }

        func stop(_ signal: Int32) async {
            kill(process.processIdentifier, signal)
            _ = try? await offThePool { self.process.waitUntilExit() }
        }
    }

    @Test(arguments: [SIGKILL, SIGTERM])
    func theCallGoesOnWithAudioInEveryWindowAndEndsOnceRecorded(_ stopSignal: Int32) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-restart-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = directory.appendingPathComponent("parley.sqlite").path
        var server = try await ServeProcess(port: 0, database: database)
        defer { if server.process.isRunning { server.process.terminate() } }
        let base = "http://127.0.0.1:\(server.port)"
        let seconds = 14.0

        let logs = [directory.appendingPathComponent("alice.jsonl"), directory.appendingPathComponent("bob.jsonl")]
        let listener = try SoftphoneCommandTests.start(["listen", "--server", base, "--as", "bob", "--play", "tone:660",
                                                        "--record", directory.appendingPathComponent("bob.wav").path, "--once", "--answer", "auto",
                                                        "--quality-log", logs[1].path])
        defer { if listener.0.isRunning { listener.0.terminate() } }
        try await CallChecks.waitForSessions(1, on: [base], "bob registers")
        let caller = try SoftphoneCommandTests.start(["call", "bob", "--server", base, "--as", "alice", "--play", "tone:440",
                                                      "--record", directory.appendingPathComponent("alice.wav").path,
                                                      "--duration", "\(Int(seconds))", "--quality-log", logs[0].path])
        defer { if caller.0.isRunning { caller.0.terminate() } }

        // The restart comes while both hear each other, not after a guess at when that is.
        try await CallChecks.waitUntilHearing(logs)
        await server.stop(stopSignal)
        server = try await ServeProcess(port: server.port, database: database)
        try await CallChecks.waitForSessions(2, on: [base], "both phones are back on the restarted server")

        let (alice, bob) = await CallChecks.finish(caller: caller, listener: listener, seconds: seconds)
        #expect(alice.status == 0, "\(alice.output)\(alice.errors)")
        #expect(bob.status == 0, "\(bob.output)\(bob.errors)")
        #expect(alice.output.contains("call with bob ended: hung up"), "\(alice.output)")

        // Audio went on through the restart: every half second of both recordings, to the end.
        try CallChecks.expectToneInEveryWindow(directory, seconds: seconds)

        // One call, ended once, with the whole duration.
        let calls = try await CallChecks.calls(of: "alice", at: "http://127.0.0.1:\(server.port)")
        #expect(calls.count == 1)
        #expect(calls.first?.reason == .hangup)
        #expect((calls.first?.duration ?? 0) >= seconds - 1, "answered before the restart, ended after it")
        await server.stop(SIGTERM)
    }
}
