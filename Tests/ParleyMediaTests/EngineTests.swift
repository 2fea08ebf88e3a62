import Foundation
import Logging
@testable import ParleyGStreamer
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import Testing

/// A directory of a test's own under the temporary directory, removed with the last reference to it.
final class ScratchDirectory: Sendable {
    let url: URL

    init(_ prefix: String) throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// Two peer connections of the engine wired directly to each other (no signaling server), over loopback.
struct DirectCall {
    let connection: DirectConnection
    /// The two recordings' directory, gone with the call.
    private let scratch: ScratchDirectory
    var directory: URL { scratch.url }
    var a: GStreamerPeerConnection { connection.a }
    var b: GStreamerPeerConnection { connection.b }

    /// `prepare` acts on both peer connections before they negotiate.
    init(_ configure: (inout MediaEngineConfiguration, inout MediaEngineConfiguration) -> Void = { _, _ in },
         media: MediaSpec = .audioOnly, prepare: (GStreamerPeerConnection, GStreamerPeerConnection) async -> Void = { _, _ in }) async throws {
        let scratch = try ScratchDirectory("parley-engine")
        self.scratch = scratch
        let directory = scratch.url
        var a = MediaEngineConfiguration()
        a.input = .tone(hertz: 440)
        a.output = .file(directory.appendingPathComponent("a.wav"))
        a.localAddresses = ["127.0.0.1"]
        var b = a
        b.input = .tone(hertz: 880)
        b.output = .file(directory.appendingPathComponent("b.wav"))
        configure(&a, &b)
        let connection = PeerConnectionConfiguration(iceServers: [], media: media)
        let alice = try await GStreamerEngine(configuration: a, logger: testLogger).makePeerConnection(connection) as! GStreamerPeerConnection
        let bob = try await GStreamerEngine(configuration: b, logger: testLogger).makePeerConnection(connection) as! GStreamerPeerConnection
        await prepare(alice, bob)
        self.connection = try await DirectConnection(alice, bob)
    }

    func close() async { await connection.close() }

    /// What A heard, and what B heard.
    func recordings() throws -> (a: WAV.Audio, b: WAV.Audio) {
        (try WAV.read(directory.appendingPathComponent("a.wav")), try WAV.read(directory.appendingPathComponent("b.wav")))
    }
}

func tone(_ audio: WAV.Audio, from start: Double = 0.5, length: Double? = nil) -> Double? {
    AudioAnalysis.dominantFrequency(audio.mono(from: start, length: length), sampleRate: audio.sampleRate)
}

@Suite("GStreamer engine", .serialized)
struct EngineTests {
    @Test func twoPeersExchangeTonesAndStatistics() async throws {
        let timersBefore = GStreamerEngine.dtlsHandshakesWithShortTimer
        let agentsBefore = GStreamerEngine.iceAgents
        let call = try await DirectCall()
        try await Task.sleep(for: .seconds(2))
        let stats = try await call.a.statistics()
        await call.close()
        let heard = try call.recordings()
        #expect(tone(heard.a) == 880)
        #expect(tone(heard.b) == 440)
        #expect(stats.packetsReceived > 50)
        #expect(stats.bytesSent > 1000)
        #expect(stats.roundTripTimeMs != nil, "RTT from the remote-inbound-rtp report")
        #expect(stats.jitterMs != nil)
        #expect((stats.audioLevel ?? 0) > 0.05)
        // Both ends' DTLS handshakes ran on Parley's timer: GStreamer's plugin bound to the
        // process's SSL_new, not straight to OpenSSL's.
        #expect(GStreamerEngine.dtlsHandshakesWithShortTimer - timersBefore >= 2)
        // Both ends' ICE agents were made through Parley's wrapper and nominate aggressively (what
        // each libnice agent says of itself), where webrtcbin asks for regular nomination.
        let agents = GStreamerEngine.iceAgents
        #expect(agents.made - agentsBefore.made >= 2)
        #expect(agents.nominatingAggressively - agentsBefore.nominatingAggressively >= 2)
    }

