import Foundation
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import ParleySoftphone
import Testing

let testLogger: Logger = {
    var logger = Logger(label: "test.media")
    logger.logLevel = ProcessInfo.processInfo.environment["PARLEY_TEST_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .critical
    return logger
}()

func makePhone(_ server: LiveServer, _ user: UserID, tone: Double, record: URL?, dataChannels: [DataChannelSpec] = [],
               relayOnly: Bool = false, picture: UInt32? = nil, addresses: [String] = ["127.0.0.1"],
               connectWhileRinging: Bool = true) throws -> Softphone {
    try makePhone(URL(string: server.baseURL)!, user, tone: tone, record: record, dataChannels: dataChannels, relayOnly: relayOnly,
                  picture: picture, addresses: addresses, connectWhileRinging: connectWhileRinging)
}

/// `picture`: a video call sends the moving test pattern on this colour (0xRRGGBB). `addresses`:
/// the local addresses for media (loopback by default: libnice skips it unless told to use it).
func makePhone(_ server: URL, _ user: UserID, tone: Double, record: URL?, dataChannels: [DataChannelSpec] = [],
               relayOnly: Bool = false, picture: UInt32? = nil, addresses: [String] = ["127.0.0.1"],
               connectWhileRinging: Bool = true) throws -> Softphone {
    var media = MediaEngineConfiguration()
    media.video.background = picture
    media.input = .tone(hertz: tone)
    media.output = record.map { .file($0) } ?? .null
    media.localAddresses = addresses
    media.dataChannels = dataChannels
    var options = SoftphoneOptions(server: server, user: user, media: media)
    options.statsInterval = .milliseconds(500)
    options.relayOnly = relayOnly
    options.connectWhileRinging = connectWhileRinging
    return try Softphone(options: options, logger: testLogger)
}

/// A connected call between alice (440 Hz) and bob (660 Hz), each recording what they hear.
struct LiveCall {
    let id: UUID
    let alice: Softphone
    let bob: Softphone
    let directory: URL
    let aliceLog: EventCollector
    let bobLog: EventCollector

    var aliceEvents: [SoftphoneEvent] { aliceLog.events }
    var bobEvents: [SoftphoneEvent] { bobLog.events }

    func talk(for duration: Duration) async throws { try await Task.sleep(for: duration) }

    /// Hangs up from one side and waits for both sides to end.
    func hangUp(by phone: Softphone) async throws {
        await phone.hangUp(id)
        try await eventually("both sides ended") {
            let aliceEnded = await alice.timeline(of: id)?.isEnded == true
            let bobEnded = await bob.timeline(of: id)?.isEnded == true
            return aliceEnded && bobEnded
        }
    }

    /// After the hang-up: each side heard the other's tone in every half second, and its recording
    /// spans the call on the wall clock, from its first audio to the end. A receiver writes only
    /// what it decodes, so a gap would shorten the file rather than show as silence in it.
    func expectEachHeardTheOtherThroughout(sourceLocation: SourceLocation = #_sourceLocation) async throws {
        for (phone, recording, hertz, who) in [(alice, try alicesRecording(), 660.0, "alice"), (bob, try bobsRecording(), 440.0, "bob")] {
            let timeline = try #require(await phone.timeline(of: id), sourceLocation: sourceLocation)
            let first = try #require(timeline.firstAudio, sourceLocation: sourceLocation)
            let end = try #require(timeline.ended, sourceLocation: sourceLocation)
            let heardFor = (end - first).seconds
            #expect(recording.audio.duration > heardFor - 0.5,
                    "\(who) recorded \(recording.audio.duration) s of the \(heardFor) s from first audio to the end", sourceLocation: sourceLocation)
            let check = recording.toneInEveryWindow(hertz, from: 0.5, to: recording.audio.duration - 0.5)
            #expect(check.passed, "\(who): \(check)", sourceLocation: sourceLocation)
        }
    }

    func alicesRecording() throws -> Recording { try Recording(directory.appendingPathComponent("alice.wav")) }
    func bobsRecording() throws -> Recording { try Recording(directory.appendingPathComponent("bob.wav")) }
    func bobsRecordedSeconds() throws -> Double { try bobsRecording().audio.duration }
}

struct Recording {
    let audio: WAV.Audio
    init(_ url: URL) throws { audio = try WAV.read(url) }

    func dominantFrequency(from start: Double, length: Double? = nil) -> Double? {
        AudioAnalysis.dominantFrequency(audio.mono(from: start, length: length), sampleRate: audio.sampleRate)
    }

    /// Looks at every whole half second from `start` to `end` (the end of the recording if nil):
    /// each must carry `hertz` (within 2 Hz) and be loud throughout, so a gap anywhere shows.
    /// `floor`: the quietest a tenth of a second may be (Chromium's noise suppression takes a
    /// steady tone down to about -29 dBFS: -40 there).
    func toneInEveryWindow(_ hertz: Double, from start: Double, to end: Double? = nil, floor: Double = ToneCheck.quietest) -> ToneCheck {
        let end = min(end ?? audio.duration, audio.duration)
        let windows = stride(from: start, through: end - ToneCheck.window, by: ToneCheck.window).map { from in
            let samples = audio.mono(from: from, length: ToneCheck.window)
            let tenths = stride(from: 0, to: samples.count, by: samples.count / 5).map { Array(samples[$0..<min(samples.count, $0 + samples.count / 5)]) }
            return ToneCheck.Window(start: from, heard: AudioAnalysis.dominantFrequency(samples, sampleRate: audio.sampleRate),
                                    quietestTenth: tenths.map(AudioAnalysis.level).min() ?? -120)
        }
        return ToneCheck(hertz: hertz, windows: windows, floor: floor)
    }
}

