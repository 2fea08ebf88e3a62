import Foundation
import ParleyGStreamer
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import ParleySoftphone
import Testing

/// Two Linux clients and a browser in one AudioBridge room on a real Janus.
@Suite("AudioBridge room with Linux clients and Chromium", .serialized, .enabled(if: RoomLab.enabled && BrowserLab.enabled), .timeLimit(.minutes(5)))
struct MixedRoomTests {
    @Test func linuxClientsAndABrowserTalkInOneRoom() async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        try await BrowserLab.run(configure: { $0.janus = JanusSettings(url: janus.url) }) { lab in
            let directory = lab.directory
            let pattern = directory.appendingPathComponent("bursts.wav")
            try RoomLab.writeBursts(to: pattern)
            let alice = try await RoomLab.phone(lab.server, "alice", input: .file(pattern, loop: true), record: nil)
            let bobRecording = directory.appendingPathComponent("bob.wav")
            let bob = try await RoomLab.phone(lab.server, "bob", input: .silence, record: bobRecording)
            defer { Task { await alice.stop(); await bob.stop() } }
            let (aliceRoom, _) = try await RoomLab.join(alice)
            let (bobRoom, bobHears) = try await RoomLab.join(bob)
            let bobConnected = try await bobHears.wait("bob's media up") { $0 == .connected }

            let carol = try await lab.browser(tone: 660)
            try await lab.signIn(carol, as: "carol")
            try await carol.type("#room-name", "lobby\u{E007}")
            try await eventually(timeout: .seconds(15), "carol sees everyone") {
                Set(try await carol.roomPeople().compactMap { $0["display"] as? String }) == ["alice", "bob", "carol"]
            }
            #expect(try await carol.run("return document.getElementById('room-kind').textContent") as? String == "(mixed on the voice server)")

            // Who talks: alice's bursts at carol's (the page's indicator), carol's steady tone at bob's.
            try await eventually(timeout: .seconds(15), "carol sees alice talking") {
                let people = try await carol.run("return [...document.querySelectorAll('#room-people li.talking')].map(li => li.textContent)") as? [String]
                return people?.contains("alice") == true
            }
            try await eventually(timeout: .seconds(15), "alice stops talking at carol's") {
                try await carol.roomPeople().contains { $0["display"] as? String == "alice" && $0["talking"] as? Bool == false }
            }
            let carolTalks = try await bobHears.wait("bob hears carol talking") { if case .talking(let member, true) = $0 { member.display == "carol" } else { false } }
            try await eventually(timeout: .seconds(15), "carol hears alice's 440 Hz") {
                let frequency = (try await carol.snapshot()["room"] as? [String: Any])?["frequency"] as? Double
                return frequency.map { abs($0 - 440) < 20 } ?? false
            }

            // Carol mutes, then leaves: bob is told each.
            try await Task.sleep(until: carolTalks + .seconds(5), clock: .continuous)  // five seconds of carol to judge
            let muting = ContinuousClock.now
            try await carol.click("#room-mute")
            try await bobHears.wait("bob sees carol muted") { if case .muted(let member, true) = $0 { member.display == "carol" } else { false } }
            try await carol.click("#room-leave")
            try await bobHears.wait("bob sees carol leave") { if case .memberLeft(let member) = $0 { member.display == "carol" } else { false } }

            await aliceRoom.leave()
            await bobRoom.leave()
            await bob.stop()
            let heard = try WAV.read(bobRecording)
            // Carol's steady 660 Hz from her first talk to her mute, on bob's recording's timeline
            // (it starts as his media connects): in every second and a half, a quarter second of it.
            // Not every quarter: carol's tone at bob's falls to nothing for about 0.75 s every 3 s,
            // in step with alice's bursts playing at carol's end (measured) — the page's echo
            // canceller ducking her microphone in double talk, as browsers do.
            let from = (carolTalks - bobConnected).seconds + 0.5, to = (muting - bobConnected).seconds - 0.5
            #expect(to - from >= 4, "carol talked at least four seconds before muting (\(from)–\(to) s)")
            #expect(heard.duration >= to, "bob's recording lasts \(heard.duration) s, to beyond carol's mute at \(to) s")
            let quarters = stride(from: from, through: to - 0.25, by: 0.25).map { start in
                (start, AudioAnalysis.toneAmplitude(heard.mono(from: start, length: 0.25), frequency: 660, sampleRate: heard.sampleRate))
            }
            let quiet = stride(from: from, through: to - 1.5, by: 0.25).filter { start in
                !quarters.contains { $0.0 >= start && $0.0 + 0.25 <= start + 1.5 && $0.1 >= 0.03 }
            }
            #expect(quiet.isEmpty, "carol's 660 Hz missing at bob's for 1.5 s from \(quiet) (judged \(from)–\(to) s; each quarter: \(quarters.map { String(format: "%.2f", $0.1) }))")
        }
    }
}
