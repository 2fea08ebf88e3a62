import Foundation
import ParleyGStreamer
import ParleyLocalServices
import ParleyServerTesting
import ParleySoftphone
import ParleyWire
import Testing

/// Calls as the quality benchmark makes them: `parley serve` and `parley listen` on one side of
/// `parley-wire`, `parley call` on the other, each in its own network namespace, speech both ways.
@Suite("Calls over an impaired wire", .serialized, .enabled(if: ImpairedWireLab.available), .timeLimit(.minutes(5)))
struct ImpairedCallTests {
    @Test func aCallOverTenPercentLossCarriesSpeechBothWaysAndKeepsItsLength() throws {
        // The loss starts once the call is up: lost DTLS flights are retransmitted after 1 s, then
        // 2 s, then 4 s (GStreamer's dtlsdec), and a handshake that took seconds cost the speech's
        // first words before any concealment could act (it failed so on CI; docs/quality.md).
        let lab = try ImpairedWireLab(impairment: "delay=20ms")
        defer { lab.removeFiles() }
        let call: ImpairedWireLab.Call
        do { call = try lab.call(seconds: 14, impairing: "delay=20ms,loss=10%", after: .seconds(3)) } catch { _ = lab.stop(); throw error }
        let wire = try JSONSerialization.jsonObject(with: Data(lab.stop().utf8)) as! [String: [String: Any]]
        for direction in ["ab", "ba"] {
            let received = wire[direction]!["received"] as! Int, dropped = wire[direction]!["dropped"] as! Int
            #expect(Double(dropped) > 0.06 * Double(received) && Double(dropped) < 0.14 * Double(received), "\(direction): \(wire)")
        }
        for side in [call.caller, call.callee] {
            // Lost packets are concealed, not skipped: the recording lasts from the first audio to the
            // end of the call (the DTLS handshake may hold the first audio back under loss), less what
            // the jitter buffer holds at the hang-up, which is never played: under loss it grows up
            // to its 300 ms maximum (a run fell 0.5 s short so). Skipping the lost 10 % would
            // shorten it by 1.4 s.
            let heardFor = side.talkSeconds - max(0, side.firstAudioSeconds - side.connectedSeconds)
            #expect(side.recordingSeconds > heardFor - 0.6,
                    "\(side.name): recorded \(side.recordingSeconds) s of \(heardFor) s heard of a \(side.talkSeconds) s call")
            try lab.expectSpeech(in: side)
            // Random loss turns FEC on with the loss as the hint and gives it 48 kbit/s.
            let settings = side.encoderSettings
            let reports = side.log.filter { $0["mos"] != nil }.map { "t \($0["t"] ?? "?") loss \($0["lossPct"] ?? "?")/\($0["remoteLossPct"] ?? "?") rtt \($0["rttMs"] ?? "?")" }
            #expect(settings.contains { $0.fec && $0.expectedLossPct >= 5 }, "\(side.name): \(settings); \(reports)")
            #expect(settings.allSatisfy { $0.bitrateKbps >= 32 } && settings.contains { $0.bitrateKbps == 48 }, "\(side.name): \(settings)")
        }
    }

    /// Jitter bunches packets up, and the jitter buffer estimates a lost packet's duration from when
    /// its neighbours arrived: 15–27 ms for a 20 ms packet under 80 ms of jitter. Taken as it was,
    /// the decoder concealed that much instead of rebuilding the packet from FEC (libopus rebuilds
    /// only when asked for a whole packet), and the recording drifted from the call's timeline by
    /// 0.3–1.9 s. Gaps are now counted in whole packets.
    @Test func aCallOverLossAndJitterKeepsItsTimeline() throws {
        let lab = try ImpairedWireLab(impairment: "delay=20ms")
        defer { lab.removeFiles() }
        let call: ImpairedWireLab.Call
        do { call = try lab.call(seconds: 14, impairing: "delay=20ms,loss=10%,jitter=80ms", after: .seconds(3)) } catch { _ = lab.stop(); throw error }
        _ = lab.stop()
        for side in [call.caller, call.callee] {
            try lab.expectSpeech(in: side)
        }
    }

    /// Connecting while ringing over a 100 ms round trip, counted on the wire: while bob's phone
    /// rings (4 s), ICE's checks and the DTLS handshake cross it both ways, and not one RTP or RTCP
    /// packet does either way; once bob answers, media flows both ways, and each side hears the other
    /// from its first audio on.
    @Test func whileItRingsThePathIsMadeAndNoMediaCrossesTheWire() throws {
        let lab = try ImpairedWireLab(impairment: "delay=50ms")
        defer { lab.removeFiles() }
        let ringFor = 4.0
        var ringing: [String: [String: Any]] = [:]
        let call: ImpairedWireLab.Call
        do {
            call = try lab.call(seconds: 4, changes: [], play: ("tone:440", "tone:660"), answerAfter: ringFor,
                                connectWhileRinging: true) { calleeOutput in
                var rangAt: ContinuousClock.Instant?
                let deadline = ContinuousClock.now + .seconds(15)
                while ContinuousClock.now < deadline {
                    if rangAt == nil, ((try? String(contentsOf: calleeOutput, encoding: .utf8)) ?? "").contains("incoming call") { rangAt = .now }
                    let now = try lab.wires[0].statistics()
                    func count(_ direction: String, _ kind: String) -> Int { ((now[direction]?["kinds"] as? [String: Int])?[kind]) ?? 0 }
                    // Both ways: the handshake's flights, and a little after it.
                    if let rangAt, count("ab", "dtls") >= 2, count("ba", "dtls") >= 2 {
                        Thread.sleep(forTimeInterval: 0.5)
                        ringing = try lab.wires[0].statistics()
                        // Still ringing when the wire was read: bob answers `ringFor` after it rang.
                        guard ContinuousClock.now - rangAt < .seconds(ringFor - 1) else { throw TestFailure("the path took too long to read while ringing") }
                        return
                    }
                    Thread.sleep(forTimeInterval: 0.05)
                }
                throw TestFailure("no DTLS handshake crossed the wire while it rang: \(try lab.wires[0].statistics())")
            }
        } catch { _ = lab.stop(); throw error }
        let after = try JSONSerialization.jsonObject(with: Data(lab.stop().utf8)) as! [String: [String: Any]]
        for direction in ["ab", "ba"] {
            let kinds = ringing[direction]?["kinds"] as? [String: Int] ?? [:]
            #expect(kinds["stun", default: 0] > 0 && kinds["dtls", default: 0] >= 2, "\(direction) while ringing: \(kinds)")
            #expect(kinds["rtp"] == 0 && kinds["rtcp"] == 0, "no media while ringing, \(direction): \(kinds)")
            let total = after[direction]?["kinds"] as? [String: Int] ?? [:]
            // 4 s of 20 ms packets after the answer.
            #expect(total["rtp", default: 0] > 150, "media after the answer, \(direction): \(total)")
        }
        for (side, hertz) in [(call.caller, 660.0), (call.callee, 440.0)] {
            let recording = try Recording(side.recording)
            let check = recording.toneInEveryWindow(hertz, from: 0.3, to: recording.audio.duration - 0.3)
            #expect(check.passed, "\(side.name): \(check)")
        }
    }

    /// Nothing is sent before the call connects (ICE and DTLS), however long that takes, and a
    /// file played into the call starts then. Over a 500 ms round trip the send chains run for
    /// seconds before the connection: what they made meanwhile used to wait in webrtcbin and go out
    /// in a burst when it came, so the far side heard the call that much late (its recording ran
    /// 1.5 s longer than the call) and the first sender reports, sent late, read round trips of
    /// seconds (at 20 % loss one took a call's bitrate to its floor for good).
    @Test func nothingIsSentBeforeTheCallConnects() throws {
        let lab = try ImpairedWireLab(impairment: "delay=250ms")
        defer { _ = lab.stop(); lab.removeFiles() }
        let call = try lab.call(seconds: 8)
        let reference = try WAV.read(lab.speech).mono()
        for side in [call.caller, call.callee] {
            let heard = try WAV.read(side.recording).mono()
            let sent = Self.speechStart(reference), came = Self.speechStart(heard, loudest: Self.loudest(reference))
            #expect(came.map { abs($0 - sent!) <= 0.3 } == true,
                    "\(side.name): the speech starts \(sent ?? -1) s into the file and \(came ?? -1) s into what was heard")
            // Heard from the first audio to the hang-up, and no more.
            let heardFor = side.talkSeconds - (side.firstAudioSeconds - side.connectedSeconds)
            #expect(side.recordingSeconds < heardFor + 0.5, "\(side.name): recorded \(side.recordingSeconds) s of \(heardFor) s heard")
            let roundTrips = side.log.compactMap { $0["rttMs"] as? Double }.filter { $0 > 0 }
            #expect(!roundTrips.isEmpty && roundTrips.allSatisfy { $0 < 1000 }, "\(side.name): round trips \(roundTrips) on a 500 ms path")
        }
    }

    /// The path between the two sides goes dead for 12 s mid-call: every packet lost both ways,
    /// media and signaling alike, with no reset (the heartbeat is 4 s here, so the signaling
    /// connections are given up on both ends and resumed after). Each side says no audio is
    /// arriving, then that it arrives again; the call goes on, each hears the other's tone in
    /// every half second of what it recorded but the second around the outage, and the recording
    /// spans the call less the outage (a receiver writes only what it decodes): audio came back
    /// within a second and stayed. The
    /// hang-up at the end crosses the resumed signaling.
    @Test func aCallComesBackAfterThePathWasDeadForTwelveSeconds() throws {
        let lab = try ImpairedWireLab(impairment: "delay=20ms", serverOptions: ["--heartbeat", "4"])
        defer { lab.removeFiles() }
        let outage = 12.0
        let call: ImpairedWireLab.Call
        do {
            call = try lab.call(seconds: 28, changes: [.init(after: .seconds(8), spec: "loss=100%"), .init(after: .seconds(8 + outage), spec: "delay=20ms")],
                                play: ("tone:440", "tone:660"))
        } catch { _ = lab.stop(); throw error }
        _ = lab.stop()
        for (side, other, hertz) in [(call.caller, "bob", 660.0), (call.callee, "alice", 440.0)] {
            #expect(side.output.contains("no audio is arriving from \(other)"), "\(side.name): \(side.output)")
            #expect(side.output.contains("audio from \(other) arrives again"), "\(side.name): \(side.output)")
            let heardFor = side.talkSeconds - (side.firstAudioSeconds - side.connectedSeconds)
            #expect(side.recordingSeconds > heardFor - outage - 1, "\(side.name): recorded \(side.recordingSeconds) s of \(heardFor) s heard, \(outage) s of it dead")
            // The outage is one point of the recording (nothing was decoded during it), where
            // concealment fades out and the stream picks up again: every window but the second
            // around it carries the tone.
            let recording = try Recording(side.recording)
            let cut = 8 - side.firstAudioSeconds
            for check in [recording.toneInEveryWindow(hertz, from: 0.5, to: cut - 0.5),
                          recording.toneInEveryWindow(hertz, from: cut + 0.5, to: recording.audio.duration - 0.5)] {
                #expect(check.passed, "\(side.name): \(check)")
            }
        }
    }

    /// Two paths for media join the sides (a phone's Wi-Fi and cellular, say; signaling has a
    /// third). Mid-call the one ICE picked dies for good: every packet lost both ways, no reset,
    /// and libnice's keepalives would take 50 s to notice. Media stops arriving, so ICE restarts
    /// (the caller's; the callee asks it to): the media moves to the other path, a new selected
    /// pair, and the call goes on, each side hearing the other's tone in every half second of its
    /// recording but the second around the move.
    @Test func aCallMovesToTheOtherPathWhenItsPathDies() throws {
        let lab = try ImpairedWireLab(impairment: "delay=20ms", mediaPaths: ["delay=20ms", "delay=20ms"])
        defer { lab.removeFiles() }
        let cutAt = 8.0
        let call: ImpairedWireLab.Call
        do {
            call = try lab.call(seconds: 20, changes: [.init(after: .seconds(cutAt), spec: "loss=100%", path: nil)], play: ("tone:440", "tone:660"))
        } catch { _ = lab.stop(); throw error }
        _ = lab.stop()
        var noticed: [String] = []
        for (side, other, hertz) in [(call.caller, "bob", 660.0), (call.callee, "alice", 440.0)] {
            let lines = side.output.split(separator: "\n").map(String.init)
            // "media goes over host 203.0.113.21:41066 → host 203.0.113.22:34831": the addresses.
            func addresses(_ prefix: String) -> [Substring] {
                (lines.first { $0.contains(prefix) } ?? "").split(separator: " ").filter { $0.hasPrefix("203.0.113.") }.map { $0.prefix { $0 != ":" } }
            }
            let first = addresses("media goes over"), moved = addresses("media moved to")
            #expect(first.count == 2, "\(side.name) says where its media goes: \(side.output)")
            #expect(moved.count == 2 && Set(moved).isDisjoint(with: first), "\(side.name) moves to the other path: \(side.output)")
            // The side whose silence is noticed first restarts ICE (or asks the caller to): the
            // other's may never reach its `noMediaAfter` before the media has moved. A side that
            // said its audio stopped says it arrives again.
            if lines.contains(where: { $0.contains("no audio is arriving from \(other)") }) {
                noticed.append(side.name)
                #expect(lines.contains { $0.contains("audio from \(other) arrives again") }, "\(side.name): \(side.output)")
            }
            let recording = try Recording(side.recording)
            let cut = cutAt - side.firstAudioSeconds
            for check in [recording.toneInEveryWindow(hertz, from: 0.5, to: cut - 0.5),
                          recording.toneInEveryWindow(hertz, from: cut + 0.5, to: recording.audio.duration - 0.5)] {
                #expect(check.passed, "\(side.name): \(check)")
            }
            // Audio after the move, most of the call's time (a receiver writes only what it
            // decodes: the seconds before the restart are not in the file).
            let heardFor = side.talkSeconds - (side.firstAudioSeconds - side.connectedSeconds)
            #expect(recording.audio.duration - cut > heardFor - cutAt - 10, "\(side.name): \(recording.audio.duration) s recorded of \(heardFor) s")
        }
        #expect(!noticed.isEmpty, "a side noticed the path died:\n\(call.caller.output)\n\(call.callee.output)")
    }

    static func loudest(_ samples: [Float]) -> Double {
        stride(from: 0, to: samples.count - 960, by: 960).map { AudioAnalysis.rms(Array(samples[$0..<$0 + 960])) }.max() ?? 0
    }

    /// Where speech first reaches a fifth of `loudest` (that of `samples` if not given), seconds.
    static func speechStart(_ samples: [Float], loudest: Double? = nil) -> Double? {
        let level = 0.2 * (loudest ?? Self.loudest(samples))
        return stride(from: 0, to: samples.count - 960, by: 960)
            .first { AudioAnalysis.rms(Array(samples[$0..<$0 + 960])) > level }
            .map { Double($0) / 48_000 }
    }

    /// A deep queue, as cellular links have: a shallow one could not pass the DTLS handshake. The
    /// queue growing brings the rate down; loss, if the queue overflowed before that, turns FEC on
    /// (`BitrateController`: above 1 %). A rate brought down in time loses nothing and needs no FEC:
    /// two of the last three runs did, and a test that required FEC failed on them.
    @Test func aBottleneckBringsTheBitrateDownAndLossBringsFEC() throws {
        let lab = try ImpairedWireLab(impairment: "delay=20ms,rate=32kbit,queue=1500ms")
        defer { _ = lab.stop(); lab.removeFiles() }
        let call = try lab.call(seconds: 16)
        for side in [call.caller, call.callee] {
            let settings = side.encoderSettings
            let reports = side.log.filter { $0["mos"] != nil }
            let described = reports.map { "loss \($0["lossPct"] ?? "?")/\($0["remoteLossPct"] ?? "?") rtt \($0["rttMs"] ?? "?")" }
            #expect(settings.contains { $0.bitrateKbps < 32 }, "\(side.name): \(settings); \(described)")
            let lossSeen = reports.contains { report in
                ["lossPct", "remoteLossPct"].contains { ((report[$0] as? Double) ?? 0) > 1 }
            }
            #expect(!lossSeen || settings.contains { $0.fec }, "\(side.name): loss and no FEC: \(settings); \(described)")
        }
    }
}

