import Foundation
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleySoftphone
import Testing

/// Recording with consent on real calls: alice sends 440 Hz, bob 660 Hz (`withCall`).
@Suite("Call recording with consent", .serialized, .timeLimit(.minutes(5)))
struct CallRecordingTests {
    /// Every tenth of a second from `start` to `end` of a channel: each of `present` at least `loud`
    /// (by default a third of the 0.3 the tones are sent at), each of `absent` and a frequency of
    /// neither at most `faint`. Answers the tenths that fail, described.
    static func tenthsMissing(_ audio: WAV.Audio, channel: Int, present: [Double], absent: [Double] = [],
                              from start: Double, to end: Double, loud: Double = 0.1, faint: Double = 0.03) -> [String] {
        stride(from: start, to: end - 0.1, by: 0.1).compactMap { from in
            let samples = audio.channel(channel, from: from, length: 0.1)
            func amplitude(_ hertz: Double) -> Double { AudioAnalysis.toneAmplitude(samples, frequency: hertz, sampleRate: audio.sampleRate) }
            let weak = present.filter { amplitude($0) < loud }
            let strong = (absent + [550]).filter { amplitude($0) > faint }
            guard !weak.isEmpty || !strong.isEmpty else { return nil }
            return String(format: "%.1f s: ", from) + "weak \(weak) strong \(strong)"
        }
    }

    static func changes(_ phone: Softphone, _ call: UUID) async -> [RecordingConsent.Change] {
        await phone.timeline(of: call)?.recordingChanges ?? []
    }

    @Test func aRecordingHoldsBothVoicesOnlyAfterConsentAndEitherSideStopsIt() async throws {
        try await withCall { call in
            let file = call.directory.appendingPathComponent("call.ogg")

            // bob says no: no file, and alice is told.
            try await call.alice.requestRecording(call.id, to: file.path)
            try await eventually("bob is asked") { await call.bob.timeline(of: call.id)?.callRecording == .asked }
            try await call.talk(for: .seconds(1))
            try await call.bob.answerRecording(call.id, consent: false)
            try await eventually("alice hears no") { await Self.changes(call.alice, call.id).contains(.declinedThere) }
            #expect(!FileManager.default.fileExists(atPath: file.path), "nothing recorded without consent")

            // bob says yes: alice records both voices until bob stops it.
            try await call.alice.requestRecording(call.id, to: file.path)
            try await eventually("bob is asked again") { await call.bob.timeline(of: call.id)?.callRecording == .asked }
            try await call.bob.answerRecording(call.id, consent: true)
            try await eventually("recording on both sides") {
                let alice = await call.alice.timeline(of: call.id)?.callRecording
                let bob = await call.bob.timeline(of: call.id)?.callRecording
                return alice == .on(here: true) && bob == .on(here: false)
            }
            let consented = ContinuousClock.now
            try await call.talk(for: .seconds(3))
            let stopped = ContinuousClock.now
            try await call.bob.stopRecording(call.id)
            try await eventually("alice's recording is finished") { await call.alice.timeline(of: call.id)?.recordedFiles.count == 1 }
            #expect(await Self.changes(call.alice, call.id).contains(.stoppedThere))
            try await call.talk(for: .seconds(1))
            try await call.hangUp(by: call.alice)

            let recorded = try #require(await call.alice.timeline(of: call.id)?.recordedFiles.first)
            #expect(recorded.path == file.path)
            #expect(await call.bob.timeline(of: call.id)?.recordedFiles.isEmpty == true, "the side that agreed records nothing")
            let audio = try OggOpus.read(file)
            #expect(audio.channels == 1)
            // It holds the stretch between consent and stop on the wall clock, and says where that sits
            // in the call (seconds from the media's start, when ICE connected on alice's side).
            let media = try #require(await call.alice.timeline(of: call.id)?.iceConnected)
            func seconds(_ duration: Duration) -> Double { Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18 }
            #expect(abs(recorded.startSeconds - seconds(consented - media)) < 0.1, "starts at the consent")
            #expect(abs(recorded.endSeconds - seconds(stopped - media)) < 0.1, "ends at the stop")
            #expect(abs(audio.duration - seconds(stopped - consented)) < 0.25, "\(audio.duration) s: every second of it")
            #expect(abs((recorded.endSeconds - recorded.startSeconds) - audio.duration) < 0.1)
            // The last 0.4 s may hold the flush of one direction against silence (the mixer's lag).
            let missing = Self.tenthsMissing(audio, channel: 0, present: [440, 660], from: 0.2, to: audio.duration - 0.4)
            #expect(missing.isEmpty, "both voices throughout: \(missing)")
        }
    }

    /// The side that records stops its own recording: its recorder stops, and the other side hears it.
    @Test func theRecordingSideStopsItsOwnRecording() async throws {
        try await withCall { call in
            let file = call.directory.appendingPathComponent("own.ogg")
            try await call.alice.requestRecording(call.id, to: file.path)
            try await eventually("bob is asked") { await call.bob.timeline(of: call.id)?.callRecording == .asked }
            try await call.bob.answerRecording(call.id, consent: true)
            try await eventually("alice records") { await call.alice.timeline(of: call.id)?.callRecording == .on(here: true) }
            try await call.talk(for: .seconds(1.5))
            let stopped = ContinuousClock.now
            try await call.alice.stopRecording(call.id)
            try await eventually("alice's recording is finished") { await call.alice.timeline(of: call.id)?.recordedFiles.count == 1 }
            try await eventually("bob hears it stop") { await Self.changes(call.bob, call.id).contains(.stoppedThere) }
            #expect(await call.bob.timeline(of: call.id)?.callRecording == .off)
            // Stopped then, not at the hangup a second later.
            try await call.talk(for: .seconds(1))
            try await call.hangUp(by: call.alice)
            let recorded = try #require(await call.alice.timeline(of: call.id)?.recordedFiles.first)
            let media = try #require(await call.alice.timeline(of: call.id)?.iceConnected)
            let end = stopped - media
            #expect(abs(recorded.endSeconds - (Double(end.components.seconds) + Double(end.components.attoseconds) / 1e18)) < 0.1)
            #expect(await call.alice.timeline(of: call.id)?.recordedFiles.count == 1)
        }
    }

    @Test func twoChannelsKeepEachVoiceOnItsSideAndTheCallsEndFinishesTheFile() async throws {
        try await withCall { call in
            let file = call.directory.appendingPathComponent("two.ogg")
            try await call.bob.requestRecording(call.id, to: file.path, layout: .twoChannels)
            try await eventually("alice is asked") { await call.alice.timeline(of: call.id)?.callRecording == .asked }
            try await call.alice.answerRecording(call.id, consent: true)
            try await eventually("bob records") { await call.bob.timeline(of: call.id)?.callRecording == .on(here: true) }
            try await call.talk(for: .seconds(2.5))
            try await call.hangUp(by: call.alice)
            try await eventually("bob's file is finished with the call") { await call.bob.timeline(of: call.id)?.recordedFiles.count == 1 }

            let audio = try OggOpus.read(file)
            #expect(audio.channels == 2)
            #expect(audio.duration > 2.3, "\(audio.duration) s")
            let end = audio.duration - 0.4
            let left = Self.tenthsMissing(audio, channel: 0, present: [660], absent: [440], from: 0.2, to: end)
            let right = Self.tenthsMissing(audio, channel: 1, present: [440], absent: [660], from: 0.2, to: end)
            #expect(left.isEmpty, "bob's own voice on the left only: \(left)")
            #expect(right.isEmpty, "alice's voice on the right only: \(right)")
        }
    }
}
