import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyAPNsTesting
import ParleyLocalServices
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import Testing

/// `parley push test` and `parley serve --apns-…`, as an operator runs them, against the APNs double.
@Suite("parley push", .timeLimit(.minutes(5)))
struct PushCommandTests {
    /// Runs `parley` with `arguments` to its end, on a thread of its own.
    static func parley(_ arguments: [String]) async throws -> (status: Int32, output: String, error: String) {
        let executable = try #require(ServeProcessTests.executable)
        return try await offThePool {
            let process = Process()
            process.executableURL = executable
            process.arguments = arguments
            let output = Pipe(), error = Pipe()
            process.standardOutput = output
            process.standardError = error
            try process.run()
            let out = output.fileHandleForReading.readDataToEndOfFile()
            let err = error.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: out, as: UTF8.self), String(decoding: err, as: UTF8.self))
        }
    }

    static func apnsFlags(_ team: APNsTestTeam, _ apns: APNsDouble) -> [String] {
        ["--apns-key-file", team.keyFile, "--apns-key-id", team.keyID, "--apns-team-id", team.teamID,
         "--apns-url", apns.url.absoluteString, "--apns-ca-file", apns.caFile]
    }

    @Test func pushTestSaysWhatAPNsAnsweredForEachDevice() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let apns = try await team.makeDouble()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-push-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let database = directory.appendingPathComponent("parley.sqlite").path
        let server = try await LiveServer.start(databasePath: database)
        let bob = try await server.token("bob")
        let good = String(repeating: "ab", count: 32), gone = String(repeating: "cd", count: 32)
        for (device, token, environment) in [("iphone", good, "sandbox"), ("old-iphone", gone, "production")] {
            let body = #"{"platform":"ios","voip":{"token":"\#(token)","topic":"net.parley.app","environment":"\#(environment)"}}"#
            #expect(try await server.http("PUT", "/v1/devices/\(device)", token: bob, json: body).status == 200)
            apns.addDevice(token: token, topic: "net.parley.app")
        }
        apns.unregister(token: gone, at: Date())
        #expect(try await server.http("PUT", "/v1/devices/browser", token: bob, json: #"{"platform":"web"}"#).status == 200)

        let run = try await Self.parley(["push", "test", "bob", "--database", database] + Self.apnsFlags(team, apns))
        #expect(run.status == 1, "one device failed: \(run.output) \(run.error)")
        #expect(run.output.contains("iphone: APNs accepted the push"), "\(run.output)")
        #expect(run.output.contains("old-iphone: APNs rejected the token (Unregistered since"), "\(run.output)")
        #expect(run.output.contains("browser: no VoIP token registered (platform web)"), "\(run.output)")
        let push = try #require(apns.delivered.first)
        #expect(push.deviceToken == good)
        #expect(push.pushType == "voip")
        let payload = try JSONDecoder().decode(VoIPPushPayload.self, from: push.body)
        #expect(payload.parley.from.name == "Parley push test")

        // Clear refusals, nothing sent.
        let missing = try await Self.parley(["push", "test", "bob", "--database", database, "--apns-key-file", team.keyFile])
        #expect(missing.status != 0)
        #expect(missing.error.contains("needs all three"), "\(missing.error)")
        let nobody = try await Self.parley(["push", "test", "carol", "--database", database] + Self.apnsFlags(team, apns))
        #expect(nobody.status == 1)
        #expect(nobody.output.contains("carol has no registered device"))
        let noDatabase = try await Self.parley(["push", "test", "bob", "--database", directory.appendingPathComponent("nope.sqlite").path]
            + Self.apnsFlags(team, apns))
        #expect(noDatabase.error.contains("no database at"))
        var wrongKey = Self.apnsFlags(team, apns)
        wrongKey[3] = "not-an-id"
        let badID = try await Self.parley(["push", "test", "bob", "--database", database] + wrongKey)
        #expect(badID.error.contains("key id must be the 10 letters and digits"), "\(badID.error)")
        #expect(apns.requests.count == 2)

        try await server.stop()
        await apns.stop()
        try? FileManager.default.removeItem(at: directory)
    }

    @Test func serveWithTheAPNsFlagsPushesToASleepingDevice() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let apns = try await team.makeDouble()
        let token = String(repeating: "ef", count: 32)
        apns.addDevice(token: token, topic: "net.parley.app")
        let executable = try #require(ServeProcessTests.executable)
        let process = Process()
        process.executableURL = executable
        process.arguments = ["serve", "--port", "0", "--database", ":memory:", "--log-level", "error"] + Self.apnsFlags(team, apns)
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        defer { if process.isRunning { process.terminate() } }
        var printed = ""
        while !printed.contains("/v1/dev/tokens") {
            let chunk = try await offThePool { output.fileHandleForReading.availableData }
            if chunk.isEmpty { break }
            printed += String(decoding: chunk, as: UTF8.self)
        }
        #expect(printed.contains("pushes through APNs at \(apns.url.absoluteString) (key \(team.keyID), team \(team.teamID))"), "\(printed)")
        let range = try #require(printed.range(of: #"127\.0\.0\.1:(\d+)"#, options: .regularExpression))
        let base = "http://" + printed[range]

        func devToken(_ user: String) async throws -> String {
            var request = URLRequest(url: URL(string: base + "/v1/dev/tokens")!)
            request.httpMethod = "POST"
            request.httpBody = Data(#"{"user":"\#(user)"}"#.utf8)
            return try JSONDecoder().decode(DevTokenResponse.self, from: try await URLSession.shared.data(for: request).0).token
        }
        var register = URLRequest(url: URL(string: base + "/v1/devices/iphone")!)
        register.httpMethod = "PUT"
        register.setValue("Bearer \(try await devToken("bob"))", forHTTPHeaderField: "Authorization")
        register.httpBody = Data(#"{"platform":"ios","voip":{"token":"\#(token)","topic":"net.parley.app","environment":"production"}}"#.utf8)
        #expect((try await URLSession.shared.data(for: register).1 as? HTTPURLResponse)?.statusCode == 200)

        let alice = try await WSTestClient.connect(url: base.replacingOccurrences(of: "http", with: "ws") + "/v1/signal", token: devToken("alice"))
        _ = try await alice.hello(device: "a1")
        let invited = try await alice.request { .callInvite(CallInvite(id: $0, call: CallID(uuid: UUID()), to: "bob")) }.get()
            .decodeResult(CallInviteResult.self)
        #expect(invited.pushed == 1)
        try await eventually("the push reached APNs") { !apns.delivered.isEmpty }
        #expect(apns.delivered.first?.deviceToken == token)
        kill(process.processIdentifier, SIGTERM)
        try await offThePool { process.waitUntilExit() }
        #expect(process.terminationStatus == 0)

        // A key that is not one: a clear refusal at start.
        let bad = try await Self.parley(["serve", "--port", "0", "--database", ":memory:", "--apns-key-file", "/nonexistent.p8",
                                         "--apns-key-id", team.keyID, "--apns-team-id", team.teamID])
        #expect(bad.status != 0)
        #expect(bad.error.contains("cannot read the APNs key file /nonexistent.p8"), "\(bad.error)")
        await apns.stop()
    }
}