/// Two namespaces joined by the wire, the server on side b, and the reference speech.
struct ImpairedWireLab {
    static var available: Bool {
        if ProcessInfo.processInfo.environment["PARLEY_REQUIRE_ALL_TESTS"] == "1" { return true }
        let tools = ["/usr/bin/espeak-ng", "/usr/bin/sox"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
        if getuid() == 0 && tools && SoftphoneCommandTests.executable != nil { return true }
        print("◇ impaired-wire call tests skipped: they need root, espeak-ng and sox (scripts/setup.sh --tests)")
        return false
    }

    struct Side {
        var name: String
        var recording: URL
        var talkSeconds: Double
        var connectedSeconds: Double
        var firstAudioSeconds: Double
        var recordingSeconds: Double
        var log: [[String: Any]]
        /// What its `parley call` or `parley listen` printed.
        var output: String

        var encoderSettings: [(bitrateKbps: Double, fec: Bool, expectedLossPct: Int)] {
            log.compactMap { entry in
                guard let rate = entry["bitrateKbps"] as? Double, let fec = entry["fec"] as? Bool,
                      let loss = entry["expectedLossPct"] as? Int else { return nil }
                return (rate, fec, loss)
            }
        }
    }

    struct Call {
        var caller: Side
        var callee: Side
    }

    let a = TunWire.Side(namespace: "parley-ta\(getpid() % 10_000)", address: "198.51.100.21")
    let b = TunWire.Side(namespace: "parley-tb\(getpid() % 10_000)", address: "198.51.100.22")
    /// The first carries signaling (the server listens on its b end), and media unless there are
    /// media paths: then each of those joins the namespaces too (a phone's Wi-Fi and cellular, say)
    /// and media uses only them.
    let wires: [Wire]
    let directory: URL
    let speech: URL
    let server: Process
    let port = Int.random(in: 18_000...18_999)

    /// One wire between the namespaces, forwarding on a thread of its own until its control closes.
    final class Wire: Sendable {
        let wire: TunWire
        let control: Int32
        private let stopped = DispatchSemaphore(value: 0)
        private let answers = Answers()

        /// The wire's answers to control lines, as they come.
        final class Answers: @unchecked Sendable {
            private let lock = NSLock()
            private var lines: [String] = []
            private let arrived = DispatchSemaphore(value: 0)

            func put(_ line: String) {
                lock.withLock { lines.append(line) }
                arrived.signal()
            }

            /// The next answer that starts with `prefix` (others are dropped); nil after `timeout` seconds.
            func next(startingWith prefix: String, timeout: Double) -> String? {
                let deadline = DispatchTime.now() + timeout
                while arrived.wait(timeout: deadline) == .success {
                    if let line = lock.withLock({ lines.isEmpty ? nil : lines.removeFirst() }), line.hasPrefix(prefix) { return line }
                }
                return nil
            }
        }

        init(a: TunWire.Side, b: TunWire.Side, impairment: String) throws {
            wire = try TunWire(a: a, b: b, ab: try Impairment(spec: impairment), ba: try Impairment(spec: impairment), seed: 7)
            var ends: [Int32] = [0, 0]
            guard pipe(&ends) == 0 else {
                wire.close()
                throw TestFailure("no pipe")
            }
            control = ends[1]
            let wire = self.wire, readEnd = ends[0], stopped = self.stopped, answers = self.answers
            Thread.detachNewThread {
                try? wire.run(control: readEnd, stopsOnSignals: false) { answers.put($0) }
                close(readEnd)
                stopped.signal()
            }
        }

        func change(to spec: String) -> Bool {
            let line = "set \(spec)\n"
            return line.withCString { write(control, $0, strlen($0)) } == line.utf8.count
        }

        /// What the wire did so far, direction by direction ("ab", "ba"), asked while it runs.
        func statistics() throws -> [String: [String: Any]] {
            let line = "stats\n"
            guard line.withCString({ write(control, $0, strlen($0)) }) == line.utf8.count,
                  let answer = answers.next(startingWith: "{", timeout: 5),
                  let json = try JSONSerialization.jsonObject(with: Data(answer.utf8)) as? [String: [String: Any]] else {
                throw TestFailure("the wire did not answer stats")
            }
            return json
        }

        /// Stops forwarding and closes the devices; answers what the wire did, as JSON.
        func stop() -> String {
            close(control)  // ends the wire's control stream: it stops
            stopped.wait()
            let statistics = wire.statistics
            wire.close()
            return statistics
        }
    }

    /// `serverOptions`: more arguments for `parley serve` (`--heartbeat 4`). `mediaPaths`: the
    /// impairment of each path for media only, wires of their own (203.0.113.21–22, .31–32, …).
    init(impairment: String, serverOptions: [String] = [], mediaPaths: [String] = []) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-lab-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        speech = directory.appendingPathComponent("speech.wav")
        let raw = directory.appendingPathComponent("raw.wav")
        try Self.run("/usr/bin/espeak-ng", ["-v", "en-us", "-s", "150", "-w", raw.path,
                                            "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
                                            + "It is easy to tell the depth of a well. These days a chicken leg is a rare dish."])
        try Self.run("/usr/bin/sox", [raw.path, "-r", "48000", "-c", "1", "-b", "16", speech.path, "pad", "1.5", "0", "gain", "-n", "-3"])

        var wires = [try Wire(a: a, b: b, impairment: impairment)]
        do {
            for (index, path) in mediaPaths.enumerated() {
                wires.append(try Wire(a: TunWire.Side(namespace: a.namespace, address: "203.0.113.\(21 + 10 * index)"),
                                      b: TunWire.Side(namespace: b.namespace, address: "203.0.113.\(22 + 10 * index)"), impairment: path))
            }
        } catch {
            _ = wires[0].stop()
            throw error
        }
        self.wires = wires
        let log = directory.appendingPathComponent("server.log")
        do {
            server = try Self.start(in: b.namespace, ["serve", "--host", b.address, "--port", "\(port)", "--database", ":memory:",
                                                      "--dev", "true", "--token-secret", String(repeating: "s", count: 40)] + serverOptions, output: log)
        } catch {
            // The first wire made the namespaces and removes them: it goes last.
            for wire in wires.reversed() { _ = wire.stop() }
            throw error
        }
        let deadline = ContinuousClock.now + .seconds(10)
        while !((try? String(contentsOf: log, encoding: .utf8)) ?? "").contains("listening on") {
            guard ContinuousClock.now < deadline, server.isRunning else {
                _ = stop()
                throw TestFailure("parley serve did not start: \((try? String(contentsOf: log, encoding: .utf8)) ?? "")")
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
    }

    /// A call from side a to side b that lasts `seconds` once connected; the wire changes to
    /// `impairing` (both ways) `after` the caller started, if given.
    func call(seconds: Int, impairing change: String? = nil, after delay: Duration = .zero) throws -> Call {
        try call(seconds: seconds, changes: change.map { [Change(after: delay, spec: $0)] } ?? [])
    }

    /// A wire's impairment changing (both ways) at a time after the caller started.
    struct Change {
        var after: Duration
        var spec: String
        /// Which wire (0 the first, then the media paths); nil for the one carrying the media then,
        /// as the caller last said ("media goes over …", "media moved to …").
        var path: Int? = 0
    }

    /// A call from side a to side b that lasts `seconds` once connected; the wires change as
    /// `changes` say. Each side plays `play` (the speech if not given: `tone:440` for the caller,
    /// `tone:660` for the callee, for instance) and uses every path's address for media.
    /// `answerAfter`: the callee lets the call ring that long first; `whileRinging` runs once the
    /// caller started, given the callee's output file.
    func call(seconds: Int, changes: [Change], play: (caller: String, callee: String)? = nil, answerAfter: Double = 0,
              connectWhileRinging: Bool = true, whileRinging: ((URL) throws -> Void)? = nil) throws -> Call {
        let url = "http://\(b.address):\(port)"
        func arguments(_ name: String, _ addresses: [String]) -> [String] {
            let sound = play.map { name == "alice" ? $0.caller : $0.callee } ?? speech.path
            return ["--server", url, "--as", name, "--play", sound, "--record", directory.appendingPathComponent("\(name).wav").path,
                    "--quality-log", directory.appendingPathComponent("\(name).jsonl").path]
                + addresses.flatMap { ["--ice-address", $0] }
        }
        let media = wires.count > 1 ? Array(wires.dropFirst()) : wires
        let calleeOutput = directory.appendingPathComponent("callee.out")
        let early = connectWhileRinging ? ["--connect-while-ringing"] : ["--no-connect-while-ringing"]
        let callee = try Self.start(in: b.namespace, ["listen", "--answer", "auto", "--answer-after", "\(answerAfter)", "--once"] + early
                                    + arguments("bob", media.map(\.wire.b.address)), output: calleeOutput)
        let deadline = ContinuousClock.now + .seconds(20)
        while !(try String(contentsOf: calleeOutput, encoding: .utf8).contains("listening as")) {
            guard ContinuousClock.now < deadline, callee.isRunning else {
                if callee.isRunning { callee.terminate() }
                throw TestFailure("parley listen did not start: \(try String(contentsOf: calleeOutput, encoding: .utf8))")
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        let callerOutput = directory.appendingPathComponent("caller.out")
        let caller: Process
        do {
            caller = try Self.start(in: a.namespace, ["call", "bob", "--duration", "\(seconds)"] + early
                                    + arguments("alice", media.map(\.wire.a.address)), output: callerOutput)
        } catch {
            callee.terminate()
            throw error
        }
        let started = ContinuousClock.now
        do {
            try whileRinging?(calleeOutput)
        } catch {
            caller.terminate(); callee.terminate()
            throw error
        }
        for change in changes {
            let wait = started + change.after - .now
            if wait > .zero { Thread.sleep(forTimeInterval: Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18) }
            guard let wire = change.path.map({ wires[$0] }) ?? carrying(callerOutput), wire.change(to: change.spec) else {
                caller.terminate(); callee.terminate()
                throw TestFailure("the wire took no change")
            }
        }
        caller.waitUntilExit()
        // `listen --once` ends with the call; one the caller never made must not hold the test.
        let ends = ContinuousClock.now + .seconds(15)
        while callee.isRunning, ContinuousClock.now < ends { Thread.sleep(forTimeInterval: 0.05) }
        if callee.isRunning { callee.terminate() }
        callee.waitUntilExit()
        let callerText = try String(contentsOf: callerOutput, encoding: .utf8)
        let calleeText = try String(contentsOf: calleeOutput, encoding: .utf8)
        guard caller.terminationStatus == 0, callee.terminationStatus == 0 else {
            throw TestFailure("the call failed:\n\(callerText)\n\(calleeText)")
        }
        return Call(caller: try side("alice", output: callerText), callee: try side("bob", output: calleeText))
    }

    /// The wire whose address the caller last said its media goes over.
    private func carrying(_ callerOutput: URL) -> Wire? {
        let said = ((try? String(contentsOf: callerOutput, encoding: .utf8)) ?? "").split(separator: "\n")
            .last { $0.contains("media goes over") || $0.contains("media moved to") }
        return wires.first { wire in said?.contains("host \(wire.wire.a.address):") == true }
    }

    private func side(_ name: String, output: String) throws -> Side {
        /// The first number on the summary line that starts with `label`.
        func figure(_ label: String) throws -> Double {
            guard let value = output.split(separator: "\n").first(where: { $0.trimmingCharacters(in: .whitespaces).hasPrefix(label) })
                .flatMap({ $0.split(separator: " ").compactMap { Double($0) }.first }) else {
                throw TestFailure("\(name) printed no \(label):\n\(output)")
            }
            return value
        }
        let recording = directory.appendingPathComponent("\(name).wav")
        let log = try String(contentsOf: directory.appendingPathComponent("\(name).jsonl"), encoding: .utf8)
            .split(separator: "\n").compactMap { try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        return Side(name: name, recording: recording, talkSeconds: try figure("talk time"),
                    connectedSeconds: try figure("time to connected") / 1000, firstAudioSeconds: try figure("time to first audio") / 1000,
                    recordingSeconds: try WAV.read(recording).duration, log: log, output: output)
    }

    /// The speech sent is in the recording, on its own timeline: its loudness over time (20 ms
    /// windows) follows the reference's once aligned; no 300 ms stretch where the reference speaks is
    /// silent (GStreamer's Opus decoder leaves holes of 100–200 ms now and then when it rebuilds a
    /// packet from FEC: docs/quality.md); and the second half of the speech comes as long after the first as it was sent (a
    /// receiver that skips lost packets instead of concealing them pulls it earlier).
    func expectSpeech(in side: Side, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let window = 960  // 20 ms at 48 kHz
        func envelope(_ samples: [Float]) -> [Double] {
            stride(from: 0, to: samples.count - window, by: window).map { AudioAnalysis.rms(Array(samples[$0..<$0 + window])) }
        }
        let reference = envelope(try WAV.read(speech).mono())
        let heard = envelope(try WAV.read(side.recording).mono())
        let whole = Self.bestLag(of: reference, in: heard)
        #expect(whole.correlation > 0.6, "\(side.name): the recording does not follow the speech (r = \(whole.correlation))",
                sourceLocation: sourceLocation)

        let loudest = reference.max() ?? 0
        var silent: [Double] = []
        let stretch = 15  // 300 ms
        for start in stride(from: 0, to: reference.count - stretch, by: 5) {
            let spoken = reference[start..<start + stretch].reduce(0, +) / Double(stretch)
            let at = whole.lag + start
            guard spoken > 0.2 * loudest, at + stretch <= heard.count else { continue }
            if heard[at..<at + stretch].reduce(0, +) / Double(stretch) < 0.02 * loudest { silent.append(Double(start) * 0.02) }
        }
        #expect(silent.isEmpty, "\(side.name): silence at \(silent) s of the speech", sourceLocation: sourceLocation)

        let half = reference.count / 2
        let first = Self.bestLag(of: Array(reference[..<half]), in: heard)
        let second = Self.bestLag(of: Array(reference[half...]), in: heard)
        let drift = Double(second.lag - first.lag - half) * 0.02
        #expect(abs(drift) <= 0.06, "\(side.name): the second half of the speech came \(drift) s off its place",
                sourceLocation: sourceLocation)
        if whole.correlation <= 0.6 || !silent.isEmpty || abs(drift) > 0.06 { keepEvidence(of: side) }
    }

    /// The lab's files when a side's speech fails (recordings, quality logs, the softphones' and
    /// the server's output), kept in the test artifacts: a call under loss that fails on CI leaves
    /// what was heard and what the engines reported.
    func keepEvidence(of side: Side) {
        let kept = BrowserLab.artifacts.appendingPathComponent(directory.lastPathComponent)
        try? FileManager.default.createDirectory(at: kept, withIntermediateDirectories: true)
        let files = (try? FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)) ?? []
        for file in files where file.lastPathComponent != "raw.wav" {
            try? FileManager.default.copyItem(at: file, to: kept.appendingPathComponent(file.lastPathComponent))
        }
        print("◇ \(side.name)'s speech failed; the lab's files are kept in \(kept.path)")
        // And what its engine reported, second by second, where CI's output shows it.
        for entry in side.log.prefix(40) {
            print("◇ \(side.name): " + entry.keys.sorted().map { "\($0)=\(entry[$0]!)" }.joined(separator: " "))
        }
    }

    /// Where `pattern` fits best in `signal`, by correlation.
    static func bestLag(of pattern: [Double], in signal: [Double]) -> (lag: Int, correlation: Double) {
        var best = (lag: 0, correlation: -1.0)
        guard signal.count >= pattern.count else { return best }
        for lag in 0...(signal.count - pattern.count) {
            let correlation = Self.correlation(pattern, Array(signal[lag..<lag + pattern.count]))
            if correlation > best.correlation { best = (lag, correlation) }
        }
        return best
    }

    static func correlation(_ x: [Double], _ y: [Double]) -> Double {
        let mx = x.reduce(0, +) / Double(x.count), my = y.reduce(0, +) / Double(y.count)
        var sxy = 0.0, sxx = 0.0, syy = 0.0
        for i in x.indices {
            sxy += (x[i] - mx) * (y[i] - my)
            sxx += (x[i] - mx) * (x[i] - mx)
            syy += (y[i] - my) * (y[i] - my)
        }
        return sxx > 0 && syy > 0 ? sxy / (sxx * syy).squareRoot() : 0
    }

    /// Stops the server and the wires; answers what the first wire did, as JSON.
    func stop() -> String {
        if server.isRunning {
            server.terminate()
            server.waitUntilExit()
        }
        // The first wire made the namespaces and removes them: it goes last.
        let all = wires.reversed().map { $0.stop() }
        if ProcessInfo.processInfo.environment["PARLEY_KEEP_LAB"] == "1" { print("◇ wires (last first): \(all)") }
        return all.last ?? ""
    }

    /// Removes the recordings and logs, unless PARLEY_KEEP_LAB=1 asks to keep them for a look.
    func removeFiles() {
        guard ProcessInfo.processInfo.environment["PARLEY_KEEP_LAB"] != "1" else { return print("◇ kept \(directory.path)") }
        try? FileManager.default.removeItem(at: directory)
    }

    static func start(in namespace: String, _ arguments: [String], output: URL) throws -> Process {
        guard let executable = SoftphoneCommandTests.executable else { throw TestFailure("swift build --build-tests builds parley") }
        _ = FileManager.default.createFile(atPath: output.path, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["ip", "netns", "exec", namespace, executable.path] + arguments
        let handle = try FileHandle(forWritingTo: output)
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        return process
    }

    static func run(_ tool: String, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw TestFailure("\(tool) failed") }
    }
}

/// The first signaling connection tries again what may pass (no answer, 5xx), says each wait, and
/// says at once what will not pass (refused, a refused token).
@Suite("First signaling connection", .serialized, .timeLimit(.minutes(5)))
struct FirstConnectionTests {
    /// A server that takes connections but answers nothing useful yet (a proxy whose backend is not
    /// up) is tried again until it answers.
    @Test func retriesUntilTheServerAnswers() async throws {
        let proxy = try TCPProxy()
        defer { proxy.stop() }
        var options = SoftphoneOptions(server: URL(string: proxy.url)!, user: "early")
        options.media.input = .silence
        options.media.localAddresses = ["127.0.0.1"]
        let phone = try Softphone(options: options, logger: testLogger)
        let retries = Lines()
        let started = Task { try await phone.start(onRetry: { retries.append($0) }) }
        // For the first second and a half the proxy drops every connection.
        try await Task.sleep(for: .milliseconds(1_500))
        let server = try await LiveServer.start()
        proxy.connect(to: server.port)
        try await started.value
        #expect(await phone.signalingClient?.session != nil)
        #expect(retries.all.contains { $0.contains("trying again in") }, "\(retries.all)")
        await phone.stop()
        try await server.stop()
    }

    /// A server that does not answer is tried again until the start timeout, each wait said.
    @Test func noAnswerIsTriedAgainAndSaid() async throws {
        let silent = try SilentListener()
        defer { silent.stop() }
        let server = URL(string: "http://127.0.0.1:\(silent.port)")!
        var options = SoftphoneOptions(server: server, user: "patient")
        options.startTimeout = .seconds(4)
        options.media.input = .silence
        let phone = try Softphone(options: options, logger: testLogger)
        let retries = Lines()
        do {
            try await phone.start(onRetry: { retries.append($0) })
            Issue.record("connected to a server that answers nothing")
        } catch {
            #expect("\(error)".contains("cannot reach the Parley server at \(server.absoluteString): no answer"), "\(error)")
        }
        // Once at least: the first try ends after the 3 s a request may take, and the next starts before 4 s.
        let said = try #require(retries.all.first, "no wait was said")
        #expect(said.hasPrefix("no answer from the Parley server at \(server.absoluteString); trying again in "), "\(said)")
        #expect(said.hasSuffix(" s"), "\(said)")
    }

    @Test func aRefusedTokenIsSaidAtOnce() async throws {
        let server = try await LiveServer.start()
        var options = SoftphoneOptions(server: URL(string: server.baseURL)!, user: "mallory")
        options.token = "forged.token.value"
        options.media.input = .silence
        options.media.localAddresses = ["127.0.0.1"]
        let phone = try Softphone(options: options, logger: testLogger)
        let started = ContinuousClock.now
        do {
            try await phone.start()
            Issue.record("a forged token connected")
        } catch {
            #expect("\(error)".contains("did not accept the token (401"), "\(error)")
        }
        #expect(ContinuousClock.now - started < .seconds(5))
        try await server.stop()
    }

    /// Nothing listens on the port: said at once, not after the tries a server that does not
    /// answer gets.
    @Test func aClosedPortIsRefusedAtOnce() async throws {
        let server = URL(string: "http://127.0.0.1:\(try freeTCPPort())")!
        var options = SoftphoneOptions(server: server, user: "alone")
        options.media.input = .silence
        let phone = try Softphone(options: options, logger: testLogger)
        let started = ContinuousClock.now
        do {
            try await phone.start()
            Issue.record("connected to nothing")
        } catch {
            #expect("\(error)".contains("cannot reach the Parley server at \(server.absoluteString): connection refused"), "\(error)")
        }
        // Generous: it took the 20 s of tries before.
        #expect(ContinuousClock.now - started < .seconds(5))
    }
}

/// Sentences told to a callback, for assertions.
private final class Lines: @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [String] = []
    var all: [String] { lock.withLock { lines } }
    func append(_ line: String) { lock.withLock { lines.append(line) } }
}

/// A loopback port that takes connections (the kernel completes the handshake) and never answers.
private final class SilentListener: @unchecked Sendable {
    let port: Int
    private let fd: Int32

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard bound, listen(fd, 16) == 0 else {
            close(fd)
            throw TestFailure("cannot listen")
        }
        self.fd = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    func stop() { close(fd) }
}
