import ArgumentParser
import Foundation
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleyServer
import ParleySoftphone

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "A real call on this machine: an embedded server and two softphones, alice calls bob.",
        discussion: "Nothing to configure: the server runs in development mode on loopback with a temporary database; the call's audio (a tone each way) is recorded and checked."
    )

    @Option(help: "Seconds of conversation.")
    var seconds: Double = 4

    @Option(help: "Where to keep the recordings (default: a new temporary directory).")
    var output: String?

    func validate() throws {
        guard seconds > 0, seconds <= 600 else { throw ValidationError("--seconds must be between 0 and 600") }
    }

    func run() async throws {
        let start = ContinuousClock.now
        func step(_ text: String) {
            Console.say(String(format: "%7.0f ms  ", (ContinuousClock.now - start).seconds * 1000) + text)
        }
        let directory = URL(fileURLWithPath: output ?? FileManager.default.temporaryDirectory.appendingPathComponent("parley-demo-\(UUID().uuidString.prefix(8))").path)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)

        do {
            try GStreamerEngine.check(GStreamerEngine.requiredElements)
        } catch {
            throw fail("\(error)\n(scripts/setup.sh installs them)")
        }

        var logger = Logger(label: "parley.demo")
        logger.logLevel = .error
        let database = directory.appendingPathComponent("demo.sqlite").path
        let server = try await EmbeddedServer.start(database: database, logger: logger)
        let base = server.base
        step("server listening on \(base.absoluteString) (development mode, database \(database))")

        func phone(_ user: UserID, hertz: Double, channels: [DataChannelSpec] = []) throws -> Softphone {
            var media = MediaEngineConfiguration()
            media.dataChannels = channels
            media.input = .tone(hertz: hertz)
            media.output = .file(directory.appendingPathComponent("heard-by-\(user).wav"))
            media.localAddresses = ["127.0.0.1"]
            var options = SoftphoneOptions(server: base, user: user, name: user.rawValue.capitalized, media: media)
            options.statsInterval = .milliseconds(500)
            return try Softphone(options: options, logger: logger)
        }
        let alice = try phone("alice", hertz: 440, channels: [DataChannelSpec(label: "chat")])
        let bob = try phone("bob", hertz: 660)
        try await alice.start()
        try await bob.start()
        step("alice and bob connected to the server (alice sends 440 Hz, bob 660 Hz)")

        let call = await alice.call("bob")
        step("alice calls bob")
        for await event in bob.events {
            if case .incoming(call, _, _, _) = event { break }
        }
        step("bob's phone rings; bob answers")
        await bob.answer(call)
        var marks: Set<String> = []
        let deadline = ContinuousClock.now + .seconds(15)
        while ContinuousClock.now < deadline {
            let a = await alice.timeline(of: call), b = await bob.timeline(of: call)
            if a?.iceConnected != nil, marks.insert("ice").inserted { step("media path up (ICE connected, DTLS-SRTP next)") }
            if a?.connected != nil, marks.insert("connected").inserted { step("call connected") }
            if a?.firstAudio != nil, marks.insert("a-audio").inserted { step("alice hears bob") }
            if b?.firstAudio != nil, marks.insert("b-audio").inserted { step("bob hears alice") }
            if marks.count == 4 || a?.isEnded == true { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        guard marks.count == 4 else {
            await alice.stop(); await bob.stop()
            await server.stop()
            throw fail("the call did not connect")
        }
        await Self.chat(alice: alice, bob: bob, call: call, step: step)
        step(String(format: "talking for %.0f s…", seconds))
        try await Task.sleep(for: .seconds(seconds))
        await alice.hangUp(call)
        while true {
            let bobEnded = await bob.timeline(of: call)?.isEnded == true
            let aliceEnded = await alice.timeline(of: call)?.isEnded == true
            if bobEnded && aliceEnded { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        step("alice hangs up; the call is over on both sides")
        let aliceTimeline = await alice.timeline(of: call)
        let bobTimeline = await bob.timeline(of: call)
        await alice.stop()
        await bob.stop()
        await server.stop()

        Console.say("")
        if let aliceTimeline { for line in Console.summary(aliceTimeline, label: "alice: ") { Console.say(line) } }
        if let bobTimeline { for line in Console.summary(bobTimeline, label: "bob:   ") { Console.say(line) } }
        Console.say("")
        let heardByAlice = Self.tone(directory.appendingPathComponent("heard-by-alice.wav"))
        let heardByBob = Self.tone(directory.appendingPathComponent("heard-by-bob.wav"))
        let ok = heardByAlice == 660 && heardByBob == 440
        Console.say("alice heard \(heardByAlice.map { "\(Int($0)) Hz" } ?? "nothing") (bob sent 660 Hz); bob heard \(heardByBob.map { "\(Int($0)) Hz" } ?? "nothing") (alice sent 440 Hz): \(ok ? "audio went both ways" : "AUDIO CHECK FAILED")")
        Console.say("recordings and the call record are in \(directory.path)")
        GStreamerEngine.shutDownForLeakCheck()
        if !ok { throw ExitCode(1) }
    }

    /// A message each way on the call's data channel.
    static func chat(alice: Softphone, bob: Softphone, call: UUID, step: (String) -> Void) async {
        guard let alicePeer = await alice.peerConnection(of: call), let bobPeer = await bob.peerConnection(of: call) else { return }
        func firstChannel(_ peer: GStreamerPeerConnection) async -> DataChannel? {
            for await channel in peer.dataChannels where channel.label == "chat" { return channel }
            return nil
        }
        guard let aliceChat = await firstChannel(alicePeer), let bobChat = await firstChannel(bobPeer) else { return }
        func next(_ channel: DataChannel) async -> String? {
            for await event in channel.events { if case .text(let text) = event { return text } }
            return nil
        }
        let deadline = ContinuousClock.now + .seconds(5)
        while !(aliceChat.isOpen && bobChat.isOpen), ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(10)) }
        async let bobReads = next(bobChat)
        aliceChat.send("hello bob")
        if let text = await bobReads { step("data channel: bob got \"\(text)\"") }
        async let aliceReads = next(aliceChat)
        bobChat.send("hi alice")
        if let text = await aliceReads { step("data channel: alice got \"\(text)\"") }
    }

    static func tone(_ url: URL) -> Double? {
        guard let audio = try? WAV.read(url), audio.duration > 1 else { return nil }
        return AudioAnalysis.dominantFrequency(audio.mono(from: 0.5), sampleRate: audio.sampleRate)
    }
}
