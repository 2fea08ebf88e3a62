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
            try await bobHears.wait("bob hears carol talking") { if case .talking(let member, true) = $0 { member.display == "carol" } else { false } }
            try await eventually(timeout: .seconds(15), "carol hears alice's 440 Hz") {
                let frequency = (try await carol.snapshot()["room"] as? [String: Any])?["frequency"] as? Double
                return frequency.map { abs($0 - 440) < 20 } ?? false
            }

            // Carol mutes, then leaves: bob is told each.
            try await carol.click("#room-mute")
            try await bobHears.wait("bob sees carol muted") { if case .muted(let member, true) = $0 { member.display == "carol" } else { false } }
            try await carol.click("#room-leave")
            try await bobHears.wait("bob sees carol leave") { if case .memberLeft(let member) = $0 { member.display == "carol" } else { false } }

            await aliceRoom.leave()
            await bobRoom.leave()
            await bob.stop()
            let heard = try WAV.read(bobRecording)
            // Half-second windows where carol's 660 Hz is the strongest sound (alice quiet between bursts).
            let windows = stride(from: 0.0, to: heard.duration - 0.5, by: 0.5).filter { start in
                AudioAnalysis.dominantFrequency(heard.mono(from: start, length: 0.5), sampleRate: heard.sampleRate).map { abs($0 - 660) <= 2 } == true
            }
            #expect(windows.count >= 2, "bob heard carol's 660 Hz through the mixer")
        }
    }
}
