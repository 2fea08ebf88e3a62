import ArgumentParser
import Foundation
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleySoftphone

/// Options shared by `parley call` and `parley listen`.
struct SoftphoneArguments: ParsableArguments {
    @Option(help: "The Parley server's HTTP URL. [PARLEY_SERVER]")
    var server: String = Serve.env("PARLEY_SERVER") ?? "http://127.0.0.1:8080"

    @Option(help: "Access token; without one, a development token is asked for (development mode servers only). [PARLEY_TOKEN]")
    var token: String?

    @Option(name: .customLong("as"), help: "Your user id, for a development token.")
    var user: String = Serve.env("USER").flatMap { UserID(rawValue: $0) != nil ? $0 : nil } ?? "cli"

    @Option(help: "Your display name, shown to the people you call.")
    var name: String?

    @Flag(help: "On the local network, with no server: listen advertises this device (DNS-SD, through avahi-daemon); call finds the callee and connects to it.")
    var lan = false

    @Option(name: .customLong("pin"), help: "With --lan: the PIN callers must give (listen), or the callee's PIN (call); 4 to 64 characters. [PARLEY_PIN]")
    var pinOption: String?

    /// `--pin`, or with `--lan` the environment's `PARLEY_PIN` (kept out of `ps`).
    var pin: String? { pinOption ?? (lan ? Serve.env("PARLEY_PIN") : nil) }

    @Option(help: "This device's id (1-64 of A-Z a-z 0-9 . _ - @ :); a new one each run by default.")
    var device: String?

    @Option(help: "What to send: tone:<hertz>, silence, device (the microphone), <file.wav>, loop:<file.wav> (a file starts when the call connects). Default: the microphone when there is one, else tone:440.")
    var play: String?

    @Option(help: "Record what you hear to this WAV file (16-bit, 48 kHz, mono).")
    var record: String?

    @Option(help: "Hang up this many seconds after the call connects.")
    var duration: Double?

    @Option(name: .customLong("record-call"),
            help: "Ask the other party to let you record the call, both voices, to this Ogg/Opus file; it records only once they agree. (Key r asks or stops during a call.)")
    var recordCall: String?

    @Option(name: .customLong("record-layout"), help: "mixed: both voices in one channel; two-channels: yours left, theirs right.")
    var recordLayout: RecordingLayout = .mixed

    @Option(name: .customLong("recording-consent"),
            help: "When the other party asks to record: ask (on the terminal; the default when interactive), yes, or no (the default otherwise).")
    var recordingConsent: RecordingConsentPolicy?

    @Flag(help: "Send and receive video (a VP8 test pattern).")
    var video = false

    @Option(name: .customLong("ice-address"), help: "Use only this local address for media (repeatable). Default: 127.0.0.1 for a loopback server, else every interface.")
    var iceAddresses: [String] = []

    @Option(name: .customLong("quality-log"), help: "Append a JSON line for every quality report and encoder change to this file.")
    var qualityLog: String?

    @Flag(name: .customLong("connect-while-ringing"), inversion: .prefixedNo,
          help: "Set the media path up while an audio call rings (nothing captured, sent or played before the answer), so answering costs one trip; --no-connect-while-ringing makes it after the answer (the classic flow).")
    var connectWhileRinging = true

    @Flag(name: .customLong("aggressive-ice-nomination"), inversion: .prefixedNo,
          help: "Nominate candidate pairs as they are checked, so media starts on the first that answers (ICE connects a round trip sooner); --no-aggressive-ice-nomination checks a pair again to nominate it, as webrtcbin asks (regular nomination).")
    var aggressiveICENomination = true

    @Option(help: "Log level: trace, debug, info, notice, warning, error.")
    var logLevel: String = Serve.env("PARLEY_LOG_LEVEL") ?? "error"

