import Foundation
import ParleyServerTesting
import ParleySoftphone
import Testing

/// ICE restarts between the browser client and the Linux softphone: only the caller restarts ICE,
/// and the callee, browser or Linux, asks it to (`call.signal {restartIce: true}`).
extension BrowserTests {
    /// The page's local and remote ICE username fragments, space-separated.
    static let iceUfrags = "return (window.parley.call.pc.localDescription.sdp.match(/a=ice-ufrag:(\\S+)/) || [])[1] + ' '"
        + " + (window.parley.call.pc.remoteDescription.sdp.match(/a=ice-ufrag:(\\S+)/) || [])[1]"

    /// Waits until both of the page's ICE credentials differ from `before`.
    static func waitForNewIceCredentials(_ browser: Browser, since before: String?) async throws {
        try await eventually(timeout: .seconds(10), "new ICE credentials on both sides") {
            let now = try await browser.run(iceUfrags) as? String
            let (old, new) = (before?.split(separator: " ") ?? [], now?.split(separator: " ") ?? [])
            return old.count == 2 && new.count == 2 && old[0] != new[0] && old[1] != new[1]
        }
    }

    @Test func aBrowserCalleeAsksTheLinuxCallerToRestartICE() async throws {
        try await BrowserLab.run { lab in
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(bob, as: "bob")
            let linus = try makePhone(lab.server, "linus", tone: 440, record: nil)
            try await linus.start()
            do {
                let call = await linus.call("bob")
                try await bob.waitForCall("incoming")
                try await bob.click("#accept")
                try await bob.waitForCall("active")
                try await bob.waitForRemoteTone(440)
                let linusPeer = try #require(await linus.peerConnection(of: call))

                // What the page does when ICE fails: as the callee, it asks rather than offers.
                let before = try await bob.run(Self.iceUfrags) as? String
                _ = try await bob.run("window.parley.call.restartIce()")
                try await Self.waitForNewIceCredentials(bob, since: before)
                #expect(try await bob.run("return window.parley.call.pc.localDescription.type") as? String == "answer",
                        "the restart was the Linux caller's offer, not the page's")
                #expect(linusPeer.iceRestartCount == 1)
                try await bob.waitForCall("active")
                try await bob.waitForRemoteTone(440)
                await linus.hangUp(call)
                try await bob.waitForCall("ended")
            } catch {
                await linus.stop()
                throw error
            }
            await linus.stop()
        }
    }

    @Test func aLinuxCalleeAsksTheBrowserCallerToRestartICE() async throws {
        try await BrowserLab.run { lab in
            let linus = try makePhone(lab.server, "linus", tone: 440, record: nil)
            try await linus.start()
            let linusLog = EventCollector(linus.events)
            do {
                let alice = try await lab.browser(tone: 660)
                try await lab.signIn(alice, as: "alice")
                _ = try await alice.call("linus", answeredBy: linus, log: linusLog)
                try await alice.waitForRemoteTone(440)

                // Linus's network changes: he asks, and the page restarts ICE with an offer.
                let before = try await alice.run(Self.iceUfrags) as? String
                await linus.networkChanged()
                try await Self.waitForNewIceCredentials(alice, since: before)
                #expect(try await alice.run("return window.parley.call.pc.localDescription.type") as? String == "offer")
                try await alice.waitForCall("active")
                try await alice.waitForRemoteTone(440)
                try await alice.click("#hangup")
                try await alice.waitForCall("ended")
            } catch {
                await linus.stop()
                throw error
            }
            await linus.stop()
        }
    }
}
