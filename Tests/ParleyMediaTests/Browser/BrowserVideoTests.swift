import Foundation
import ParleyGStreamer
import ParleyServerTesting
import ParleySoftphone
import Testing

/// Video between the browser client and the Linux softphone, judged by what is in the pictures:
/// each side sees the other's (its colour) and it moves (frames that differ from the one before),
/// through an ICE restart, and a held call's picture stops moving at the far side.
extension BrowserTests {
    /// A 32×24 sample of what the page's `<video id=…>` shows now: mean colour and pixels.
    struct PageFrame {
        var pixels: [Int]  // RGBA
        var color: FrameColor {
            var sums = (0, 0, 0)
            for index in stride(from: 0, to: pixels.count, by: 4) { sums.0 += pixels[index]; sums.1 += pixels[index + 1]; sums.2 += pixels[index + 2] }
            let count = max(1, pixels.count / 4)
            return FrameColor(red: sums.0 / count, green: sums.1 / count, blue: sums.2 / count)
        }
        /// Whether some pixel's channel moved by more than coding noise does (as the engine judges).
        func differs(from other: PageFrame) -> Bool {
            pixels.count == other.pixels.count && zip(pixels, other.pixels).contains { abs($0 - $1) > 48 }
        }
    }

    static func frame(_ browser: Browser, _ element: String) async throws -> PageFrame {
        let script = """
            const v = document.getElementById(arguments[0]);
            if (!v || !v.videoWidth) return [];
            const c = document.createElement('canvas'); c.width = 32; c.height = 24;
            const g = c.getContext('2d'); g.drawImage(v, 0, 0, 32, 24);
            return Array.from(g.getImageData(0, 0, 32, 24).data);
            """
        return PageFrame(pixels: (try await browser.run(script, [element]) as? [Any] ?? []).compactMap { ($0 as? NSNumber)?.intValue })
    }

    /// Ten samples of the page's picture 150 ms apart: how many differed from the one before, and the last.
    static func motion(_ browser: Browser, _ element: String) async throws -> (changed: Int, last: PageFrame) {
        var last = try await frame(browser, element), changed = 0
        for _ in 0..<9 {
            try await Task.sleep(for: .milliseconds(150))
            let next = try await frame(browser, element)
            if next.differs(from: last) { changed += 1 }
            last = next
        }
        return (changed, last)
    }

    @Test func theBrowserAndTheLinuxSoftphoneSeeEachOthersMovingPicture() async throws {
        try await BrowserLab.run { lab in
            let linus = try makePhone(lab.server, "linus", tone: 440, record: nil, picture: 0xE07020)
            try await linus.start()
            let linusLog = EventCollector(linus.events)
            do {
                let alice = try await lab.browser(tone: 660)
                try await lab.signIn(alice, as: "alice")
                let call = try await alice.call("linus", answeredBy: linus, log: linusLog, video: true)
                let peer = try #require(await linus.peerConnection(of: call))
                try await eventually(timeout: .seconds(15), "pictures both ways") {
                    let shown = try await Self.frame(alice, "remote-video")
                    return peer.receivedVideoFrames > 10 && !shown.pixels.isEmpty
                }

                func expectBothMoving(_ when: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
                    let (frames, changes) = (peer.receivedVideoFrames, peer.receivedVideoChanges)
                    let page = try await Self.motion(alice, "remote-video")
                    let linusFrames = peer.receivedVideoFrames - frames, linusChanges = peer.receivedVideoChanges - changes
                    #expect(page.changed >= 7, "the page, \(when): \(page.changed) of 9 samples changed", sourceLocation: sourceLocation)
                    #expect(page.last.color.isClose(to: FrameColor(rgb: 0xE07020)), "the page, \(when): \(page.last.color)", sourceLocation: sourceLocation)
                    #expect(linusFrames >= 10 && linusChanges >= linusFrames * 3 / 4,
                            "linus, \(when): \(linusFrames) frames, \(linusChanges) changed", sourceLocation: sourceLocation)
                    // What linus receives is the page's own camera: the colour of its local preview.
                    let own = try await Self.frame(alice, "local-video").color
                    #expect(peer.receivedVideoColor.map { $0.isClose(to: own) } == true,
                            "linus, \(when): \(String(describing: peer.receivedVideoColor)), the page's camera \(own)", sourceLocation: sourceLocation)
                }
                try await expectBothMoving("at first")

                // The page restarts ICE: new credentials both ways, and the pictures go on.
                let before = try await alice.run(Self.iceUfrags) as? String
                _ = try await alice.run("window.parley.call.restartIce()")
                try await Self.waitForNewIceCredentials(alice, since: before)
                // Chromium may pause its camera's stream for a moment as the new pair takes over
                // (seen on a loaded machine: a second without a frame); it must come back.
                let restarted = peer.receivedVideoFrames
                try await eventually(timeout: .seconds(10), "the page's picture reaches linus again") { peer.receivedVideoFrames >= restarted + 5 }
                try await expectBothMoving("after an ICE restart")

                // Linus holds: his picture stops at the page (the sampler sees it frozen); resumed, it moves.
                await linus.setHeld(call, true)
                try await Task.sleep(for: .milliseconds(500))
                let held = try await Self.motion(alice, "remote-video")
                #expect(held.changed == 0, "the page, while linus holds: \(held.changed) of 9 samples changed")
                await linus.setHeld(call, false)
                try await eventually(timeout: .seconds(10), "linus's picture moves again") { try await Self.motion(alice, "remote-video").changed >= 7 }
                try await expectBothMoving("after the hold")

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
