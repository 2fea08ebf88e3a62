import ArgumentParser
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleySoftphone

struct Doctor: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check that this machine can make Parley calls: GStreamer and its plugins, sound devices, a loopback call, and a server.",
        discussion: "Exits with status 1 when something a call needs is missing, and says how to fix it."
    )

    @Option(help: "A Parley server to check (its HTTP URL). [PARLEY_SERVER]")
    var server: String?

    func run() async throws {
        var healthy = true
        func report(_ ok: Bool, _ text: String, essential: Bool = true) {
            Console.say("\(ok ? "✓" : (essential ? "✗" : "–")) \(text)")
            if !ok, essential { healthy = false }
        }

        do {
            try GStreamerEngine.check(GStreamerEngine.requiredElements)
            report(true, "GStreamer with webrtcbin, libnice, Opus, DTLS-SRTP and SCTP")
        } catch {
            report(false, "\(error)")
            throw ExitCode.failure
        }
        let video = (try? GStreamerEngine.check(GStreamerEngine.videoElements)) != nil
        report(video, video ? "VP8 video" : "no VP8 video elements (gstreamer1.0-plugins-good)", essential: false)
        let voice = (try? GStreamerEngine.check(GStreamerEngine.voiceElements)) != nil
        report(voice, voice ? "voice processing (webrtcdsp) and device audio" : "no voice processing or device audio elements", essential: false)
        let soundCard = FileManager.default.fileExists(atPath: "/dev/snd") || Serve.env("PULSE_SERVER") != nil
        report(soundCard, soundCard ? "a sound device" : "no sound device: calls send a tone and play nothing unless told otherwise",
               essential: false)

        var logger = Logger(label: "parley.doctor")
        logger.logLevel = .critical
        do {
            let (ice, audio) = try await Self.loopbackCall(logger: logger)
            report(true, String(format: "a loopback call: ICE connected after %.0f ms, first audio after %.0f ms", ice, audio))
        } catch {
            report(false, "a loopback call failed: \(error)")
        }

        if let server = server ?? Serve.env("PARLEY_SERVER") {
            guard let url = URL(string: server) else {
                throw ValidationError("--server must be a URL like http://127.0.0.1:8080")
            }
            var request = URLRequest(url: url.appendingPathComponent("healthz"))
            request.timeoutInterval = 3
            if let (_, response) = try? await URLSession.shared.data(for: request), (response as? HTTPURLResponse)?.statusCode == 200 {
                report(true, "the server at \(server) is up")
                let development = (try? await Softphone.developmentToken(server: url, user: "parley-doctor", name: nil)) != nil
                report(true, development ? "it gives development tokens (parley call --as <user> works)"
                                         : "it is not in development mode: calls need --token")
            } else {
                report(false, "cannot reach the server at \(server) (is `parley serve` running?)")
            }
        }
        await GStreamerEngine.finishWarmUp()
        if !healthy { throw ExitCode.failure }
    }

    /// Two peer connections of the engine, connected to each other directly over loopback.
    static func loopbackCall(logger: Logger) async throws -> (iceMs: Double, audioMs: Double) {
        var configuration = MediaEngineConfiguration()
        configuration.localAddresses = ["127.0.0.1"]
        let engine = try GStreamerEngine(configuration: configuration, logger: logger)
        await GStreamerEngine.finishWarmUp()  // time the call, not the one-off certificate
        let a = try await engine.makePeerConnection(PeerConnectionConfiguration(iceServers: [])) as! GStreamerPeerConnection
        let b = try await engine.makePeerConnection(PeerConnectionConfiguration(iceServers: [])) as! GStreamerPeerConnection
        let call = try await DirectConnection(a, b)
        let ice = (a.iceConnectedAt! - call.started).seconds * 1000
        let audio = (a.remoteAudioStartedAt! - call.started).seconds * 1000
        await call.close()
        return (ice, audio)
    }
}