    /// A lost handshake flight goes again after 150 ms, then 300, 600 ms, 1.2 s and every 2.4 s:
    /// under 20 % loss OpenSSL's 1, 2, 4, 8 s held a call's first audio back by up to 14 s.
    @Test func dtlsFlightsAreSentAgainSoonerThanOpenSSLWould() {
        var timers: [Duration] = []
        var timer: Duration?
        for _ in 0..<7 {
            timer = GStreamerEngine.dtlsTimer(after: timer)
            timers.append(timer!)
        }
        #expect(timers == [.milliseconds(150), .milliseconds(300), .milliseconds(600), .milliseconds(1200),
                           .milliseconds(2400), .milliseconds(2400), .milliseconds(2400)])
    }

    @Test func aMicrophoneMutedBeforeTheCallConnectsStaysMutedUntilUnmuted() async throws {
        // Muted (and held then resumed) before the send chains exist: they start muted.
        let call = try await DirectCall(prepare: { a, _ in
            await a.setMicrophoneMuted(true)
            await a.setOnHold(true)
            await a.setOnHold(false)
        })
        try await Task.sleep(for: .seconds(1.5))
        let unmutedAt = try call.recordings().b.duration
        await call.a.setMicrophoneMuted(false)
        try await Task.sleep(for: .seconds(1.5))
        await call.close()
        let heard = try call.recordings()
        #expect(AudioAnalysis.isSilent(heard.b.mono(from: 0, length: unmutedAt)), "nothing of A's tone while muted")
        #expect(tone(heard.b, from: unmutedAt + 0.5) == 440)
        #expect(tone(heard.a) == 880, "B was never muted")
    }

    @Test func answerTakesTheOffersOpusPayloadType() async throws {
        let call = try await DirectCall { a, _ in a.opusOfferPayloadType = 109 }
        let answer = try #require(call.b.currentLocalSDP)
        #expect(SDPText.payloadType(of: "opus", in: answer) == 109)
        try await Task.sleep(for: .seconds(1.5))
        await call.close()
        let heard = try call.recordings()
        #expect(tone(heard.a) == 880)
        #expect(tone(heard.b) == 440)
    }

    @Test func bitrateChangesLiveWhenTheControllerSaysSo() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-noise-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let noise = try Self.noise(in: directory)
        let call = try await DirectCall { a, _ in a.input = .file(noise, loop: true) }
        func sendRate(over seconds: Double) async throws -> Double {
            let before = try await call.a.statistics()
            try await Task.sleep(for: .seconds(seconds))
            let after = try await call.a.statistics()
            return Double(after.bytesSent - before.bytesSent) * 8 / 1000 / seconds
        }
        await call.a.setAudioEncoding(BitrateController.Setting(bitrateKbps: 96, fec: false, expectedLossPct: 0))
        try await Task.sleep(for: .milliseconds(300))
        let high = try await sendRate(over: 1.5)
        await call.a.setAudioEncoding(BitrateController.Setting(bitrateKbps: 16, fec: true, expectedLossPct: 10))
        try await Task.sleep(for: .milliseconds(300))
        let low = try await sendRate(over: 1.5)
        await call.close()
        #expect(high > 70, "about 96 kbps of Opus: \(high)")
        #expect(low < 30, "about 16 kbps of Opus: \(low)")
    }

    /// Half a second of white noise, in `directory`: Opus spends whatever bitrate it is given on it.
    static func noise(in directory: URL) throws -> URL {
        let url = directory.appendingPathComponent("noise.wav")
        var generator = SystemRandomNumberGenerator()
        let samples = (0..<24_000).map { _ in Float.random(in: -0.3...0.3, using: &generator) }
        try WAV.write(WAV.Audio(sampleRate: 48_000, channels: 1, samples: samples), to: url)
        return url
    }

    @Test func wavFileInputPlaysOnceOrLooped() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-wav-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let clip = directory.appendingPathComponent("clip.wav")
        let samples = (0..<24_000).map { Float(0.4 * sin(2 * Double.pi * 1000 * Double($0) / 48_000)) }  // 0.5 s of 1 kHz
        try WAV.write(WAV.Audio(sampleRate: 48_000, channels: 1, samples: samples), to: clip)
        let call = try await DirectCall { a, b in
            a.input = .file(clip, loop: false)
            b.input = .file(clip, loop: true)
        }
        try await Task.sleep(for: .seconds(2.5))
        await call.close()
        let heard = try call.recordings()
        // B hears A's clip once, then silence; A hears B's clip again and again.
        let clipTenths = stride(from: 0.0, to: 1.5, by: 0.1).filter { from in
            AudioAnalysis.toneAmplitude(heard.b.mono(from: from, length: 0.1), frequency: 1000, sampleRate: heard.b.sampleRate) > 0.1
        }
        #expect((3...7).contains(clipTenths.count), "the half-second clip, heard once: \(clipTenths)")
        #expect(AudioAnalysis.isSilent(heard.b.mono(from: 1.5, length: 0.8)))
        #expect(tone(heard.a, from: 1.5, length: 0.8) == 1000)
        #expect(AudioAnalysis.level(heard.a.mono(from: 1.5, length: 0.8)) > -20)
    }

    @Test func videoFlowsWhenTheCallAsksForIt() async throws {
        let (orange, teal) = (FrameColor(rgb: 0xE07020), FrameColor(rgb: 0x20A0A0))
        // A sends the moving pattern on orange; B a still teal picture, as a frozen camera would.
        let call = try await DirectCall({ a, b in
            a.video.background = 0xE07020
            b.video.solidColor = 0x20A0A0
        }, media: MediaSpec(audio: true, video: true))
        try await eventually(timeout: .seconds(10), "video frames both ways") { call.a.receivedVideoFrames > 10 && call.b.receivedVideoFrames > 10 }
        // Each side sees the other's picture, not its own nor a blank one.
        try await eventually(timeout: .seconds(5), "each picture arrives") {
            call.b.receivedVideoColor.map { $0.isClose(to: orange) } == true && call.a.receivedVideoColor.map { $0.isClose(to: teal) } == true
        }
        #expect(call.a.receivedVideoColor.map { $0.isClose(to: orange) } == false)
        // The moving picture changes from frame to frame at B's; the still one never does at A's:
        // the motion check tells a frozen picture from a live one.
        func motion(over seconds: Double) async throws -> (a: (frames: Int, changes: Int), b: (frames: Int, changes: Int)) {
            let before = (a: (call.a.receivedVideoFrames, call.a.receivedVideoChanges), b: (call.b.receivedVideoFrames, call.b.receivedVideoChanges))
            try await Task.sleep(for: .seconds(seconds))
            return ((call.a.receivedVideoFrames - before.a.0, call.a.receivedVideoChanges - before.a.1),
                    (call.b.receivedVideoFrames - before.b.0, call.b.receivedVideoChanges - before.b.1))
        }
        let live = try await motion(over: 2)
        #expect(live.b.frames >= 20 && live.b.changes >= live.b.frames * 3 / 4, "the moving picture at B's: \(live.b)")
        #expect(live.a.frames >= 20 && live.a.changes == 0, "the still picture at A's: \(live.a)")

        // Hold stops the picture; resuming brings it back, moving.
        await call.a.setOnHold(true)
        try await Task.sleep(for: .milliseconds(500))  // what was in flight arrives
        let held = try await motion(over: 1.5)
        #expect(held.b.frames <= 2, "no picture while held: \(held.b)")
        await call.a.setOnHold(false)
        let framesAtResume = call.b.receivedVideoFrames
        try await eventually(timeout: .seconds(5), "the picture is back") { call.b.receivedVideoFrames > framesAtResume + 5 }
        let resumed = try await motion(over: 2)
        #expect(resumed.b.frames >= 20 && resumed.b.changes >= resumed.b.frames * 3 / 4, "the moving picture after the hold: \(resumed.b)")
        #expect(call.b.receivedVideoColor.map { $0.isClose(to: orange) } == true)

        // The audio's statistics are found beside video: GStreamer 1.22 labels every bundled
        // stream "video", and a quality report of zeros once hid that.
        try await eventually(timeout: .seconds(5), "the audio's statistics") {
            guard let stats = try? await call.a.statistics() else { return false }
            return stats.packetsReceived > 50 && stats.packetsSent > 50 && stats.jitterMs != nil
        }
        await call.close()
        #expect(try tone(call.recordings().b, length: 1.5) == 440, "before the hold")
    }

    @Test func noiseSuppressionLowersANoiseOnlyInput() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-ns-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let noise = directory.appendingPathComponent("noise.wav")
        var generator = SystemRandomNumberGenerator()
        let samples = (0..<(48_000 * 3)).map { _ in Float.random(in: -0.2...0.2, using: &generator) }
        try WAV.write(WAV.Audio(sampleRate: 48_000, channels: 1, samples: samples), to: noise)
        func process(voice: Bool) async throws -> Double {
            var configuration = MediaEngineConfiguration()
            configuration.input = .file(noise, loop: false)
            configuration.voiceProcessing = voice
            let out = directory.appendingPathComponent("out-\(voice).wav")
            try await MediaPipeline.run(PipelineDescription.audioInput(configuration) + " ! audioconvert ! audio/x-raw,format=S16LE,rate=48000,channels=1"
                                        + " ! wavenc ! filesink location=\(PipelineDescription.quoted(out.path))", for: .seconds(2.5))
            let audio = try WAV.read(out)
            return AudioAnalysis.level(audio.mono(from: 1, length: 1.2))
        }
        let raw = try await process(voice: false)
        let suppressed = try await process(voice: true)
        #expect(raw > -25, "the noise is there without processing")
        #expect(suppressed < raw - 6, "noise suppression takes at least 6 dB off noise (\(raw) → \(suppressed) dBFS)")
    }

    @Test func badInputsGiveClearErrors() async throws {
        var configuration = MediaEngineConfiguration()
        configuration.localAddresses = ["not-an-address"]
        let engine = try GStreamerEngine(configuration: configuration, logger: testLogger)
        await #expect(throws: MediaEngineError.self) { _ = try await engine.makePeerConnection(PeerConnectionConfiguration(iceServers: [])) }
        configuration.localAddresses = ["127.0.0.1"]
        let peer = try await GStreamerEngine(configuration: configuration, logger: testLogger).makePeerConnection(PeerConnectionConfiguration(iceServers: []))
        await #expect(throws: MediaEngineError.self) { try await peer.setRemoteDescription(SessionDescription(type: "offer", sdp: "not sdp")) }
        await #expect(throws: MediaEngineError.self) { try await peer.setRemoteDescription(SessionDescription(type: "bogus", sdp: "v=0\r\n")) }
        // No RFC 4733 sender: the engine says so before the SDK asks, and refuses if asked.
        #expect(!peer.canSendDTMF)
        await #expect(throws: MediaEngineError.self) { try await peer.sendDTMF("1") }
        await peer.close()
        await #expect(throws: MediaEngineError.self) { _ = try await peer.createOffer(iceRestart: false) }
    }

    @Test func iceServerURLsBecomeWebrtcbinURIs() {
        #expect(IceURL.stun("stun:127.0.0.1:3478") == "stun://127.0.0.1:3478")
        #expect(IceURL.turn("turn:10.0.0.1:3478?transport=udp", username: "1700000000:alice", credential: "a+b/c=")
                == "turn://1700000000%3Aalice:a%2Bb%2Fc%3D@10.0.0.1:3478?transport=udp")
        #expect(IceURL.turn("turn:10.0.0.1:3478", username: nil, credential: nil) == nil)
        #expect(IceURL.stun("turn:x") == nil)
    }

    @Test func sdpHelpersReadAndRewriteWhatTheEngineNeeds() {
        let sdp = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\na=ice-ufrag:abcd\r\na=ice-pwd:0123456789012345678901\r\na=rtpmap:111 OPUS/48000/2\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=mid:1\r\na=ice-ufrag:abcd\r\n"
        #expect(SDPText.mids(sdp) == ["0", "1"])
        #expect(SDPText.payloadType(of: "opus", in: sdp) == 111)
        #expect(SDPText.iceUfrag(sdp) == "abcd")
        let restarted = SDPText.replacingIceCredentials(in: sdp, ufrag: "wxyz", password: "p")
        #expect(SDPText.iceUfrag(restarted) == "wxyz")
        #expect(!restarted.contains("abcd"))
        #expect(restarted.contains("a=rtpmap:111 OPUS/48000/2\r\n"))
    }
}
