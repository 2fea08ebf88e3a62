import ArgumentParser
import Foundation
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleySoftphone
#if canImport(Glibc)
import Glibc
#endif

/// Calls through one embedded server, Parley's Linux engine against headless Chromium in the same
/// run: setup times over several calls, then CPU and memory during one steady call.
struct BenchCalls: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "calls",
        abstract: "Time call setup (invite → ICE connected, invite → first audio) and CPU and memory per call leg, Parley and Chromium side by side.",
        discussion: """
            Runs Linux↔Linux calls between two Parley softphones, then the same calls between two headless \
            Chromium peers (a minimal page speaking protocol v1), then Chromium calling Parley and Parley calling \
            Chromium, all through one embedded server on loopback. CPU and memory are measured for the \
            same-kind pairs only. \
            Chromium gathers ICE candidates on every interface: run it in a private network namespace \
            (scripts/bench-calls.sh does).
            """
    )

    @Option(help: "Calls to time on each side.")
    var calls: Int = 10

    @Option(help: "Seconds each timed call lasts.")
    var talk: Double = 1.5

    @Option(help: "Seconds of the steady call over which CPU is measured.")
    var steady: Double = 10

    @Option(help: "Seconds each call rings before it is answered, in the answer-to-voice comparison (0: skip it).")
    var ring: Double = 1

    @Option(help: "The Chromium executable.")
    var chromium: String = "/usr/bin/chromium"

    @Flag(help: "Only the Parley side.")
    var skipChromium = false

    @Flag(help: "Run even though this network namespace has interfaces other than loopback.")
    var anyNetwork = false

    func validate() throws {
        guard calls >= 1, calls <= 1000 else { throw ValidationError("--calls must be between 1 and 1000") }
        guard talk > 0, steady >= 2 else { throw ValidationError("--talk must be positive and --steady at least 2 seconds") }
        guard ring.isFinite, (0...30).contains(ring) else { throw ValidationError("--ring takes seconds, from 0 to 30") }
    }

    struct Side {
        var name: String
        var ice: [Double] = []
        var audio: [Double] = []
        var failures = 0
        var cpuPercentPerLeg: Double?
        var residentMiBPerLeg: Double?
        var note = ""
    }

    func run() async throws {
        if !skipChromium, !anyNetwork, let others = Self.nonLoopbackInterfaces(), !others.isEmpty {
            throw fail("this network namespace has \(others.joined(separator: ", ")); Chromium would gather candidates there. Run scripts/bench-calls.sh, or pass --any-network")
        }
        var logger = Logger(label: "parley.bench")
        logger.logLevel = .error
        let server = try await EmbeddedServer.start(database: nil, logger: logger)
        defer { Task { await server.stop() } }
        progress("server on \(server.base.absoluteString)")

        var answers: [AnswerSide] = []
        if ring > 0 {
            for early in [false, true] { answers.append(try await answerToVoice(server.base, connectWhileRinging: early, logger: logger)) }
        }
        var sides = [try await parley(server.base, logger: logger)]
        if !skipChromium {
            sides.append(try await chrome(server.base))
            sides.append(try await chromeCallsParley(server.base, logger: logger))
            sides.append(try await parleyCallsChrome(server.base, logger: logger))
        }
        await server.stop()
        print(table(sides))
        if !answers.isEmpty { print(answerTable(answers)) }
    }

    // MARK: Answer to voice

    struct AnswerSide {
        var name: String
        /// From the tap (the callee's answer) to the first audio each side heard, in ms.
        var callerHears: [Double] = []
        var calleeHears: [Double] = []
        var failures = 0
    }

    /// Parley calling Parley, each call ringing `ring` seconds before the callee answers: from the
    /// answer to the first audio each side hears, classic (the path made after the answer) or
    /// connecting while ringing. Both phones are in this process, so one clock times both.
    private func answerToVoice(_ base: URL, connectWhileRinging: Bool, logger: Logger) async throws -> AnswerSide {
        let alice = try phone(base, "bench-ring-alice", hertz: 440, connectWhileRinging: connectWhileRinging, logger: logger)
        let bob = try phone(base, "bench-ring-bob", hertz: 660, connectWhileRinging: connectWhileRinging, logger: logger)
        try await alice.start()
        try await bob.start()
        try await Task.sleep(for: .seconds(1))
        var side = AnswerSide(name: connectWhileRinging ? "Parley, connecting while ringing" : "Parley, classic")
        for index in 0..<calls {
            let call = await alice.call("bench-ring-bob")
            let rings = ContinuousClock.now + .seconds(10)
            while await bob.timeline(of: call) == nil, ContinuousClock.now < rings { try await Task.sleep(for: .milliseconds(2)) }
            try await Task.sleep(for: .seconds(ring))
            let answered = ContinuousClock.now
            await bob.answer(call)
            let deadline = answered + .seconds(10)
            var heard: (ContinuousClock.Instant?, ContinuousClock.Instant?) = (nil, nil)
            while ContinuousClock.now < deadline, heard.0 == nil || heard.1 == nil {
                heard = (await alice.timeline(of: call)?.firstAudio, await bob.timeline(of: call)?.firstAudio)
                try await Task.sleep(for: .milliseconds(2))
            }
            if let caller = heard.0, let callee = heard.1 {
                side.callerHears.append((caller - answered).seconds * 1000)
                side.calleeHears.append((callee - answered).seconds * 1000)
            } else {
                side.failures += 1
            }
            await alice.hangUp(call)
            while await alice.timeline(of: call)?.isEnded != true { try await Task.sleep(for: .milliseconds(5)) }
            try await Task.sleep(for: .milliseconds(200))
            progress("\(side.name) call \(index + 1)/\(calls)")
        }
        await alice.stop()
        await bob.stop()
        return side
    }

    private func answerTable(_ sides: [AnswerSide]) -> String {
        func p(_ values: [Double], _ fraction: Double) -> Double? {
            guard !values.isEmpty else { return nil }
            let sorted = values.sorted()
            return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * fraction).rounded()))]
        }
        let cell = BenchTable.cell
        var lines = ["", String(format: "answer to voice: %d calls per side, each ringing %.1f s first; from the answer (the tap) to the first audio heard", calls, ring)]
        lines.append("side                                caller hears p50 / p95     callee hears p50 / p95   failed")
        for side in sides {
            let name = side.name.padding(toLength: 34, withPad: " ", startingAt: 0)
            lines.append("\(name) \(cell(p(side.callerHears, 0.5), "%6.0f ms")) / \(cell(p(side.callerHears, 0.95), "%4.0f ms"))"
                         + "       \(cell(p(side.calleeHears, 0.5), "%6.0f ms")) / \(cell(p(side.calleeHears, 0.95), "%4.0f ms"))   \(side.failures)")
        }
        if sides.count == 2, let early = p(sides[1].callerHears, 0.5), let classic = p(sides[0].callerHears, 0.5), classic > 0,
           let earlyCallee = p(sides[1].calleeHears, 0.5), let classicCallee = p(sides[0].calleeHears, 0.5), classicCallee > 0 {
            lines.append(String(format: "connecting while ringing / classic, p50: caller hears %.2f, callee hears %.2f", early / classic, earlyCallee / classicCallee))
        }
        return lines.joined(separator: "\n")
    }

    // MARK: Parley

    private func phone(_ base: URL, _ user: UserID, hertz: Double, connectWhileRinging: Bool = true, logger: Logger) throws -> Softphone {
        var media = MediaEngineConfiguration()
        media.input = .tone(hertz: hertz)
        media.output = .null
        media.localAddresses = ["127.0.0.1"]
        var options = SoftphoneOptions(server: base, user: user, media: media)
        options.statsInterval = .seconds(1)
        options.connectWhileRinging = connectWhileRinging
        return try Softphone(options: options, logger: logger)
    }

    /// A softphone that answers every call.
    private func answering(_ phone: Softphone) -> Task<Void, Never> {
        Task {
            for await event in phone.events { if case .incoming(let call, _, _, _) = event { await phone.answer(call) } }
        }
    }

    private func parley(_ base: URL, logger: Logger) async throws -> Side {
        let alice = try phone(base, "bench-alice", hertz: 440, logger: logger)
        let bob = try phone(base, "bench-bob", hertz: 660, logger: logger)
        try await alice.start()
        try await bob.start()
        let answers = answering(bob)
        defer { answers.cancel() }
        try await Task.sleep(for: .seconds(1))  // DTLS certificate generated, connections settled
        var side = Side(name: "Parley (GStreamer)")
        try await time(&side, from: alice, to: "bench-bob", measureSteadyCall: true)
        await alice.stop()
        await bob.stop()
        return side
    }

    /// Calls `callee` from `caller` `calls` times and records the caller's timings; with
    /// `measureSteadyCall`, one more call over which this process's CPU and memory are measured.
    private func time(_ side: inout Side, from caller: Softphone, to callee: UserID, measureSteadyCall: Bool) async throws {
        let idleRSS = residentBytes(pid: getpid())
        for index in 0..<(measureSteadyCall ? calls + 1 : calls) {
            let steadyCall = index == calls
            let call = await caller.call(callee)
            let deadline = ContinuousClock.now + .seconds(10)
            var timeline = await caller.timeline(of: call)
            while ContinuousClock.now < deadline, timeline?.firstAudio == nil || timeline?.iceConnected == nil, timeline?.isEnded != true {
                try await Task.sleep(for: .milliseconds(2))
                timeline = await caller.timeline(of: call)
            }
            if !steadyCall {
                if let ice = timeline?.timeToIceConnected, let audio = timeline?.timeToFirstAudio {
                    side.ice.append(ice.seconds * 1000)
                    side.audio.append(audio.seconds * 1000)
                } else {
                    side.failures += 1
                }
                try await Task.sleep(for: .seconds(talk))
            } else {
                try await Task.sleep(for: .seconds(1))
                let before = cpuSeconds(pid: getpid())
                try await Task.sleep(for: .seconds(steady))
                let used = cpuSeconds(pid: getpid()) - before
                side.cpuPercentPerLeg = used / steady * 100 / 2
                side.residentMiBPerLeg = Double(residentBytes(pid: getpid()) - idleRSS) / 1_048_576 / 2
                side.note = String(format: "process RSS %.0f MiB with the server and both legs", Double(residentBytes(pid: getpid())) / 1_048_576)
            }
            await caller.hangUp(call)
            while await caller.timeline(of: call)?.isEnded != true { try await Task.sleep(for: .milliseconds(5)) }
            try await Task.sleep(for: .milliseconds(200))  // the far side has ended too
            progress("\(side.name) call \(index + 1)/\(measureSteadyCall ? calls + 1 : calls)")
        }
    }

    /// Parley's softphone calling a Chromium page that answers; timed on the Parley side.
    private func parleyCallsChrome(_ base: URL, logger: Logger) async throws -> Side {
        let pages = try ChromePages(self, base: base)
        defer { pages.close() }
        let callee = try await pages.open(role: "callee", user: "bench-chrome-b", callee: "", calls: calls, steadyMs: 0)
        guard try await callee.next(timeout: .seconds(30))?["event"] as? String == "ready" else {
            throw fail("the callee browser did not connect: \(callee.errors.suffix(1500))")
        }
        let alice = try phone(base, "bench-alice", hertz: 440, logger: logger)
        try await alice.start()
        try await Task.sleep(for: .seconds(1))
        var side = Side(name: "Parley → Chromium")
        try await time(&side, from: alice, to: "bench-chrome-b", measureSteadyCall: false)
        await alice.stop()
        return side
    }

    /// A Chromium page calling Parley's softphone, which answers; timed in the page.
    private func chromeCallsParley(_ base: URL, logger: Logger) async throws -> Side {
        let bob = try phone(base, "bench-bob", hertz: 660, logger: logger)
        try await bob.start()
        let answers = answering(bob)
        defer { answers.cancel() }
        let pages = try ChromePages(self, base: base)
        defer { pages.close() }
        try await Task.sleep(for: .seconds(1))
        let caller = try await pages.open(role: "caller", user: "bench-chrome-a", callee: "bench-bob", calls: calls, steadyMs: 0)
        var side = Side(name: "Chromium → Parley")
        try await readTimings(caller, into: &side, steadyCall: false)
        await bob.stop()
        return side
    }

    // MARK: Chromium

    private func chrome(_ base: URL) async throws -> Side {
        let pages = try ChromePages(self, base: base)
        defer { pages.close() }
        let callee = try await pages.open(role: "callee", user: "bench-chrome-b", callee: "", calls: calls + 1, steadyMs: 0)
        guard try await callee.next(timeout: .seconds(30))?["event"] as? String == "ready" else {
            throw fail("the callee browser did not connect: \(callee.errors.suffix(1500))")
        }
        let caller = try await pages.open(role: "caller", user: "bench-chrome-a", callee: "bench-chrome-b", calls: calls + 1,
                                          steadyMs: Int((steady + 2) * 1000))
        var side = Side(name: "Chromium \(Browser.version(chromium))")
        try await readTimings(caller, into: &side, steadyCall: true, callee: callee)
        return side
    }

    /// Reads a caller page's reports into `side`; with `steadyCall`, measures both browsers during the last call.
    private func readTimings(_ caller: Browser, into side: inout Side, steadyCall: Bool, callee: Browser? = nil) async throws {
        while let event = try await caller.next(timeout: .seconds(30)) {
            switch event["event"] as? String {
            case "call":
                let index = (event["index"] as? NSNumber)?.intValue ?? 0
                if (event["steady"] as? NSNumber)?.boolValue != true || !steadyCall {
                    if let ice = (event["ice"] as? NSNumber)?.doubleValue, let audio = (event["audio"] as? NSNumber)?.doubleValue {
                        side.ice.append(ice)
                        side.audio.append(audio)
                    } else {
                        side.failures += 1
                        progress("chromium call without timings: \(event)")
                    }
                }
                progress("\(side.name) call \(index + 1)/\(steadyCall ? calls + 1 : calls)")
            case "steady-start":
                guard steadyCall, let callee else { break }
                try await Task.sleep(for: .seconds(1))
                let start = (cpu: caller.cpuSeconds + callee.cpuSeconds, at: ContinuousClock.now)
                try await Task.sleep(for: .seconds(steady))
                let used = caller.cpuSeconds + callee.cpuSeconds - start.cpu
                side.cpuPercentPerLeg = used / (ContinuousClock.now - start.at).seconds * 100 / 2
                side.residentMiBPerLeg = Double(caller.residentBytes + callee.residentBytes) / 1_048_576 / 2
                side.note = "RSS is each whole browser (all its processes); shared pages counted once per process"
            case "done":
                return
            case "error":
                throw fail("the browser page failed: \(event["message"] ?? "")")
            default:
                break
            }
        }
        throw fail("the caller browser stopped reporting: \(caller.errors.suffix(1500))")
    }

    // MARK: Output

    private func table(_ sides: [Side]) -> String {
        let (median, cell) = (BenchTable.median, BenchTable.cell)
        var lines = ["", String(format: "%d timed calls per side (%.1f s each), then one steady call; medians; CPU in %% of one core", calls, talk)]
        lines.append("side                         invite→ICE   invite→audio   CPU/leg   RSS/leg   failed")
        for side in sides {
            let name = side.name.padding(toLength: 28, withPad: " ", startingAt: 0)
            lines.append("\(name) \(cell(median(side.ice), "%8.0f ms"))  \(cell(median(side.audio), "%10.0f ms"))  \(cell(side.cpuPercentPerLeg, "%6.1f %%"))  \(cell(side.residentMiBPerLeg, "%5.0f MiB"))   \(side.failures)")
        }
        for side in sides where !side.note.isEmpty { lines.append("  \(side.name): \(side.note)") }
        if sides.count >= 2 {
            let c = sides[1]
            func ratio(_ a: Double?, _ b: Double?) -> String {
                guard let a, let b, b > 0 else { return "—" }
                return String(format: "%.2f", a / b)
            }
            for p in sides where p.name != c.name {
                var line = "\(p.name) / Chromium↔Chromium: invite→ICE \(ratio(median(p.ice), median(c.ice))), invite→audio \(ratio(median(p.audio), median(c.audio)))"
                if p.cpuPercentPerLeg != nil { line += ", CPU/leg \(ratio(p.cpuPercentPerLeg, c.cpuPercentPerLeg)), RSS/leg \(ratio(p.residentMiBPerLeg, c.residentMiBPerLeg))" }
                lines.append(line)
            }
        }
        return lines.joined(separator: "\n")
    }

    private func progress(_ text: String) {
        try? FileHandle.standardError.write(contentsOf: Data("bench: \(text)\n".utf8))
    }

    static func nonLoopbackInterfaces() -> [String]? {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return nil }
        defer { freeifaddrs(list) }
        var names: Set<String> = []
        for entry in sequence(first: first, next: { $0.pointee.ifa_next }) {
            let flags = Int32(entry.pointee.ifa_flags)
            guard flags & Int32(IFF_UP) != 0, flags & Int32(IFF_LOOPBACK) == 0, entry.pointee.ifa_addr != nil else { continue }
            names.insert(String(cString: entry.pointee.ifa_name))
        }
        return names.sorted()
    }
}