    func validate() throws {
        guard let url = URL(string: server), url.scheme == "http" || url.scheme == "https", url.host != nil else {
            throw ValidationError("--server must be an http:// or https:// URL, like http://127.0.0.1:8080")
        }
        guard UserID(rawValue: user) != nil else { throw ValidationError("--as must be a user id (letters, digits, . _ - @ :)") }
        if let play, AudioInput(argument: play) == nil {
            throw ValidationError("--play takes tone:<hertz>, silence, device, a .wav file or loop:<file.wav>")
        }
        if let play, case .file(let url, _)? = AudioInput(argument: play), !FileManager.default.isReadableFile(atPath: url.path) {
            throw ValidationError("--play: cannot read \(url.path)")
        }
        if let duration, duration <= 0 { throw ValidationError("--duration must be positive") }
        if let recordCall {
            let directory = URL(fileURLWithPath: recordCall).deletingLastPathComponent().path
            guard FileManager.default.isWritableFile(atPath: directory) else {
                throw ValidationError("--record-call: cannot write in \(directory)")
            }
        }
        if let name, name.isEmpty || name.count > 128 { throw ValidationError("--name is 1 to 128 characters") }
        if pinOption != nil, !lan { throw ValidationError("--pin goes with --lan") }
        if let pin {
            guard pin.count >= 4, pin.utf8.count <= 64 else { throw ValidationError("--pin is 4 to 64 characters") }
        }
        if lan, token != nil { throw ValidationError("--lan takes no --token: a LAN listener makes its own") }
        if let device, DeviceID(rawValue: device) == nil { throw ValidationError("--device must be a device id (letters, digits, . _ - @ :)") }
        guard Logger.Level(rawValue: logLevel) != nil else { throw ValidationError("--log-level \(logLevel) is not a log level") }
    }

    var serverURL: URL { URL(string: server)! }

    /// What `runCall` does about recording.
    var recordingOptions: CallRecordingOptions {
        CallRecordingOptions(path: recordCall, layout: recordLayout,
                             consent: recordingConsent ?? (Console.interactive ? .ask : .no))
    }

    var logger: Logger {
        var logger = Logger(label: "parley.softphone")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .error
        return logger
    }

    /// A softphone connected to the server. A server that does not answer yet is tried again, each
    /// wait said on standard error; one that refuses the connection, a name that does not resolve or
    /// a refused token ends the command at once with a plain sentence and status 1.
    func startSoftphone(_ options: SoftphoneOptions? = nil) async throws -> Softphone {
        let softphone = try Softphone(options: options ?? self.options(), logger: logger)
        do {
            try await softphone.start(onRetry: note)
        } catch {
            throw fail("\(error)")
        }
        return softphone
    }

    /// - Parameters:
    ///   - server: where to connect instead of `--server` (a LAN listener, or this device's own hub).
    ///   - token: a token to use instead of `--token`.
    func options(server: URL? = nil, token: String? = nil) -> SoftphoneOptions {
        var media = MediaEngineConfiguration()
        let soundCard = FileManager.default.fileExists(atPath: "/dev/snd") || Serve.env("PULSE_SERVER") != nil
        media.input = play.flatMap(AudioInput.init(argument:)) ?? (soundCard ? .device : .tone(hertz: 440))
        media.output = record.map { .file(URL(fileURLWithPath: $0)) } ?? (soundCard ? .device : .null)
        let host = serverURL.host ?? ""
        let loopbackServer = host == "127.0.0.1" || host == "localhost" || host == "::1"
        // On a LAN the media goes between the devices: every interface's host candidates.
        media.localAddresses = iceAddresses.isEmpty && loopbackServer && !lan ? ["127.0.0.1"] : iceAddresses
        let token = token ?? self.token ?? (lan ? nil : Serve.env("PARLEY_TOKEN"))
        var options = SoftphoneOptions(server: server ?? serverURL, user: UserID(rawValue: user)!, name: name, token: token,
                                       device: device.flatMap(DeviceID.init(rawValue:)), media: media)
        options.qualityLog = qualityLog.map { URL(fileURLWithPath: $0) }
        options.connectWhileRinging = connectWhileRinging
        // The process's, taken by each ICE agent as it is made: set before the softphone makes any.
        GStreamerEngine.iceNomination = aggressiveICENomination ? .aggressive : .regular
        return options
    }
}

/// Says what went wrong on standard error and exits with status 1.
func fail(_ message: String) -> ExitCode {
    note(message)
    return ExitCode.failure
}

/// Says on standard error what the command is waiting for, keeping standard output for the call.
func note(_ message: String) {
    try? FileHandle.standardError.write(contentsOf: Data("parley: \(message)\n".utf8))
}

/// Prints what a call does: a live status line while it runs and a summary at the end.
enum Console {
    static let interactive = isatty(STDIN_FILENO) == 1 && isatty(STDOUT_FILENO) == 1

    static func say(_ line: String) {
        try? FileHandle.standardOutput.write(contentsOf: Data(((interactive ? "\r\u{1B}[K" : "") + line + "\n").utf8))
    }

