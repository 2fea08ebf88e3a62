import Foundation
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import Testing

/// Two engines wired directly to each other (no signaling server), over loopback.
@Suite struct EngineTests {
    @Test func twoPeersExchangeTonesOverLoopback() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("parley-engine-\(UUID())")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        var a = MediaEngineConfiguration()
        a.input = .tone(hertz: 440)
        a.output = .file(dir.appendingPathComponent("a.wav"))
        a.localAddresses = ["127.0.0.1"]
        var b = a
        b.input = .tone(hertz: 880)
        b.output = .file(dir.appendingPathComponent("b.wav"))
        let logger = Logger(label: "test.engine")
        let alice = try await GStreamerEngine(configuration: a, logger: logger).makePeerConnection(PeerConnectionConfiguration(iceServers: []))
        let bob = try await GStreamerEngine(configuration: b, logger: logger).makePeerConnection(PeerConnectionConfiguration(iceServers: []))
        let pump = Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { for await e in alice.events { print("A", e); if case .localCandidate(let c?) = e { try? await bob.addRemoteCandidate(c) } } }
                group.addTask { for await e in bob.events { print("B", e); if case .localCandidate(let c?) = e { try? await alice.addRemoteCandidate(c) } } }
            }
        }
        let offer = try await alice.createOffer(iceRestart: false)
        print(offer.sdp)
        try await alice.setLocalDescription(offer)
        try await bob.setRemoteDescription(offer)
        let answer = try await bob.createAnswer()
        print(answer.sdp)
        try await bob.setLocalDescription(answer)
        try await alice.setRemoteDescription(answer)
        try await Task.sleep(for: .seconds(3))
        print(try await alice.statistics())
        await alice.close()
        await bob.close()
        pump.cancel()
        let heardByA = try WAV.read(dir.appendingPathComponent("a.wav"))
        let heardByB = try WAV.read(dir.appendingPathComponent("b.wav"))
        print(heardByA.duration, heardByB.duration)
        #expect(AudioAnalysis.dominantFrequency(heardByA.mono(from: 0.5), sampleRate: 48_000) == 880)
        #expect(AudioAnalysis.dominantFrequency(heardByB.mono(from: 0.5), sampleRate: 48_000) == 440)
    }
}