/// The bench page in headless Chromium windows, each with its own profile, all stopped by `close()`.
final class ChromePages: @unchecked Sendable {
    private let bench: BenchCalls
    private let base: URL
    private let directory: URL
    private let page: URL
    private var browsers: [Browser] = []

    init(_ bench: BenchCalls, base: URL) throws {
        guard FileManager.default.isExecutableFile(atPath: bench.chromium) else {
            throw fail("\(bench.chromium) not found: install Debian's chromium (scripts/setup.sh chromium)")
        }
        self.bench = bench
        self.base = base
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-bench-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        page = directory.appendingPathComponent("peer.html")
        try BenchPage.html.write(to: page, atomically: true, encoding: .utf8)
    }

    func open(role: String, user: String, callee: String, calls: Int, steadyMs: Int) async throws -> Browser {
        let token = try await Softphone.developmentToken(server: base, user: UserID(rawValue: user)!, name: nil)
        var components = URLComponents(url: page, resolvingAgainstBaseURL: false)!
        components.queryItems = [
            .init(name: "ws", value: base.absoluteString.replacingOccurrences(of: "http://", with: "ws://") + "/v1/signal"),
            .init(name: "token", value: token), .init(name: "device", value: "\(user)-chromium"),
            .init(name: "role", value: role), .init(name: "callee", value: callee), .init(name: "calls", value: "\(calls)"),
            .init(name: "talk", value: "\(Int(bench.talk * 1000))"), .init(name: "steady", value: "\(steadyMs)"),
        ]
        let browser = try Browser(bench.chromium, url: components.url!.absoluteString, profile: directory.appendingPathComponent(user))
        browsers.append(browser)
        return browser
    }

