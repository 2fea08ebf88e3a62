import Foundation
import ParleyServerTesting

/// A real coturn TURN server on loopback with a private configuration, started and stopped by PID.
final class Coturn: @unchecked Sendable {
    let port: Int
    let secret: String
    private let process: Process
    private let directory: URL

    static var isInstalled: Bool { FileManager.default.isExecutableFile(atPath: "/usr/bin/turnserver") }

    /// Skips (with the reason) where coturn is missing; under `PARLEY_REQUIRE_ALL_TESTS=1`, which
    /// `scripts/test.sh` sets, the test runs and fails instead, as the Chromium and Janus tests do.
    static let testsEnabled: Bool = {
        if isInstalled || ProcessInfo.processInfo.environment["PARLEY_REQUIRE_ALL_TESTS"] == "1" { return true }
        print("◇ coturn tests skipped: coturn is not installed (scripts/setup.sh --tests installs it)")
        return false
    }()

    /// The ports coturn relays from: a relay candidate it allocated has one of them.
    let relayPorts: ClosedRange<Int>

    init() async throws {
        guard Self.isInstalled else { throw TestFailure("coturn is not installed: scripts/setup.sh --tests installs it") }
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-coturn-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        secret = UUID().uuidString
        port = Int.random(in: 20_000...29_000)
        let relayPorts = Int.random(in: 40_000...49_000)
        self.relayPorts = relayPorts...(relayPorts + 50)
        let config = """
            listening-ip=127.0.0.1
            relay-ip=127.0.0.1
            listening-port=\(port)
            min-port=\(relayPorts)
            max-port=\(relayPorts + 50)
            realm=parley.test
            use-auth-secret
            static-auth-secret=\(secret)
            fingerprint
            no-tls
            no-dtls
            no-cli
            no-tcp-relay
            allow-loopback-peers
            log-file=stdout
            simple-log
            verbose
            pidfile=\(directory.path)/turnserver.pid
            userdb=\(directory.path)/turndb
            """
        let file = directory.appendingPathComponent("turnserver.conf")
        try config.write(to: file, atomically: true, encoding: .utf8)
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/turnserver")
        process.arguments = ["-c", file.path]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let log = self.log
        Thread.detachNewThread {
            while true {
                let chunk = output.fileHandleForReading.availableData
                if chunk.isEmpty { return }
                log.append(String(decoding: chunk, as: UTF8.self))
            }
        }
        // Ready once its listeners and relay threads are up.
        let deadline = ContinuousClock.now + .seconds(5)
        while !log.text.contains("Total General servers") {
            guard process.isRunning, ContinuousClock.now < deadline else {
                stop()
                throw TestFailure("coturn did not start: \(log.text.suffix(2000))")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        try await Task.sleep(for: .milliseconds(100))
    }

    private let log = Log()

    final class Log: @unchecked Sendable {
        private let lock = NSLock()
        private var buffer = ""
        func append(_ text: String) { lock.withLock { buffer += text } }
        var text: String { lock.withLock { buffer } }
    }

    var url: String { "turn:127.0.0.1:\(port)?transport=udp" }

    /// What coturn logged so far.
    var output: String { log.text }

    /// Whether coturn logged a successful allocation for a TURN REST username of `user`.
    func allocated(for user: String) -> Bool {
        output.split(separator: "\n").contains { $0.contains(":\(user)>") && $0.contains("ALLOCATE processed, success") }
    }

    func stop() {
        if process.isRunning {
            // coturn may take its time over SIGTERM; it holds nothing worth a clean exit here.
            kill(process.processIdentifier, SIGTERM)
            let deadline = Date().addingTimeInterval(1)
            while process.isRunning, Date() < deadline { usleep(10_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(at: directory)
    }

    deinit { stop() }
}