    static func status(_ line: String) {
        if interactive {
            try? FileHandle.standardOutput.write(contentsOf: Data(("\r\u{1B}[K" + line).utf8))
        } else {
            say(line)
        }
    }

    static func ms(_ duration: Duration?) -> String {
        guard let duration else { return "—" }
        return String(format: "%.0f ms", duration.seconds * 1000)
    }

    static func statusLine(_ timeline: CallTimeline) -> String {
        var parts: [String] = []
        if let connected = timeline.connected {
            let elapsed = Int((ContinuousClock.now - connected).seconds)
            parts.append(String(format: "● connected %02d:%02d", elapsed / 60, elapsed % 60))
        } else {
            parts.append("○ \(timeline.ringing == nil ? "calling" : "ringing")")
        }
        if timeline.connected != nil, !timeline.receivingMedia {
            parts.append("no audio arriving")
        } else if let q = timeline.quality {
            parts.append(String(format: "MOS %.2f", q.mos))
            parts.append(q.latestRttMs == nil ? "RTT —" : String(format: "RTT %.0f ms", q.rttMs))
            parts.append(String(format: "loss %.1f%%", q.lossPct))
            parts.append(String(format: "jitter %.0f ms", q.jitterMs))
            parts.append(String(format: "%.0f kbps", timeline.bitrate?.bitrateKbps ?? q.bitrateKbps))
        }
        if timeline.callRecording.isOn { parts.append("● REC") }
        if timeline.muted { parts.append("[muted]") }
        if timeline.held { parts.append("[on hold]") }
        return parts.joined(separator: "  ")
    }

    static func endWords(_ reason: EndReason?, outgoing: Bool) -> String {
        switch reason {
        case .hangup?: "hung up"
        case .declined?: outgoing ? "declined by the callee" : "declined"
        case .busy?: "the callee is busy"
        case .noAnswer?: "no answer"
        case .cancelled?: "cancelled"
        case .connectionLost?: "connection lost"
        case .answeredElsewhere?: "answered on another device"
        case .declinedElsewhere?: "declined on another device"
        case .serverShutdown?: "the server shut down"
        case let reason?: reason.rawValue
        case nil: "ended"
        }
    }

    static func summary(_ timeline: CallTimeline, label: String = "") -> [String] {
        let offline = timeline.devices == 0 && timeline.pushed == 0
        let outcome = offline ? "\(timeline.remote) is offline" : endWords(timeline.endReason, outgoing: timeline.outgoing)
        var lines = ["\(label)call with \(timeline.remote) ended: \(outcome)"]
        guard timeline.connected != nil else { return lines }
        if timeline.outgoing { lines.append("  time to ringing      \(ms(timeline.timeToRinging))") }
        lines.append("  time to connected    \(ms(timeline.timeToConnected))  (ICE \(ms(timeline.timeToIceConnected)))")
        lines.append("  time to first audio  \(ms(timeline.timeToFirstAudio))")
        if let connected = timeline.connected, let ended = timeline.ended {
            lines.append(String(format: "  talk time            %.1f s", (ended - connected).seconds))
        }
        if timeline.heardNothing {
            lines.append("  no audio was received from \(timeline.remote): the call connected, but nothing was heard")
        } else if let q = timeline.quality {
            lines.append(String(format: "  quality              MOS %.2f (%d/5)  RTT %.0f ms  loss %.1f%%  jitter %.0f ms  %.0f kbps",
                                q.mos, q.score, q.rttMs, q.lossPct, q.jitterMs, q.bitrateKbps))
        }
        if let video = timeline.video {
            let picture = video.frames == 0 ? "no picture was received from \(timeline.remote)"
                : video.changed * 2 < video.frames ? "\(video.frames) frames, the picture frozen (\(video.changed) changed)"
                : "\(video.frames) frames, the picture moving (\(video.changed) changed)"
            lines.append("  video                \(picture)")
        }
        for file in timeline.recordedFiles {
            lines.append("  call recording       \(file.path) (" + String(format: "%.1f–%.1f s of the call, ", file.startSeconds, file.endSeconds)
                         + "\(file.layout.rawValue))")
        }
        if let recording = timeline.recording {
            var line = "  recording            \(recording.path)"
            if let audio = try? WAV.read(recording) {
                line += String(format: " (%.1f s", audio.duration)
                if let hz = AudioAnalysis.dominantFrequency(audio.mono(from: min(0.5, audio.duration / 2)), sampleRate: audio.sampleRate) {
                    line += String(format: ", strongest tone %.0f Hz", hz)
                }
                line += ")"
            }
            lines.append(line)
        }
        return lines
    }
}

