import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real TCP load balancer (Debian's `haproxy`) in front of several servers on loopback, for
/// tests: each front door has its own order of preference among the servers (the first that passes
/// its health check takes new connections, the others are backups), so a test decides which node a
/// client reaches, and where it goes when that node is down. Stopped by PID.
public final class HAProxy: @unchecked Sendable {
    public let process: Process
    public let directory: URL
    /// Each front door's port, in the order of `preferences`.
    public let ports: [Int]

    public static let executable = "/usr/sbin/haproxy"

    /// - Parameters:
    ///   - preferences: for each front door, the servers' ports in order of preference.
    ///   - roundRobin: with it, each door sends each new connection to the next live server in
    ///     turn (HAProxy's `balance roundrobin`), as a load balancer sends a reconnect to another
    ///     node; without it, to the first live one.
    public static func start(preferences: [[Int]], roundRobin: Bool = false) async throws -> HAProxy {
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw TestFailure("\(executable) is missing: scripts/setup.sh --tests installs haproxy")
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-haproxy-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let ports = try preferences.map { _ in try freeTCPPort() }
        var lines = [
            "global", "  maxconn 4096",
            "defaults", "  mode tcp", "  timeout connect 1s", "  timeout client 1h", "  timeout server 1h",
            "  retries 3", "  option redispatch",
        ]
        for (index, (port, servers)) in zip(ports, preferences).enumerated() {
            lines += ["frontend door\(index)", "  bind 127.0.0.1:\(port)", "  default_backend prefer\(index)",
                      "backend prefer\(index)"]
            if roundRobin { lines.append("  balance roundrobin") }
            for (rank, server) in servers.enumerated() {
                let backup = rank == 0 || roundRobin ? "" : " backup"
                lines.append("  server s\(server) 127.0.0.1:\(server) check inter 200ms fall 1 rise 1\(backup)")
            }
        }
        let configuration = directory.appendingPathComponent("haproxy.cfg")
        try (lines.joined(separator: "\n") + "\n").write(to: configuration, atomically: true, encoding: .utf8)
        let proxy = try HAProxy(configuration: configuration, directory: directory, ports: ports)
        do {
            try await eventually(timeout: .seconds(10), "haproxy listening") {
                guard proxy.process.isRunning else { throw TestFailure("haproxy exited: \(proxy.output)") }
                return ports.allSatisfy { canConnect("127.0.0.1", $0) }
            }
        } catch {
            proxy.stop()
            throw error
        }
        return proxy
    }

    private init(configuration: URL, directory: URL, ports: [Int]) throws {
        self.directory = directory
        self.ports = ports
        process = Process()
        process.executableURL = URL(fileURLWithPath: Self.executable)
        process.arguments = ["-db", "-f", configuration.path]
        let log = directory.appendingPathComponent("haproxy.log")
        guard FileManager.default.createFile(atPath: log.path, contents: nil) else { throw TestFailure("cannot write \(log.path)") }
        let output = try FileHandle(forWritingTo: log)
        process.standardOutput = output
        process.standardError = output
        try process.run()
    }

    /// What HAProxy printed (for a failing test's message).
    public var output: String {
        (try? String(contentsOf: directory.appendingPathComponent("haproxy.log"), encoding: .utf8)) ?? ""
    }

    public func stop() {
        stopProcess(process, with: SIGTERM, grace: 3)
        try? FileManager.default.removeItem(at: directory)
    }
}
