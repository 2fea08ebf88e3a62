import Foundation
import ParleyLocalServices
import ParleyServerTesting
import Testing

/// The browser client through server restarts (protocol v1, "Restarts and several nodes").
extension BrowserTests {
    static func waitForNewSession(_ browser: Browser) async throws {
        try await eventually(timeout: .seconds(20), "a new session") {
            let snapshot = try await browser.snapshot()
            return snapshot["connection"] as? String == "online" && snapshot["connectionDetail"] as? String == "new-session"
        }
    }

    @Test func aCallBetweenBrowsersGoesOnThroughARestartAndEndsWhenTheServerLostIt() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("parley-\(UUID().uuidString).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        try await BrowserLab.run(configure: { $0.databasePath = path }) { lab in
            let alice = try await lab.browser(tone: 660)
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(alice, as: "alice")
            try await lab.signIn(bob, as: "bob")
            try await alice.type("#dial-user", "bob\u{E007}")
            try await bob.waitForCall("incoming")
            try await bob.press("\u{E007}")
            try await alice.waitForCall("active")
            try await bob.waitForCall("active")
            try await bob.waitForRemoteTone(660)

            // A deploy: the server stops gracefully and starts again with its store.
            let port = lab.server.port
            try await lab.server.stop()
            let restarted = try await LiveServer.start(databasePath: path) { $0.port = port }
            try await Self.waitForNewSession(alice)
            try await Self.waitForNewSession(bob)
            #expect(try await alice.callState() == "active", "call.state said active: the call goes on")
            #expect(try await bob.callState() == "active")
            try await bob.waitForRemoteTone(660)
            try await alice.waitForRemoteTone(990)

            // A server that comes back without its store no longer knows the call: both pages end it and say why.
            try await restarted.stop()
            let forgetful = try await LiveServer.start { $0.port = port }
            try await Self.waitForNewSession(alice)
            try await alice.waitForCall("ended")
            try await bob.waitForCall("ended")
            #expect(try await alice.call()["endReason"] as? String == "server-lost-call")
            #expect(try await alice.notice().contains("restarted without a record of this call"))
            try await forgetful.stop()
        }
    }

    /// The page's path to the server goes silent without a reset, as a phone's does when its network
    /// drops away: the socket reports nothing. The heartbeat (every 2 s here) goes unanswered, the
    /// page gives the connection up and resumes its session on a new one, and the call goes on.
    @Test func aPageWhoseConnectionGoesSilentNoticesAndResumes() async throws {
        let proxy = try TCPProxy()
        defer { proxy.stop() }
        try await BrowserLab.run(configure: { $0.heartbeat = 2 }) { lab in
            proxy.connect(to: lab.server.port)
            let alice = try await lab.browser(tone: 660, through: proxy.url)
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(alice, as: "alice")
            try await lab.signIn(bob, as: "bob")
            try await alice.type("#dial-user", "bob\u{E007}")
            try await bob.waitForCall("incoming")
            try await bob.press("\u{E007}")
            try await alice.waitForCall("active")
            try await alice.waitForRemoteTone(990)
            #expect(try await alice.snapshot()["connectionDetail"] as? String == "new-session")

            proxy.blackHole()
            try await eventually(timeout: .seconds(20), "alice's page noticed the silent connection and resumed on a new one") {
                let snapshot = try await alice.snapshot()
                return snapshot["connection"] as? String == "online" && snapshot["connectionDetail"] as? String == "resumed"
            }
            #expect(try await alice.callState() == "active")
            try await alice.waitForRemoteTone(990)
            // Signaling reaches the page again: bob's hang-up ends alice's call.
            try await bob.press("\u{E00C}")
            try await alice.waitForCall("ended")
        }
    }
}