/// Single keys from the terminal while a call runs: m mute, h hold, q hang up.
final class Keyboard: @unchecked Sendable {
    private var original = termios()
    private var raw = false

    init() {
        guard Console.interactive else { return }
        tcgetattr(STDIN_FILENO, &original)
        var settings = original
        settings.c_lflag &= ~tcflag_t(ICANON | ECHO)
        tcsetattr(STDIN_FILENO, TCSANOW, &settings)
        raw = true
    }

    func restore() {
        guard raw else { return }
        var settings = original
        tcsetattr(STDIN_FILENO, TCSANOW, &settings)
        raw = false
    }

    deinit { restore() }

    /// Keys as they are pressed, read on a background thread.
    var keys: AsyncStream<Character> {
        AsyncStream { continuation in
            guard raw else { continuation.finish(); return }
            Thread.detachNewThread {
                var byte: UInt8 = 0
                while read(STDIN_FILENO, &byte, 1) == 1 { continuation.yield(Character(UnicodeScalar(byte))) }
                continuation.finish()
            }
        }
    }
}

/// Runs one call on the console until it ends: status line, keys, duration, Ctrl-C.
func runCall(_ phone: Softphone, _ call: UUID, duration: Double?,
             recording: CallRecordingOptions = CallRecordingOptions()) async -> CallTimeline? {
    let keyboard = Keyboard()
    defer { keyboard.restore() }
    if Console.interactive { Console.say("keys: m mute · h hold · r record (asks them) · q hang up") }
    // The keys and Ctrl-C are heard beside the status loop, until the call is over.
    let keys = keyboard.keys
    return await withTaskGroup(of: Void.self) { group in
        group.addTask {
            for await key in keys {
                guard let timeline = await phone.timeline(of: call), !timeline.isEnded else { return }
                switch key {
                case "m": await phone.setMuted(call, !timeline.muted)
                case "h": await phone.setHeld(call, !timeline.held)
                case "r": await recording.toggle(phone, call, timeline)
                case "y" where timeline.callRecording == .asked, "n" where timeline.callRecording == .asked:
                    await recording.answer(phone, call, consent: key == "y")
                case "q", "\n": await phone.hangUp(call)
                default: break
                }
            }
        }
        group.addTask { for await _ in Interrupt.signals() { await phone.hangUp(call) } }
        defer { group.cancelAll() }
        return await statusUntilEnded(phone, call, duration: duration, recording: recording)
    }
}

