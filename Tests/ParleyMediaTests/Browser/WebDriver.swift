import Foundation
import ParleyServerTesting

/// A small W3C WebDriver client for Debian's chromedriver: sessions, navigation, elements, keys,
/// scripts and screenshots — what the browser tests need, over plain HTTP on loopback.
final class WebDriver: Sendable {
    let process: Process
    let port: Int
    /// Where chromedriver listens: loopback, or its namespace's end of a link to ours.
    let host: String

    static let chromedriver = "/usr/bin/chromedriver"
    static let chromium = "/usr/bin/chromium"

    /// Why the browser tests cannot run here, or nil when they can.
    static var unavailable: String? {
        for tool in [chromedriver, chromium] where !FileManager.default.isExecutableFile(atPath: tool) {
            return "\(tool) is missing: scripts/setup.sh --tests installs chromium and chromium-driver"
        }
        if let outside = TestNetwork.nonTestAddresses().first {
            return "Chromium would gather ICE candidates on \(outside); run the tests through scripts/test.sh, which isolates the network"
        }
        return nil
    }

    /// chromedriver on loopback; or, with `namespace`, in that network namespace (`ip netns`), so
    /// that its browsers gather candidates on that namespace's links only, reached at `host` over a
    /// link from this process's namespace whose own end is `client`.
    static func start(namespace: String? = nil, host: String = "127.0.0.1", client: String = "127.0.0.1") async throws -> WebDriver {
        let port = namespace == nil ? try freeTCPPort() : Int.random(in: 19_000...19_999)
        let process = Process()
        let arguments = ["--port=\(port)", "--allowed-ips=\(client)"]
        if let namespace {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["ip", "netns", "exec", namespace, chromedriver] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: chromedriver)
            process.arguments = arguments
        }
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let driver = WebDriver(process: process, port: port, host: host)
        do {
            try await eventually(timeout: .seconds(15), "chromedriver ready") {
                (try? await driver.call("GET", "/status"))?["ready"] as? Bool == true
            }
        } catch {
            driver.stop()
            throw error
        }
        return driver
    }

    private init(process: Process, port: Int, host: String) {
        self.process = process
        self.port = port
        self.host = host
    }

    /// Stops chromedriver and every browser it started (its process group).
    func stop() {
        guard process.isRunning else { return }
        kill(-process.processIdentifier, SIGKILL)
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// A new headless Chromium whose fake microphone plays `audioFile` in a loop.
    func browser(audioFile: URL?, profile: URL, arguments more: [String] = []) async throws -> Browser {
        var arguments = [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
            "--allow-loopback-in-peer-connection", "--disable-features=WebRtcHideLocalIpsWithMdns",
            "--autoplay-policy=no-user-gesture-required", "--window-size=1000,1500",
            "--user-data-dir=\(profile.path)",
        ]
        if let audioFile { arguments.append("--use-file-for-fake-audio-capture=\(audioFile.path)") }
        arguments += more
        let capabilities: [String: Any] = ["capabilities": ["alwaysMatch": [
            "browserName": "chrome",
            "goog:chromeOptions": ["binary": Self.chromium, "args": arguments],
            "goog:loggingPrefs": ["browser": "ALL"],
        ]]]
        let value = try await call("POST", "/session", capabilities)
        guard let id = value["sessionId"] as? String else { throw TestFailure("chromedriver gave no session: \(value)") }
        return Browser(driver: self, session: id)
    }

    /// One WebDriver command; answers its `value`, throws the WebDriver error.
    @discardableResult
    func call(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> [String: Any] {
        let value = try await command(method, path, body)
        return value as? [String: Any] ?? ["value": value as Any]
    }

    func command(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> Any? {
        let payload = try body.map { try JSONSerialization.data(withJSONObject: $0) }
        let data = try await LoopbackHTTP.request(method, host: host, port: port, path: path, body: payload)
        let object = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed]) as? [String: Any]
        let value = object?["value"]
        if let failure = value as? [String: Any], let error = failure["error"] as? String {
            throw TestFailure("WebDriver \(method) \(path): \(error): \(failure["message"] as? String ?? "")")
        }
        return value is NSNull ? nil : value
    }
}

/// One browser window in a WebDriver session.
struct Browser: Sendable {
    let driver: WebDriver
    let session: String

    func open(_ url: String) async throws {
        try await driver.call("POST", "/session/\(session)/url", ["url": url])
    }

    func element(_ css: String) async throws -> String {
        let value = try await driver.call("POST", "/session/\(session)/element", ["using": "css selector", "value": css])
        guard let id = value.values.first as? String else { throw TestFailure("no element \(css)") }
        return id
    }

