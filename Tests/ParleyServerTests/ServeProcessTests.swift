import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

/// `parley serve` as users run it: a separate process, stopped with SIGTERM.
@Suite("parley serve process", .timeLimit(.minutes(5)))
struct ServeProcessTests {
    /// The `parley` executable built beside this test bundle.
    static var executable: URL? {
        let directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
        let candidate = directory.appendingPathComponent("parley")
        return FileManager.default.isExecutableFile(atPath: candidate.path) ? candidate : nil
    }

    /// Runs `parley` with `arguments` to its end; answers its exit status and all it printed.
    static func parley(_ arguments: [String]) throws -> (status: Int32, printed: String) {
        let executable = try #require(executable, "swift build --build-tests builds the parley executable")
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

    @Test func sigtermClosesClientsWith1001EndsNoCallAndTheNextStartRestoresIt() async throws {
        let executable = try #require(Self.executable, "swift build --build-tests builds the parley executable")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-serve-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = directory.appendingPathComponent("calls.sqlite").path

        let process = Process()
        process.executableURL = executable
        process.arguments = ["serve", "--port", "0", "--database", database, "--log-level", "error"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        defer { if process.isRunning { process.terminate() } }

        var printed = ""
        var port: Int?
        while port == nil {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            printed += String(decoding: chunk, as: UTF8.self)
            if let range = printed.range(of: #"127\.0\.0\.1:(\d+)"#, options: .regularExpression) {
                port = Int(printed[range].split(separator: ":").last!)
            }
        }
        let serverPort = try #require(port, "the server printed where it listens: \(printed)")
        while !printed.contains("/v1/dev/tokens") {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            printed += String(decoding: chunk, as: UTF8.self)
        }
        #expect(printed.contains("development mode"), "it says how to get a token")

        let url = "ws://127.0.0.1:\(serverPort)/v1/signal"
        let tokenFor = { (user: String) async throws -> String in
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(serverPort)/v1/dev/tokens")!)
            request.httpMethod = "POST"
            request.httpBody = Data(#"{"user":"\#(user)"}"#.utf8)
            let (data, _) = try await URLSession.shared.data(for: request)
            return try JSONDecoder().decode(DevTokenResponse.self, from: data).token
        }
        let alice = try await WSTestClient.connect(url: url, token: tokenFor("alice"))
        _ = try await alice.hello(device: "a1")
        let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"
        #expect(try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)

        // A refused upgrade is answered (401) and logs nothing at error level: one log line per
        // request would be an attacker's lever on the operator's disk.
        for _ in 0..<3 { #expect(try await RawWebSocket.upgrade(port: serverPort, headers: [:]).status == 401) }

        kill(process.processIdentifier, SIGTERM)
        let code = await alice.closeCode()
        #expect(code == 1001)
        var sentBeforeClose: [ServerMessage] = []
        while let frame = try await alice.next(timeout: .zero) { sentBeforeClose.append(frame.message) }
        #expect(!sentBeforeClose.contains { if case .callEnded = $0 { true } else { false } }, "a graceful stop ends no call")
        process.waitUntilExit()
        #expect(process.terminationReason == .exit)
        #expect(process.terminationStatus == 0)
        printed += String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(!printed.contains(" error "), "nothing was logged at error level: \(printed)")

        let restarted = try await LiveServer.start(databasePath: database)
        let back = try await WSTestClient.connect(url: restarted.signalURL, token: restarted.token("alice"))
        #expect(try await back.hello(device: "a1").resumed == false)
        let state = try await back.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(state.state == .ringing, "the invite still rings after the restart")
        let calls = try await restarted.http("GET", "/v1/calls", token: restarted.token("alice")).decode(CallList.self).calls
        #expect(calls.map(\.call) == [call])
        #expect(calls.first?.endedAt == nil)
        try await restarted.stop()
    }
}

@Suite("parley token", .timeLimit(.minutes(5)))
struct TokenCommandTests {
    func run(_ arguments: [String]) throws -> (status: Int32, output: String, error: String) {
        let executable = try #require(ServeProcessTests.executable)
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        let output = Pipe(), error = Pipe()
        process.standardOutput = output
        process.standardError = error
        try process.run()
        process.waitUntilExit()
        return (process.terminationStatus,
                String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self),
                String(decoding: error.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self))
    }

    @Test func mintsATokenTheServerAccepts() async throws {
        let secret = String(repeating: "s", count: 40)
        let minted = try run(["token", "alice", "--name", "Alice", "--secret", secret, "--ttl", "600"])
        #expect(minted.status == 0)
        let identity = try await TokenAuthority(key: .hs256(secret: secret)).verify(minted.output.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(identity.user == "alice")
        #expect(identity.name == "Alice")
        // 600 s from when it was minted, a moment ago (the process takes a while to start).
        #expect((560...600).contains(identity.expiresAt - Int64(Date().timeIntervalSince1970)), "\(identity.expiresAt)")
    }

    @Test func refusesBadInputWithAMessage() throws {
        let badUser = try run(["token", "not a user"])
        #expect(badUser.status != 0)
        #expect(badUser.error.contains("not a valid user id"))
        let shortSecret = try run(["token", "alice", "--secret", "short"])
        #expect(shortSecret.status != 0)
        #expect(shortSecret.error.contains("at least 32 bytes"))
        let badPort = try run(["serve", "--port", "70000"])
        #expect(badPort.status != 0)
        #expect(badPort.error.contains("--port"))
        // Off loopback, development mode would sign tokens with a public constant: refused before listening.
        let publicDev = try run(["serve", "--host", "0.0.0.0", "--dev", "true", "--port", "0", "--database", ":memory:"])
        #expect(publicDev.status != 0)
        #expect(publicDev.error.contains("token secret"))
        let shortProduction = try run(["serve", "--host", "0.0.0.0", "--token-secret", "short", "--port", "0", "--database", ":memory:"])
        #expect(shortProduction.status != 0)
        #expect(shortProduction.error.contains("at least 32 bytes"))
    }
}