/// The call's status line and what changes in it, said until the call ends; answers its timeline.
private func statusUntilEnded(_ phone: Softphone, _ call: UUID, duration: Double?, recording: CallRecordingOptions) async -> CallTimeline? {
    var lastPrinted = ContinuousClock.now - .seconds(10)
    var asked = false, changesSaid = 0, filesSaid = 0, receivingSaid = true
    var pathSaid: SelectedCandidatePair?
    while let timeline = await phone.timeline(of: call) {
        // The candidate pair carrying the media, and every move to another (an ICE restart after
        // the path died, over another interface if there is one).
        if timeline.connected != nil, let path = timeline.mediaPath, path != pathSaid, !timeline.isEnded {
            Console.say(pathSaid == nil ? "media goes over \(path)" : "media moved to \(path)")
            pathSaid = path
        }
        // Media stopping and coming back, in words (both ways: a caller and a listener).
        if timeline.connected != nil, timeline.receivingMedia != receivingSaid, !timeline.isEnded {
            receivingSaid = timeline.receivingMedia
            let peer = timeline.remote.rawValue
            Console.say(receivingSaid ? "audio from \(peer) arrives again" : "no audio is arriving from \(peer)")
        }
        // Recording: ask once the call is up, say what changed, answer the far side's request.
        if !asked, timeline.connected != nil, let path = recording.path {
            asked = true
            await recording.request(phone, call, path: path)
        }
        for change in timeline.recordingChanges.dropFirst(changesSaid) {
            if let line = recording.words(for: change, remote: timeline.remote) { Console.say(line) }
            if change == .requestedThere { await recording.respond(phone, call) }
        }
        changesSaid = timeline.recordingChanges.count
        for file in timeline.recordedFiles.dropFirst(filesSaid) {
            Console.say("recorded the call to \(file.path) (" + String(format: "%.1f–%.1f s of the call)", file.startSeconds, file.endSeconds))
        }
        filesSaid = timeline.recordedFiles.count
        guard !timeline.isEnded else { break }
        if let duration, let connected = timeline.connected, ContinuousClock.now - connected > .seconds(duration) {
            await phone.hangUp(call)
        }
        let period: Duration = Console.interactive ? .milliseconds(250) : .seconds(2)
        if ContinuousClock.now - lastPrinted >= period {
            Console.status(Console.statusLine(timeline))
            lastPrinted = .now
        }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return await phone.timeline(of: call)
}

/// SIGINT (Ctrl-C) runs `handler` instead of ending the process at once.
/// (`signals()`: each Ctrl-C, for as long as the stream is read.)
final class Interrupt: @unchecked Sendable {
    private let source: any DispatchSourceSignal
    init(_ handler: @escaping @Sendable () -> Void) {
        signal(SIGINT, SIG_IGN)
        source = DispatchSource.makeSignalSource(signal: SIGINT)
        source.setEventHandler(handler: handler)
        source.resume()
    }
    func cancel() {
        source.cancel()
        signal(SIGINT, SIG_DFL)
    }

    static func signals() -> AsyncStream<Void> {
        AsyncStream { continuation in
            let interrupt = Interrupt { continuation.yield() }
            continuation.onTermination = { _ in interrupt.cancel() }
        }
    }
}

/// What a softphone on the command line does about recording with consent.
enum RecordingConsentPolicy: String, ExpressibleByArgument, CaseIterable {
    case ask, yes, no
}

extension RecordingLayout: ExpressibleByArgument {}

struct CallRecordingOptions: Sendable {
    /// Where to record once the far side agrees; nil: ask only on the r key (to a file named for the call).
    var path: String?
    var layout: RecordingLayout = .mixed
    var consent: RecordingConsentPolicy = .no

    func request(_ phone: Softphone, _ call: UUID, path: String) async {
        do {
            try await phone.requestRecording(call, to: path, layout: layout)
        } catch {
            Console.say("cannot ask to record: \(error)")
        }
    }

    /// The r key: ask to record (to --record-call, or a file named for the call), or stop.
    func toggle(_ phone: Softphone, _ call: UUID, _ timeline: CallTimeline) async {
        switch timeline.callRecording {
        case .off:
            // A later recording of the same call goes to a file of its own: call-2.ogg, call-3.ogg…
            let file = Self.numbered(path ?? "call-\(call.uuidString.prefix(8).lowercased()).ogg", timeline.recordedFiles.count + 1)
            await request(phone, call, path: file)
        case .asked:
            Console.say("they asked to record: press y to agree or n to refuse")
        case .asking, .on:
            do { try await phone.stopRecording(call) } catch { Console.say("cannot stop recording: \(error)") }
        }
    }

    static func numbered(_ path: String, _ number: Int) -> String {
        guard number > 1 else { return path }
        let url = URL(fileURLWithPath: path)
        let stem = url.deletingPathExtension().lastPathComponent, ext = url.pathExtension
        return url.deletingLastPathComponent().appendingPathComponent("\(stem)-\(number)" + (ext.isEmpty ? "" : ".\(ext)")).path
    }

    /// The far side asked: answer as the policy says, or wait for y or n.
    func respond(_ phone: Softphone, _ call: UUID) async {
        switch consent {
        case .yes: await answer(phone, call, consent: true)
        case .no: await answer(phone, call, consent: false)
        case .ask: Console.say("record this call? press y to agree, n to refuse")
        }
    }

    func answer(_ phone: Softphone, _ call: UUID, consent: Bool) async {
        do { try await phone.answerRecording(call, consent: consent) } catch { Console.say("cannot answer: \(error)") }
    }

    func words(for change: RecordingConsent.Change, remote: UserID) -> String? {
        switch change {
        case .requestedHere: "asking \(remote) to let you record the call…"
        case .requestedThere: "\(remote) asks to record this call"
        case .acceptedThere: "\(remote) agreed: recording the call"
        case .acceptedHere: "you agreed: \(remote) is recording this call"
        case .declinedThere: "\(remote) declined: the call is not recorded"
        case .declinedHere: "you declined: the call is not recorded"
        case .stoppedHere: "recording stopped"
        case .stoppedThere: "\(remote) stopped the recording"
        case .callEnded: nil
        case .failed(let reason): "recording failed: \(reason)"
        }
    }
}