    func close() {
        for browser in browsers { browser.stop() }
        try? FileManager.default.removeItem(at: directory)
    }
}

/// A headless Chromium reporting the page's console lines. Foundation starts it in a session of its
/// own, so its process group is its pid; it is stopped by that group.
final class Browser: @unchecked Sendable {
    private let process: Process
    private let log = LockedText()
    private let reports = LockedQueue()

    init(_ executable: String, url: String, profile: URL) throws {
        process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = ["--headless=new", "--no-sandbox", "--use-fake-device-for-media-stream",
                             "--use-fake-ui-for-media-stream", "--allow-loopback-in-peer-connection",
                             "--disable-features=WebRtcHideLocalIpsWithMdns", "--autoplay-policy=no-user-gesture-required",
                             "--no-first-run", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                             "--user-data-dir=\(profile.path)", url]
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        let log = self.log, reports = self.reports
        try process.run()
        Thread.detachNewThread {
            var pending = ""
            while true {
                let chunk = errors.fileHandleForReading.availableData
                if chunk.isEmpty { break }
                pending += String(decoding: chunk, as: UTF8.self)
                while let newline = pending.firstIndex(of: "\n") {
                    let line = String(pending[..<newline])
                    pending = String(pending[pending.index(after: newline)...])
                    log.append(line + "\n")
                    if let start = line.range(of: "\"PARLEY "), let end = line.range(of: "\", source:", options: .backwards) {
                        reports.push(String(line[start.upperBound..<end.lowerBound]))
                    }
                }
            }
            reports.close()
        }
    }