    func click(_ css: String) async throws {
        try await driver.call("POST", "/session/\(session)/element/\(try await element(css))/click", [:])
    }

    func clear(_ css: String) async throws {
        try await driver.call("POST", "/session/\(session)/element/\(try await element(css))/clear", [:])
    }

    /// Types into an element; "\u{E007}" is Enter.
    func type(_ css: String, _ text: String) async throws {
        try await driver.call("POST", "/session/\(session)/element/\(try await element(css))/value", ["text": text])
    }

    /// Presses one key on whatever has the focus ("\u{E007}" Enter, "\u{E00C}" Escape).
    func press(_ key: String) async throws {
        try await driver.call("POST", "/session/\(session)/actions", ["actions": [[
            "type": "key", "id": "keyboard",
            "actions": [["type": "keyDown", "value": key], ["type": "keyUp", "value": key]],
        ]]])
        _ = try await driver.command("DELETE", "/session/\(session)/actions")
    }

    /// Runs `script` (a function body) in the page and answers its return value.
    func run(_ script: String, _ arguments: [Any] = []) async throws -> Any? {
        try await driver.command("POST", "/session/\(session)/execute/sync", ["script": script, "args": arguments])
    }

    /// Runs an async function body in the page (`await` allowed) and answers its result.
    func evaluate(_ body: String) async throws -> Any? {
        try await driver.command("POST", "/session/\(session)/execute/async", [
            "script": "const done = arguments[arguments.length - 1]; (async () => { \(body) })().then(done, (e) => done({error: String(e)}));",
            "args": [],
        ])
    }

    /// `window.parley.snapshot()`: what the page shows.
    func snapshot() async throws -> [String: Any] {
        try await run("return window.parley ? window.parley.snapshot() : {};") as? [String: Any] ?? [:]
    }

    func screenshot(to url: URL) async throws {
        guard let base64 = try await driver.command("GET", "/session/\(session)/screenshot") as? String,
              let data = Data(base64Encoded: base64) else { throw TestFailure("no screenshot") }
        try data.write(to: url)
    }

    /// The page's console lines so far (warnings and errors help when a test fails).
    func console() async -> [String] {
        let entries = (try? await driver.command("POST", "/session/\(session)/se/log", ["type": "browser"])) as? [[String: Any]] ?? []
        return entries.compactMap { $0["message"] as? String }
    }

    func close() async {
        _ = try? await driver.command("DELETE", "/session/\(session)")
    }
}

/// HTTP/1.1 over a plain socket (to loopback, or a test namespace's address), one request per
/// connection. chromedriver writes headers without a space after the colon, which Foundation's
/// URLSession on Linux refuses.
enum LoopbackHTTP {
    static func request(_ method: String, host: String = "127.0.0.1", port: Int, path: String, body: Data?) async throws -> Data {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(with: Result { try exchange(method, host: host, port: port, path: path, body: body) })
            }
        }
    }

    private static func exchange(_ method: String, host: String, port: Int, path: String, body: Data?) throws -> Data {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestFailure("socket: \(errno)") }
        defer { close(fd) }
        var timeout = timeval(tv_sec: 120, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr(host)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else { throw TestFailure("cannot connect to \(host):\(port)") }
        var request = Data("\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\n".utf8)
        if let body {
            request.append(Data("Content-Type: application/json\r\nContent-Length: \(body.count)\r\n".utf8))
        }
        request.append(Data("\r\n".utf8))
        if let body { request.append(body) }
        try request.withUnsafeBytes { buffer in
            var sent = 0
            while sent < buffer.count {
                let n = send(fd, buffer.baseAddress! + sent, buffer.count - sent, Int32(MSG_NOSIGNAL))
                guard n > 0 else { throw TestFailure("send failed: \(errno)") }
                sent += n
            }
        }
        // Read the headers, then exactly Content-Length bytes (chromedriver keeps connections open).
        var response = Data()
        var chunk = [UInt8](repeating: 0, count: 65_536)
        var expected: Int?
        var bodyStart = 0
        while expected.map({ response.count < bodyStart + $0 }) ?? true {
            let n = recv(fd, &chunk, chunk.count, 0)
            guard n > 0 else { throw TestFailure("the answer from \(host):\(port) ended early (errno \(errno))") }
            response.append(contentsOf: chunk[0..<n])
            if expected == nil, let end = response.range(of: Data("\r\n\r\n".utf8)) {
                let head = String(decoding: response[..<end.lowerBound], as: UTF8.self).lowercased()
                guard let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
                      let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) else {
                    throw TestFailure("no Content-Length in the answer from \(host):\(port)")
                }
                expected = length
                bodyStart = end.upperBound
            }
        }
        return Data(response[bodyStart..<(bodyStart + expected!)])
    }
}
