import Foundation
import ParleyGStreamer
import ParleyServer
import ParleyServerTesting
import ParleySoftphone
import Testing

/// A real server, chromedriver and headless Chromium windows with tone files for microphones.
final class BrowserLab: @unchecked Sendable {
    let server: LiveServer
    let driver: WebDriver
    let directory: URL
    private var browsers: [Browser] = []

    /// Skips (with the reason) where Chromium cannot run isolated; fails instead under
    /// `PARLEY_REQUIRE_ALL_TESTS=1`, which `scripts/test.sh` sets, so CI never skips these tests.
    static let enabled: Bool = {
        guard let reason = WebDriver.unavailable else { return true }
        if ProcessInfo.processInfo.environment["PARLEY_REQUIRE_ALL_TESTS"] == "1" { return true }
        print("◇ browser tests skipped: \(reason)")
        return false
    }()

    /// `driver`: where chromedriver and its browsers run (loopback, or a namespace of the test's).
    static func run(configure: (inout ServerConfiguration) -> Void = { _ in },
                    driver makeDriver: () async throws -> WebDriver = { try await WebDriver.start() },
                    _ body: (BrowserLab) async throws -> Void) async throws {
        if let reason = WebDriver.unavailable { throw TestFailure(reason) }
        let server = try await LiveServer.start(configure: configure)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-browser-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let driver: WebDriver
        do { driver = try await makeDriver() } catch { try? await server.stop(); throw error }
        let lab = BrowserLab(server: server, driver: driver, directory: directory)
        do {
            try await body(lab)
        } catch {
            await lab.printConsoles()
            await lab.close()
            try? await server.stop()
            throw error
        }
        await lab.close()
        try await server.stop()
    }

    private init(server: LiveServer, driver: WebDriver, directory: URL) {
        self.server = server
        self.driver = driver
        self.directory = directory
    }

    /// A browser on the Parley page whose microphone plays a tone of `hertz`; the page comes from
    /// (and signals to) `base` if given, a proxy in front of the server, else the server itself;
    /// `arguments`: more for Chromium.
    func browser(tone hertz: Double, through base: String? = nil, arguments: [String] = []) async throws -> Browser {
        let tone = directory.appendingPathComponent("tone-\(Int(hertz)).wav")
        if !FileManager.default.fileExists(atPath: tone.path) { try Self.writeTone(hertz, to: tone) }
        let profile = directory.appendingPathComponent("profile-\(browsers.count)")
        let browser = try await driver.browser(audioFile: tone, profile: profile, arguments: arguments)
        browsers.append(browser)
        try await browser.open((base ?? server.baseURL) + "/")
        return browser
    }

    /// Signs in by name with the keyboard, as a person would, and waits until the page is online.
    func signIn(_ browser: Browser, as user: String) async throws {
        try await browser.type("#signin-user", user + "\u{E007}")
        try await eventually(timeout: .seconds(10), "\(user) online") {
            try await browser.snapshot()["connection"] as? String == "online"
        }
    }

    func close() async {
        for browser in browsers { await browser.close() }
        driver.stop()
        try? FileManager.default.removeItem(at: directory)
    }

    func printConsoles() async {
        for (index, browser) in browsers.enumerated() {
            let lines = await browser.console()
            if !lines.isEmpty { print("browser \(index) console:\n  " + lines.suffix(30).joined(separator: "\n  ")) }
        }
    }

    /// Where screenshots go: `$PARLEY_ARTIFACTS`, else `.build/test-artifacts`.
    static var artifacts: URL {
        let path = ProcessInfo.processInfo.environment["PARLEY_ARTIFACTS"] ?? ".build/test-artifacts"
        let url = URL(fileURLWithPath: path)
        try? FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    static func writeTone(_ hertz: Double, to url: URL) throws {
        let rate = 48_000
        let samples = (0..<(rate * 4)).map { Float(0.5 * sin(2 * Double.pi * hertz * Double($0) / Double(rate))) }
        try WAV.write(WAV.Audio(sampleRate: rate, channels: 1, samples: samples), to: url)
    }
}

extension Browser {
    func call() async throws -> [String: Any] { try await snapshot()["call"] as? [String: Any] ?? [:] }

    /// The page dials `user`, a Linux softphone whose events `log` collects, which answers; answers
    /// the call's id once the page's call is active. `video` ticks the page's video box first.
    func call(_ user: String, answeredBy phone: Softphone, log: EventCollector, video: Bool = false) async throws -> UUID {
        if video { try await click("#dial-video") }
        try await type("#dial-user", user + "\u{E007}")
        try await eventually("\(user) is called") { log.events.contains { if case .incoming = $0 { true } else { false } } }
        let call = try #require(log.events.lazy.compactMap { if case .incoming(let id, _, _, _) = $0 { id } else { nil } }.first)
        await phone.answer(call)
        try await waitForCall("active")
        return call
    }

    func callState() async throws -> String? { try await call()["state"] as? String }

    func notice() async throws -> String { try await snapshot()["notice"] as? String ?? "" }

    /// Waits until the page's call is in `state`.
    func waitForCall(_ state: String, timeout: Duration = .seconds(15)) async throws {
        try await eventually(timeout: timeout, "call \(state)") { try await callState() == state }
    }

    /// Waits until the far side's audio, measured by the page's WebAudio analyser, has its
    /// strongest frequency within 20 Hz of `hertz` (the analyser's bins are 11.7 Hz wide).
    func waitForRemoteTone(_ hertz: Double) async throws {
        var last: Double?
        do {
            try await eventually(timeout: .seconds(15), "remote tone \(hertz) Hz") {
                last = try await snapshot()["remoteFrequency"] as? Double
                return last.map { abs($0 - hertz) < 20 } ?? false
            }
        } catch {
            throw TestFailure("expected the far side's \(Int(hertz)) Hz tone, the analyser says \(last.map { "\(Int($0)) Hz" } ?? "silence")")
        }
    }

    /// The far side's level in dBFS as the page's analyser measures it. A page that measures nothing
    /// (no remote stream, no meter) is a failure, not silence: a silence check must see a level.
    func remoteLevel() async throws -> Double {
        guard let level = try await snapshot()["remoteLevelDb"] as? Double else {
            throw TestFailure("the page reports no level for the far side (no remote audio is being measured)")
        }
        return level
    }
}