/// What `Recording.toneInEveryWindow` found: which half seconds lacked the tone, or went quiet.
struct ToneCheck: CustomStringConvertible {
    static let window = 0.5
    /// A tenth of a second more than 6 dB below the tone's -13.5 dBFS (a sine of amplitude 0.3) has a gap.
    static let quietest = -20.0

    struct Window {
        var start: Double
        var heard: Double?
        /// The level of the window's quietest tenth of a second, in dBFS.
        var quietestTenth: Double
    }

    let hertz: Double
    let windows: [Window]
    var floor = ToneCheck.quietest

    var failures: [Window] {
        windows.filter { window in
            !(window.heard.map { abs($0 - hertz) <= 2 } ?? false) || window.quietestTenth < floor
        }
    }

    /// At least one window, and no failure.
    var passed: Bool { !windows.isEmpty && failures.isEmpty }

    var description: String {
        guard !windows.isEmpty else { return "no whole \(Self.window) s window to look at" }
        let failed = failures.map { window in
            let heard = window.heard.map { "\(Int($0)) Hz" } ?? "silence"
            return String(format: "%.1f-%.1f s: ", window.start, window.start + Self.window) + heard
                + String(format: ", quietest tenth %.0f dBFS", window.quietestTenth)
        }
        return "\(hertz) Hz in \(windows.count - failed.count) of \(windows.count) windows" + (failed.isEmpty ? "" : "; missing in " + failed.joined(separator: "; "))
    }
}

/// `video`: a video call, alice's picture the moving pattern on orange (0xE07020), bob's on teal (0x20A0A0).
/// `connectWhileRinging`: alice's and bob's (both by default, as `parley call` and `parley listen`).
func withCall(dataChannels: [DataChannelSpec] = [], relayOnly: Bool = false, video: Bool = false, aliceThrough proxy: TCPProxy? = nil,
              connectWhileRinging: (alice: Bool, bob: Bool) = (true, true), server configure: (inout ServerConfiguration) -> Void = { _ in },
              _ body: (LiveCall) async throws -> Void) async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-call-\(UUID().uuidString.prefix(8))")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let server = try await LiveServer.start(configure: configure)
    proxy?.connect(to: server.port)
    let aliceServer = proxy.map { URL(string: $0.url)! } ?? URL(string: server.baseURL)!
    let alice = try makePhone(aliceServer, "alice", tone: 440, record: directory.appendingPathComponent("alice.wav"), dataChannels: dataChannels,
                              relayOnly: relayOnly, picture: 0xE07020, connectWhileRinging: connectWhileRinging.alice)
    let bob = try makePhone(server, "bob", tone: 660, record: directory.appendingPathComponent("bob.wav"), relayOnly: relayOnly, picture: 0x20A0A0,
                            connectWhileRinging: connectWhileRinging.bob)
    try await alice.start()
    try await bob.start()
    let aliceLog = EventCollector(alice.events)
    let bobLog = EventCollector(bob.events)
    let id = await alice.call("bob", video: video)
    do {
        try await eventually { bobLog.events.contains { if case .incoming(id, from: "alice", _, _) = $0 { true } else { false } } }
        await bob.answer(id)
        try await eventually(timeout: .seconds(15), "call connected") {
            let aliceHears = await alice.timeline(of: id)?.firstAudio != nil
            let bobHears = await bob.timeline(of: id)?.firstAudio != nil
            return aliceHears && bobHears
        }
    } catch {
        // What each side reached, for the failure's reader; then everything started here stops.
        let sides = [("alice", await alice.timeline(of: id), aliceLog.events), ("bob", await bob.timeline(of: id), bobLog.events)]
        let reached: String = sides.map { "\($0.0): \(String(describing: $0.1)), events \($0.2)" }.joined(separator: "; ")
        Issue.record("the call did not connect both ways: \(reached)")
        await alice.stop(); await bob.stop(); try? await server.stop()
        throw error
    }
    let call = LiveCall(id: id, alice: alice, bob: bob, directory: directory, aliceLog: aliceLog, bobLog: bobLog)
    do {
        try await body(call)
    } catch {
        await alice.stop(); await bob.stop(); try? await server.stop()
        throw error
    }
    await alice.stop()
    await bob.stop()
    try await server.stop()
}

final class EventCollector: @unchecked Sendable {
    private let lock = NSLock()
    private var log: [SoftphoneEvent] = []
    private var task: Task<Void, Never>?
    init(_ stream: AsyncStream<SoftphoneEvent>) {
        task = Task { [weak self] in for await event in stream { self?.lock.withLock { self?.log.append(event) } } }
    }
    var events: [SoftphoneEvent] { lock.withLock { log } }
}

final class ChannelCollector: @unchecked Sendable {
    private let lock = NSLock()
    private var channels: [DataChannel] = []
    init(_ stream: AsyncStream<DataChannel>) {
        Task { [weak self] in for await channel in stream { self?.lock.withLock { self?.channels.append(channel) } } }
    }
    func channel(_ label: String) async throws -> DataChannel {
        try await eventually("data channel \(label)") { self.lock.withLock { self.channels.contains { $0.label == label } } }
        return lock.withLock { channels.first { $0.label == label }! }
    }
}

final class MessageCollector: @unchecked Sendable {
    private let lock = NSLock()
    private var log: [DataChannel.Event] = []
    init(_ stream: AsyncStream<DataChannel.Event>) {
        Task { [weak self] in for await event in stream { self?.lock.withLock { self?.log.append(event) } } }
    }
    var messages: [DataChannel.Event] { lock.withLock { log } }
}
