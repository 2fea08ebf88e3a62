import Foundation
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import Testing

/// The browser client served at `/`, in real headless Chromium driven over WebDriver, calling
/// another browser and the Linux softphone through the real server.
@Suite("Browser client in Chromium", .serialized, .enabled(if: BrowserLab.enabled), .timeLimit(.minutes(5)))
struct BrowserTests {
    @Test func twoBrowsersCallEachOtherWithAudioBothWays() async throws {
        try await BrowserLab.run { lab in
            let alice = try await lab.browser(tone: 660)
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(alice, as: "alice")
            try await lab.signIn(bob, as: "bob")

            // Keyboard only: type the callee and press Enter; the incoming view focuses Accept.
            try await alice.type("#dial-user", "bob\u{E007}")
            try await bob.waitForCall("incoming")
            #expect(try await bob.run("return document.activeElement.id") as? String == "accept")
            #expect(try await bob.run("return document.getElementById('incoming-text').textContent") as? String == "alice is calling you.")
            try await bob.press("\u{E007}")

            try await alice.waitForCall("active")
            try await bob.waitForCall("active")
            try await alice.waitForRemoteTone(990)
            try await bob.waitForRemoteTone(660)

            // The signaling connection drops mid-call: the page resumes its session and the call goes on.
            let session = try await alice.snapshot()["session"] as? String
            _ = try await alice.run("window.parley.signaling.drop()")
            try await eventually(timeout: .seconds(10), "alice resumed") {
                let snapshot = try await alice.snapshot()
                return snapshot["connectionDetail"] as? String == "resumed" && snapshot["connection"] as? String == "online"
            }
            #expect(try await alice.snapshot()["session"] as? String == session)
            #expect(try await alice.callState() == "active")

            // M mutes: bob is told and hears silence; M again unmutes.
            try await alice.press("m")
            try await eventually("bob sees alice muted") { (try await bob.call()["remote"] as? [String: Any])?["muted"] as? Bool == true }
            try await eventually("bob hears silence") { try await bob.remoteLevel() < -60 }
            #expect(try await bob.run("return document.getElementById('call-remote').textContent") as? String == "alice muted their microphone.")
            try await alice.press("m")
            try await bob.waitForRemoteTone(660)

            // A few seconds of quality samples, then the picture of the call.
            try await eventually(timeout: .seconds(15), "quality samples") {
                (try await alice.call()["qualitySamples"] as? Int ?? 0) >= 6
            }
            let quality = try #require(try await alice.call()["quality"] as? [String: Any])
            let mos = try #require(quality["mos"] as? Double)
            #expect(mos > 3.9 && mos <= 4.5, "a loopback call scores as high as Opus does (4.08): \(quality)")
            let screenshot = BrowserLab.artifacts.appendingPathComponent("browser-call.png")
            try await alice.screenshot(to: screenshot)
            print("screenshot of the in-call page: \(screenshot.path)")

            // Escape hangs up on bob's side; both pages end and say so.
            try await bob.press("\u{E00C}")
            try await alice.waitForCall("ended")
            try await bob.waitForCall("ended")
            #expect(try await alice.notice().hasPrefix("bob hung up."))
            #expect(try await bob.notice().hasPrefix("Call ended."))

            // The call is in both histories, with the quality the page reported.
            try await eventually("history row") {
                let rows = try await alice.run("return document.getElementById('history-rows').textContent") as? String ?? ""
                return rows.contains("bob") && rows.contains("outgoing") && rows.contains("hangup")
            }
            let token = try await lab.server.token("alice")
            let calls = try await lab.server.http("GET", "/v1/calls", token: token).decode(CallList.self).calls
            #expect(calls.first?.callee == "bob")
            #expect((calls.first?.quality?.mos ?? 0) > 3.9)
        }
    }