    var errors: String { log.text }

    /// The page's next report, or nil when the browser exits or stays silent past `timeout`.
    func next(timeout: Duration) async throws -> [String: Any]? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            switch reports.pop() {
            case .line(let line):
                guard let data = line.data(using: .utf8) else { continue }
                return try JSONSerialization.jsonObject(with: data) as? [String: Any]
            case .closed:
                return nil
            case .empty:
                try await Task.sleep(for: .milliseconds(5))
            }
        }
        return nil
    }

    /// Every process of this browser: the one started and its descendants.
    private var processes: [Int32] {
        var parents: [Int32: [Int32]] = [:]
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = Int32(entry), let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { continue }
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            if fields.count > 1, let parent = Int32(fields[1]) { parents[parent, default: []].append(pid) }
        }
        var all: [Int32] = [process.processIdentifier]
        var index = 0
        while index < all.count {
            all += parents[all[index]] ?? []
            index += 1
        }
        return all
    }

    var cpuSeconds: Double { processes.reduce(0) { $0 + ParleyCLI.cpuSeconds(pid: $1) } }
    var residentBytes: Int { processes.reduce(0) { $0 + ParleyCLI.residentBytes(pid: $1) } }

    func stop() {
        guard process.isRunning else { return }
        let pid = process.processIdentifier
        let everyone = processes
        let ownGroup = getpgid(pid) == pid
        func signal(_ number: Int32) {
            if ownGroup { kill(-pid, number) } else { for child in everyone { kill(child, number) } }
        }
        signal(SIGTERM)
        let deadline = Date().addingTimeInterval(3)
        while process.isRunning, Date() < deadline { usleep(20_000) }
        signal(SIGKILL)
        process.waitUntilExit()
    }

    static func version(_ executable: String) -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = ["--version"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return "" }
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return text.split(separator: " ").first { $0.first?.isNumber == true }.map { String($0) } ?? ""
    }
}

final class LockedQueue: @unchecked Sendable {
    enum Item { case line(String), empty, closed }
    private let lock = NSLock()
    private var lines: [String] = []
    private var closed = false
    func push(_ line: String) { lock.withLock { lines.append(line) } }
    func close() { lock.withLock { closed = true } }
    func pop() -> Item {
        lock.withLock {
            if !lines.isEmpty { return .line(lines.removeFirst()) }
            return closed ? .closed : .empty
        }
    }
}

final class LockedText: @unchecked Sendable {
    private let lock = NSLock()
    private var buffer = ""
    func append(_ text: String) { lock.withLock { buffer += text } }
    var text: String { lock.withLock { buffer } }
}

/// Cells of the benchmark tables.
enum BenchTable {
    static func median(_ values: [Double]) -> Double? {
        guard !values.isEmpty else { return nil }
        let sorted = values.sorted()
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }

    /// `value` in `format`, or a dash aligned as the number would be.
    static func cell(_ value: Double?, _ format: String) -> String {
        value.map { String(format: format, $0) } ?? String(repeating: " ", count: String(format: format, 0.0).count - 1) + "—"
    }
}
