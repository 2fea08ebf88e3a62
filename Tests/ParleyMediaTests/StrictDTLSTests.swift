import Foundation
@testable import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import Testing

/// aiortc, a WebRTC stack written by others (installed from PyPI into .build-python by
/// `scripts/setup.sh --tests`), answers the engine's offer and so is the DTLS client. Its client
/// offers only ECDHE-ECDSA cipher suites, as RFC 8827 allows: with GStreamer's own RSA certificate
/// no suite is shared and the handshake fails, with nothing heard either way.
@Suite("A strict third-party DTLS client", .serialized, .timeLimit(.minutes(5)))
struct StrictDTLSTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test func anECDSAOnlyClientCompletesTheHandshakeAndAudioFlowsBothWays() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-strict-dtls-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var configuration = MediaEngineConfiguration()
        configuration.input = .tone(hertz: 440)
        configuration.output = .file(directory.appendingPathComponent("parley.wav"))
        configuration.localAddresses = ["127.0.0.1"]
        let peer = try await GStreamerEngine(configuration: configuration, logger: testLogger)
            .makePeerConnection(PeerConnectionConfiguration(iceServers: [])) as! GStreamerPeerConnection

        let aiortc = try AiortcAnswerer(tone: 660, record: directory.appendingPathComponent("aiortc.wav"), seconds: 3)
        defer { aiortc.stop() }
        let offer = try await peer.createOffer(iceRestart: false)
        // The offer names the certificate the engine really uses: aiortc checks it against the
        // fingerprint, and fails the handshake on a mismatch.
        #expect(SDPText.fingerprint(offer.sdp) == GStreamerEngine.dtlsFingerprint)
        try await peer.setLocalDescription(offer)
        try aiortc.send(["offer": offer.sdp])
        for await event in peer.events {
            guard case .localCandidate(let candidate) = event else { continue }
            guard let candidate else { break }
            try aiortc.send(["candidate": candidate.candidate, "sdpMid": candidate.sdpMid ?? "0", "sdpMLineIndex": candidate.sdpMLineIndex ?? 0])
        }
        try aiortc.send(["candidate": NSNull()])

        let answer = try #require(try await aiortc.next("answer") as? String)
        #expect(answer.contains("a=setup:active"), "aiortc answers as the DTLS client")
        try await peer.setRemoteDescription(SessionDescription(type: "answer", sdp: answer))

        // aiortc says when its DTLS transport connects, records for three seconds, and says done.
        let done = try await aiortc.next("done")
        let connected = peer.connectedAt
        await peer.close()
        #expect(connected != nil, "webrtcbin's connection state: ICE and DTLS up")
        #expect(aiortc.said("dtls").contains { $0 as? String == "connected" }, "aiortc's DTLS states: \(aiortc.said("dtls"))")
        try #require(done as? Bool == true, "aiortc: \(aiortc.said("why"))")

        // Both ways, all the way: every half second from the first one on.
        let heardByParley = try Recording(directory.appendingPathComponent("parley.wav"))
        let heardByAiortc = try Recording(directory.appendingPathComponent("aiortc.wav"))
        // aiortc records three seconds once connected; each recording holds only what was decoded,
        // so its length is how long the audio came.
        #expect(heardByAiortc.audio.duration > 2.7, "aiortc heard \(heardByAiortc.audio.duration) s of the 3")
        #expect(heardByParley.audio.duration > 2.5, "Parley heard \(heardByParley.audio.duration) s")
        let parleyHeard = heardByParley.toneInEveryWindow(660, from: 1)
        let aiortcHeard = heardByAiortc.toneInEveryWindow(440, from: 1)
        #expect(parleyHeard.passed, "Parley heard: \(parleyHeard)")
        #expect(aiortcHeard.passed, "aiortc heard: \(aiortcHeard)")
    }
}

/// `Tests/ParleyMediaTests/Peers/aiortc_answerer.py`, spoken to in JSON lines.
final class AiortcAnswerer: @unchecked Sendable {
    private let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private let errors: URL
    private let lock = NSLock()
    private var messages: [[String: Any]] = []
    private var buffer = Data()
    private var ended = false

    init(tone: Double, record: URL, seconds: Double) throws {
        let python = StrictDTLSTests.root.appendingPathComponent(".build-python/bin/python")
        guard FileManager.default.isExecutableFile(atPath: python.path) else {
            throw AiortcFailure("aiortc is not installed in .build-python: run scripts/setup.sh --tests")
        }
        errors = record.deletingLastPathComponent().appendingPathComponent("aiortc-stderr.txt")
        _ = FileManager.default.createFile(atPath: errors.path, contents: nil)
        process.executableURL = python
        process.arguments = [StrictDTLSTests.root.appendingPathComponent("Tests/ParleyMediaTests/Peers/aiortc_answerer.py").path,
                             "--tone", "\(tone)", "--record", record.path, "--seconds", "\(seconds)"]
        process.standardInput = input
        process.standardOutput = output
        process.standardError = try FileHandle(forWritingTo: errors)
        output.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            self?.take(data)
        }
        try process.run()
    }

    func send(_ message: [String: Any]) throws {
        var line = try JSONSerialization.data(withJSONObject: message)
        line.append(0x0A)
        try input.fileHandleForWriting.write(contentsOf: line)
    }

    /// Waits (up to 30 s) for the first message with `key`, and answers its value.
    func next(_ key: String) async throws -> Any {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            let (found, over) = lock.withLock { (messages.first { $0[key] != nil }?[key], ended) }
            if let found { return found }
            if over { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        let stderr = (try? String(contentsOf: errors, encoding: .utf8)) ?? ""
        throw AiortcFailure("aiortc never said '\(key)'; it said \(said()), and on stderr: \(stderr.suffix(2000))")
    }

    /// Every value said under `key` so far; everything said, with no key.
    func said(_ key: String? = nil) -> [Any] {
        lock.withLock { key.map { key in messages.compactMap { $0[key] } } ?? messages.map { $0 as Any } }
    }

    func stop() {
        output.fileHandleForReading.readabilityHandler = nil
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
    }

    private func take(_ data: Data) {
        lock.withLock {
            if data.isEmpty { ended = true; return }
            buffer.append(data)
            while let newline = buffer.firstIndex(of: 0x0A) {
                let line = buffer[buffer.startIndex..<newline]
                buffer = Data(buffer[buffer.index(after: newline)...])
                if let message = (try? JSONSerialization.jsonObject(with: line)) as? [String: Any] { messages.append(message) }
            }
        }
    }
}

struct AiortcFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