    /// Two pages connect an audio call while it rings (protocol.md, "Connecting while ringing"):
    /// ICE and DTLS are done on both sides before the answer, and neither page sends or receives a
    /// packet of media nor plays anything until then. A declined call closes the paths on both
    /// sides; an answered one goes on the path made while ringing and each hears the other.
    @Test func twoBrowsersConnectWhileItRingsAndSendNothingBeforeTheAnswer() async throws {
        try await BrowserLab.run { lab in
            let alice = try await lab.browser(tone: 660)
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(alice, as: "alice")
            try await lab.signIn(bob, as: "bob")
            // Every peer connection of the page's call (the caller's paths to each device that rang
            // early, or the call's own): its DTLS state and the media packets it sent and received.
            let media = """
                const call = window.parley.call;
                const paths = [...(call?.early?.values() ?? [])].concat(call?.path ? [call.path] : []);
                window.paths = (window.paths ?? []).concat(paths.filter((p) => !(window.paths ?? []).includes(p)));
                let sent = 0, received = 0;
                for (const path of paths) {
                  (await path.pc.getStats()).forEach((r) => {
                    if (r.type === 'outbound-rtp') sent += r.packetsSent ?? 0;
                    if (r.type === 'inbound-rtp') received += r.packetsReceived ?? 0;
                  });
                }
                return { states: paths.map((p) => p.pc.connectionState), sent, received,
                         playing: document.getElementById('remote-audio').srcObject !== null };
                """
            func ringsConnected(_ page: Browser) async throws -> [String: Any] {
                var last: [String: Any] = [:]
                try await eventually(timeout: .seconds(10), "connected while ringing") {
                    last = try await page.evaluate(media) as? [String: Any] ?? [:]
                    return (last["states"] as? [String]) == ["connected"]
                }
                return last
            }

            for answered in [false, true] {
                try await alice.clear("#dial-user")
                try await alice.type("#dial-user", "bob\u{E007}")
                try await bob.waitForCall("incoming")
                _ = try await ringsConnected(alice)
                _ = try await ringsConnected(bob)
                // Connected, and ringing on: a second and a half in which nothing may flow.
                try await Task.sleep(for: .seconds(1.5))
                for (name, page) in [("alice", alice), ("bob", bob)] {
                    let seen = try await page.evaluate(media) as? [String: Any] ?? [:]
                    #expect(seen["sent"] as? Int == 0 && seen["received"] as? Int == 0 && seen["playing"] as? Bool == false,
                            "\(name) while ringing: \(seen)")
                }
                #expect(try await alice.callState() == "outgoing")
                #expect(try await bob.callState() == "incoming")
                guard answered else {
                    try await bob.click("#decline")
                    try await alice.waitForCall("ended")
                    for page in [alice, bob] {
                        try await eventually("every path closed") {
                            try await page.run("return window.paths.length > 0 && window.paths.every((p) => p.pc.connectionState === 'closed')") as? Bool == true
                        }
                        _ = try await page.run("window.paths = []; return null")
                    }
                    continue
                }
                try await bob.click("#accept")
                try await alice.waitForCall("active")
                try await bob.waitForCall("active")
                try await alice.waitForRemoteTone(990)
                try await bob.waitForRemoteTone(660)
                // On the path made while ringing: the caller's is the one to bob's device.
                #expect(try await alice.run("return window.parley.call.path === window.paths[0] && !!window.parley.call.path.device") as? Bool == true)
                #expect(try await bob.run("return window.parley.call.path === window.paths[0]") as? Bool == true)
                try await alice.click("#hangup")
                try await bob.waitForCall("ended")
            }
        }
    }

    @Test func aBrowserCallsParleyListenAndHangsUp() async throws {
        try await BrowserLab.run { lab in
            let recording = lab.directory.appendingPathComponent("linus.wav")
            let listener = try SoftphoneCommandTests.start(["listen", "--server", lab.server.baseURL, "--as", "linus",
                                                            "--play", "tone:440", "--record", recording.path, "--once", "--answer", "auto"])
            defer { if listener.0.isRunning { listener.0.terminate() } }
            try await lab.waitForSessions(1)
            let alice = try await lab.browser(tone: 660)
            try await lab.signIn(alice, as: "alice")
            try await alice.type("#dial-user", "linus")
            try await alice.click("#dial-button")
            try await alice.waitForCall("active")
            try await alice.waitForRemoteTone(440)

            // The page restarts ICE (as it does when ICE fails): new credentials both ways, audio goes on.
            let ufrags = "return (window.parley.call.pc.localDescription.sdp.match(/a=ice-ufrag:(\\S+)/) || [])[1] + ' ' + (window.parley.call.pc.remoteDescription.sdp.match(/a=ice-ufrag:(\\S+)/) || [])[1]"
            let before = try await alice.run(ufrags) as? String
            _ = try await alice.run("window.parley.call.restartIce()")
            try await eventually(timeout: .seconds(10), "new ICE credentials on both sides") {
                let now = try await alice.run(ufrags) as? String
                let (old, new) = (before?.split(separator: " ") ?? [], now?.split(separator: " ") ?? [])
                return old.count == 2 && new.count == 2 && old[0] != new[0] && old[1] != new[1]
            }
            try await alice.waitForCall("active")
            try await Task.sleep(for: .seconds(1))
            try await alice.waitForRemoteTone(440)
            try await Task.sleep(for: .seconds(1.5))
            try await alice.click("#hangup")
            try await alice.waitForCall("ended")

            let result = await SoftphoneCommandTests.finish(listener)
            #expect(result.status == 0, "\(result.output)\(result.errors)")
            #expect(result.output.contains("incoming call from alice"))
            #expect(result.output.contains("hung up"), "\(result.output)")
            let heard = try WAV.read(recording)
            let tail = heard.mono(from: max(0, heard.duration - 1.5))
            let heardTone = AudioAnalysis.dominantFrequency(tail, sampleRate: heard.sampleRate)
            #expect(heardTone.map { abs($0 - 660) <= 2 } == true, "linus hears the browser's 660 Hz tone: \(heardTone.map { "\($0) Hz" } ?? "silence")")
        }
    }

    @Test func parleyCallRingsABrowserThatAnswers() async throws {
        try await BrowserLab.run { lab in
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(bob, as: "bob")
            let caller = try SoftphoneCommandTests.start(["call", "bob", "--server", lab.server.baseURL, "--as", "linus",
                                                          "--play", "tone:440", "--duration", "4",
                                                          "--record", lab.directory.appendingPathComponent("linus.wav").path])
            defer { if caller.0.isRunning { caller.0.terminate() } }
            try await bob.waitForCall("incoming")
            try await bob.click("#accept")
            try await bob.waitForCall("active")
            try await bob.waitForRemoteTone(440)

            // The Linux side hangs up after its four seconds; the page says so.
            try await bob.waitForCall("ended", timeout: .seconds(20))
            #expect(try await bob.notice().hasPrefix("linus hung up."))
            let result = await SoftphoneCommandTests.finish(caller)
            #expect(result.status == 0, "\(result.output)\(result.errors)")
            let tone = result.output.firstMatch(of: /strongest tone (\d+) Hz/).flatMap { Int($0.1) }
            #expect(tone.map { abs($0 - 990) <= 2 } == true, "linus hears the browser's 990 Hz: \(result.output)")
        }
    }

    @Test func thePageSaysWhatWentWrongInWords() async throws {
        try await BrowserLab.run(configure: { $0.ringTimeout = .seconds(2) }) { lab in
            let alice = try await lab.browser(tone: 660)
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(alice, as: "alice")

            try await alice.type("#dial-user", "carol\u{E007}")
            try await eventually("offline notice") { try await alice.notice() == "carol is not online right now: no device of theirs is signed in." }

            try await lab.signIn(bob, as: "bob")
            try await alice.clear("#dial-user")
            try await alice.type("#dial-user", "bob\u{E007}")
            try await bob.waitForCall("incoming")
            try await bob.click("#decline")
            try await eventually("declined notice") { try await alice.notice() == "bob declined the call." }

            try await alice.click("#dial-button")
            try await bob.waitForCall("incoming")
            try await eventually(timeout: .seconds(6), "no answer") { try await alice.notice() == "bob did not answer." }
            try await eventually("missed") { try await bob.notice() == "You missed a call from alice." }

            try await alice.clear("#dial-user")
            try await alice.type("#dial-user", "alice\u{E007}")
            try await eventually("self-call notice") { try await alice.notice().hasPrefix("You cannot call yourself.") }

            try await lab.server.stop()
            try await eventually(timeout: .seconds(15), "server gone notice") {
                try await alice.notice().hasPrefix("Cannot reach the Parley server at \(lab.server.baseURL)")
            }
            #expect(try await alice.snapshot()["connection"] as? String == "reconnecting")
        }
    }

    @Test func anExpiredTokenSendsThePersonBackToSignIn() async throws {
        try await BrowserLab.run { lab in
            let page = try await lab.browser(tone: 660)
            let token = try await lab.server.token("dana", lifetime: .seconds(6))
            try await page.click("#signin details summary")
            try await page.type("#token-input", token)
            try await page.click("#token-form button")
            try await eventually("online") { try await page.snapshot()["connection"] as? String == "online" }
            try await eventually(timeout: .seconds(10), "signed out") {
                try await page.notice() == "Your sign-in has expired. Please sign in again."
            }
            #expect(try await page.run("return document.getElementById('signin').hidden") as? Bool == false)
        }
    }

    @Test func twoBrowsersTalkInAMeshRoomWithTalkingIndicators() async throws {
        try await BrowserLab.run { lab in
            let alice = try await lab.browser(tone: 660)
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(alice, as: "alice")
            try await lab.signIn(bob, as: "bob")
            try await alice.type("#room-name", "lobby\u{E007}")
            try await eventually("alice in the room") { try await alice.roomPeople().count == 1 }
            try await bob.type("#room-name", "lobby\u{E007}")

            // Both see both; each hears the other talking (their tone), as the indicator shows.
            for (page, other) in [(alice, "bob"), (bob, "alice")] {
                try await eventually(timeout: .seconds(15), "\(other) talking") {
                    try await page.roomPeople().contains { $0["user"] as? String == other && $0["talking"] as? Bool == true }
                }
            }
            try await eventually("the page marks bob talking") {
                let people = try await alice.run("return [...document.querySelectorAll('#room-people li')].map(li => li.className + ':' + li.textContent)") as? [String]
                return people?.contains("talking:bob") == true
            }

            // Muted, alice goes quiet at bob's; leaving removes her.
            try await alice.click("#room-mute")
            try await eventually(timeout: .seconds(10), "alice quiet") {
                try await bob.roomPeople().contains { $0["user"] as? String == "alice" && $0["talking"] as? Bool == false }
            }
            try await alice.click("#room-leave")
            try await eventually("alice gone") { try await bob.roomPeople().map { $0["user"] as? String } == ["bob"] }
        }
    }

    @Test func aVideoCallShowsTheFarSidesPicture() async throws {
        try await BrowserLab.run { lab in
            let alice = try await lab.browser(tone: 660)
            let bob = try await lab.browser(tone: 990)
            try await lab.signIn(alice, as: "alice")
            try await lab.signIn(bob, as: "bob")
            try await alice.click("#dial-video")
            try await alice.type("#dial-user", "bob\u{E007}")
            try await bob.waitForCall("incoming")
            #expect(try await bob.run("return document.getElementById('incoming-text').textContent") as? String == "alice is calling you (video).")
            try await bob.click("#accept")
            for page in [alice, bob] {
                try await eventually(timeout: .seconds(15), "video frames") {
                    (try await page.run("return document.getElementById('remote-video').videoWidth") as? Int ?? 0) > 0
                }
            }
            try await alice.click("#hangup")
            try await bob.waitForCall("ended")
        }
    }

    @Test func theQualityGraphUsesTheSDKsMOSFormula() async throws {
        try await BrowserLab.run { lab in
            let page = try await lab.browser(tone: 660)
            let cases: [(rtt: Double, jitter: Double, loss: Double)] = [(0, 0, 0), (40, 5, 0.5), (150, 20, 3), (400, 60, 12), (900, 100, 40)]
            let arguments = cases.map { "[\($0.rtt), \($0.jitter), \($0.loss)]" }.joined(separator: ", ")
            let answer = try await page.evaluate("""
                const q = await import('/app/quality.js');
                const scores = [\(arguments)].map(([rttMs, jitterMs, lossPct]) => {
                  const r = q.rating({ rttMs, jitterMs, lossPct });
                  return [q.mos(r), q.score(r)];
                });
                const run = (bytesPerSecond) => {
                  const monitor = new q.QualityMonitor();
                  let report;
                  for (let i = 0; i <= 6; i++) {
                    report = monitor.add({ at: i * 1000, rttMs: 30 + i * 20, jitterMs: 4, packetsReceived: 50 * i,
                                           packetsLost: 2 * i, bytesSent: 0, bytesReceived: bytesPerSecond * i });
                  }
                  return report;
                };
                return { scores, report: run(4000), starved: run(1500) };
                """) as? [String: Any]
            let scores = try #require(answer?["scores"] as? [[Double]])
            for (index, input) in cases.enumerated() {
                let rating = EModel.opus.rating(rttMs: input.rtt, jitterMs: input.jitter, lossPct: input.loss)
                #expect(abs(scores[index][0] - EModel.mos(rating: rating)) < 1e-9, "MOS for \(input)")
                #expect(Int(scores[index][1]) == EModel.score(rating: rating), "score for \(input)")
            }
            func swiftReport(bytesPerSecond: Int) -> QualityReport? {
                var monitor = QualityMonitor()
                var swift: QualityReport?
                for i in 0...6 {
                    swift = monitor.add(MediaStatsSample(at: .seconds(i), roundTripTimeMs: Double(30 + i * 20), jitterMs: 4,
                                                         packetsReceived: 50 * i, packetsLost: 2 * i, bytesReceived: bytesPerSecond * i))
                }
                return swift
            }
            // A codec starved to 12 kbit/s costs the same in both.
            let starved = try #require(answer?["starved"] as? [String: Any])
            let starvedSwift = try #require(swiftReport(bytesPerSecond: 1500))
            #expect(abs((starved["mos"] as? Double ?? 0) - starvedSwift.mos) < 1e-9, "\(starved) against \(starvedSwift.mos)")
            let report = try #require(answer?["report"] as? [String: Any])
            let expected = try #require(swiftReport(bytesPerSecond: 4000))
            #expect(starvedSwift.mos < expected.mos - 0.3)
            #expect(abs((report["mos"] as? Double ?? 0) - expected.mos) < 1e-9)
            #expect(abs((report["lossPct"] as? Double ?? 0) - expected.lossPct) < 1e-9)
            #expect(abs((report["bitrateKbps"] as? Double ?? 0) - expected.bitrateKbps) < 1e-9)
            #expect(abs((report["rttMs"] as? Double ?? 0) - expected.rttMs) < 1e-9)
        }
    }
}

extension Browser {
    func roomPeople() async throws -> [[String: Any]] {
        (try await snapshot()["room"] as? [String: Any])?["participants"] as? [[String: Any]] ?? []
    }
}

extension BrowserLab {
    /// Waits until the server counts `count` signaling sessions (a Linux client has signed in).
    func waitForSessions(_ count: Int) async throws {
        try await eventually(timeout: .seconds(15), "\(count) sessions") {
            let metrics = String(decoding: try await server.http("GET", "/metrics").body, as: UTF8.self)
            return metrics.contains("parley_sessions \(count)")
        }
    }
}
