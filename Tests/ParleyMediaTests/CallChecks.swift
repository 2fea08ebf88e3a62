import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyProtocol
import ParleyServerTesting
import Testing

/// What the tests of calls that outlive a server check afterwards: the audio, and the record.
enum CallChecks {
    /// alice.wav and bob.wav in `directory` span the call and hold the other side's tone (Bob
    /// 660 Hz, Alice 440 Hz) in every half second from the first second to the end.
    static func expectToneInEveryWindow(_ directory: URL, seconds: Double,
                                        sourceLocation: SourceLocation = #_sourceLocation) throws {
        let aliceHeard = try Recording(directory.appendingPathComponent("alice.wav"))
        let bobHeard = try Recording(directory.appendingPathComponent("bob.wav"))
        for (recording, hertz, who) in [(aliceHeard, 660.0, "alice"), (bobHeard, 440.0, "bob")] {
            #expect(recording.audio.duration >= seconds - 3, "\(who)'s recording spans the call", sourceLocation: sourceLocation)
            let check = recording.toneInEveryWindow(hertz, from: 1.0, to: recording.audio.duration - 0.5)
            #expect(check.passed, "\(who): \(check)", sourceLocation: sourceLocation)
        }
    }

    /// Waits until the servers at `bases` hold `count` signaling sessions between them, as their
    /// `/metrics` say (`parley_sessions`): the devices are registered (again).
    static func waitForSessions(_ count: Int, on bases: [String], _ what: String) async throws {
        try await eventually(timeout: .seconds(20), what) {
            var total = 0
            for base in bases {
                guard let (data, _) = try? await URLSession.shared.data(from: URL(string: "\(base)/metrics")!) else { continue }
                let line = String(decoding: data, as: UTF8.self).split(separator: "\n").first { $0.hasPrefix("parley_sessions ") }
                total += line.flatMap { Double($0.split(separator: " ").last ?? "") }.map { Int($0) } ?? 0
            }
            return total == count
        }
    }

    /// Waits until every quality log (`parley call|listen --quality-log`) holds `reports` quality
    /// reports: a report is written only for an interval in which media arrived, so each side hears
    /// the other, and has for that many intervals.
    static func waitUntilHearing(_ logs: [URL], reports: Int = 2) async throws {
        try await eventually(timeout: .seconds(20), "both sides hear each other") {
            logs.allSatisfy { log in
                let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
                return text.split(separator: "\n").filter { $0.contains(#""mos":"#) }.count >= reports
            }
        }
    }

    /// Waits for the caller's and the listener's softphones to end. One that never hears the end
    /// is stopped after `seconds` plus a minute, so it fails the test instead of holding it.
    static func finish(caller: (Process, Pipe, Pipe), listener: (Process, Pipe, Pipe),
                       seconds: Double) async -> (alice: SoftphoneCommandTests.Run, bob: SoftphoneCommandTests.Run) {
        let watchdog = Task {
            try await Task.sleep(for: .seconds(seconds + 60))
            caller.0.terminate()
            listener.0.terminate()
        }
        defer { watchdog.cancel() }
        return (await SoftphoneCommandTests.finish(caller), await SoftphoneCommandTests.finish(listener))
    }

    /// The calls `user` sees in `GET /v1/calls` of the server at `base` (development mode).
    static func calls(of user: String, at base: String) async throws -> [CallRecord] {
        var request = URLRequest(url: URL(string: "\(base)/v1/dev/tokens")!)
        request.httpMethod = "POST"
        request.httpBody = Data(#"{"user":"\#(user)"}"#.utf8)
        let token = try JSONDecoder().decode(DevTokenResponse.self, from: try await URLSession.shared.data(for: request).0).token
        var list = URLRequest(url: URL(string: "\(base)/v1/calls")!)
        list.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        return try JSONDecoder().decode(CallList.self, from: try await URLSession.shared.data(for: list).0).calls
    }
}
