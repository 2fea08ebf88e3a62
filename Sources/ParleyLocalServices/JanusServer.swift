import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real Janus (Debian's `janus` 1.1.2) with a private configuration, for tests: the WebSocket
/// API and the AudioBridge plugin only, ICE on one interface of a test network. Stopped by PID.
///
/// Janus never gathers candidates on loopback, so it needs `TestNetwork.janusLink()` first: a veth
/// pair inside the tests' own network namespace, Janus on 198.51.100.1, clients on 198.51.100.2.
public final class JanusServer: @unchecked Sendable {
    public let process: Process
    public let directory: URL
    public let port: Int
    public let address: String
    private let log: URL

    public static let executable = "/usr/bin/janus"
    /// Debian installs Janus's plugins under the machine's multiarch directory.
    static let modules = "/usr/lib/\(multiarch)/janus"

    /// The machine's Debian multiarch triplet (x86_64-linux-gnu, aarch64-linux-gnu, …), as
    /// dpkg-architecture (dpkg-dev) tells it, or else the one of the architecture Parley was built for.
    static let multiarch: String = {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice  // its warnings about a missing C compiler
        do {
            try process.run()
            let answer = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                .trimmingCharacters(in: .whitespacesAndNewlines)
            process.waitUntilExit()
            if process.terminationStatus == 0, !answer.isEmpty { return answer }
        } catch {}  // no /usr/bin/env: the build's architecture below
        #if arch(arm64)
        return "aarch64-linux-gnu"
        #else
        return "x86_64-linux-gnu"
        #endif
    }()

    /// The WebSocket API (subprotocol `janus-protocol`).
    public var url: String { "ws://\(address):\(port)" }

    /// Starts Janus and waits until its WebSocket port accepts connections.
    /// - Parameter sessionTimeout: seconds without a keepalive before Janus ends a session.
    public static func start(address: String = TestNetwork.janusAddress, interface: String = TestNetwork.janusInterface,
                             port: Int? = nil, sessionTimeout: Int = 60) async throws -> JanusServer {
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw TestFailure("\(executable) is missing: scripts/setup.sh --tests installs janus")
        }
        let port = try port ?? freeTCPPort()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-janus-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try configuration(address: address, interface: interface, port: port, sessionTimeout: sessionTimeout, in: directory)
        let server = try JanusServer(directory: directory, port: port, address: address)
        try await eventually(timeout: .seconds(10), "janus listening on \(address):\(port)") {
            guard server.process.isRunning else { throw TestFailure("janus exited: \(server.output.suffix(2000))") }
            return canConnect(address, port)
        }
        return server
    }

    private init(directory: URL, port: Int, address: String) throws {
        self.directory = directory
        self.port = port
        self.address = address
        log = directory.appendingPathComponent("janus.log")
        process = Process()
        process.executableURL = URL(fileURLWithPath: Self.executable)
        process.arguments = ["-C", directory.appendingPathComponent("janus.jcfg").path, "-F", directory.path, "-o", "-N",
                             "-L", log.path, "-d", ProcessInfo.processInfo.environment["PARLEY_JANUS_DEBUG"] ?? "4"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
    }

    /// What Janus logged (for a failing test's message).
    public var output: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

    /// Stops Janus (SIGINT, then SIGKILL after 3 s) and removes its files.
    public func stop() {
        stopProcess(process, with: SIGINT, grace: 3)
        try? FileManager.default.removeItem(at: directory)
    }

    /// Whether tests of `what` that need a real Janus can run here. Where they cannot, prints why and
    /// answers false (the tests skip), except under `PARLEY_REQUIRE_ALL_TESTS=1` (set by
    /// `scripts/test.sh`), where they run and fail with the reason.
    public static func testsCanRun(_ what: String) -> Bool {
        let reason = TestNetwork.unavailable ?? (FileManager.default.isExecutableFile(atPath: executable) ? nil : "janus is not installed")
        guard let reason else { return true }
        if ProcessInfo.processInfo.environment["PARLEY_REQUIRE_ALL_TESTS"] == "1" { return true }
        print("◇ \(what) skipped: \(reason)")
        return false
    }

    /// CPU seconds Janus has used so far, from /proc.
    public var cpuSeconds: Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    static func configuration(address: String, interface: String, port: Int, sessionTimeout: Int, in directory: URL) throws {
        func plugins(_ folder: String, keeping: Set<String>) -> String {
            let all = (try? FileManager.default.contentsOfDirectory(atPath: "\(modules)/\(folder)")) ?? []
            return all.filter { $0.hasSuffix(".so") && !keeping.contains($0) }.sorted().joined(separator: ",")
        }
        let files = [
            "janus.jcfg": """
                general: {
                    configs_folder = "\(directory.path)"
                    plugins_folder = "\(modules)/plugins"
                    transports_folder = "\(modules)/transports"
                    events_folder = "\(modules)/events"
                    loggers_folder = "\(modules)/loggers"
                    debug_level = 4
                    session_timeout = \(sessionTimeout)
                    reclaim_session_timeout = 0
                    interface = "\(address)"
                    server_name = "parley-test-janus"
                    protected_folders = []
                }
                media: {
                    rtp_port_range = "20000-40000"
                }
                nat: {
                    ice_enforce_list = "\(interface)"
                    ignore_mdns = true
                }
                plugins: {
                    disable = "\(plugins("plugins", keeping: ["libjanus_audiobridge.so"]))"
                }
                transports: {
                    disable = "\(plugins("transports", keeping: ["libjanus_websockets.so"]))"
                }
                loggers: {
                    disable = "\(plugins("loggers", keeping: []))"
                }
                events: {
                    broadcast = false
                    disable = "\(plugins("events", keeping: []))"
                }
                """,
            "janus.transport.websockets.jcfg": """
                general: {
                    json = "compact"
                    ws = true
                    ws_port = \(port)
                    ws_ip = "\(address)"
                    wss = false
                }
                admin: {
                    admin_ws = false
                    admin_wss = false
                }
                """,
            "janus.plugin.audiobridge.jcfg": """
                general: {
                    events = false
                }
                """,
        ]
        for (name, text) in files {
            try text.write(to: directory.appendingPathComponent(name), atomically: true, encoding: .utf8)
        }
    }
}

/// The tests' own network: a veth pair inside the network namespace `scripts/test.sh` makes.
public enum TestNetwork {
    public static let janusAddress = "198.51.100.1"
    public static let clientAddress = "198.51.100.2"
    public static let janusInterface = "parley-janus"
    public static let clientInterface = "parley-client"

    /// Why the tests cannot make their network here, or nil when they can.
    public static var unavailable: String? {
        if getuid() != 0 { return "making a veth pair needs root" }
        let outside = nonTestAddresses()
        if !outside.isEmpty {
            return "this network namespace has \(outside.joined(separator: ", ")): run the tests through scripts/test.sh, which gives them a namespace of their own"
        }
        return nil
    }

    private static let setUp: Result<Void, TestFailure> = {
        if let reason = unavailable { return .failure(TestFailure(reason)) }
        if FileManager.default.fileExists(atPath: "/sys/class/net/\(janusInterface)") { return .success(()) }
        let script = """
            set -e
            ip link add \(janusInterface) type veth peer name \(clientInterface)
            for dev in all default \(janusInterface) \(clientInterface); do
              sysctl -qw net.ipv6.conf.$dev.disable_ipv6=1 2>/dev/null || true
            done
            for dev in all \(janusInterface) \(clientInterface); do
              sysctl -qw net.ipv4.conf.$dev.accept_local=1
              sysctl -qw net.ipv4.conf.$dev.rp_filter=0
            done
            ip addr add \(janusAddress)/24 dev \(janusInterface)
            ip addr add \(clientAddress)/24 dev \(clientInterface)
            ip link set \(janusInterface) up
            ip link set \(clientInterface) up
            ip link set lo up
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", script]
        let errors = Pipe()
        process.standardError = errors
        do { try process.run() } catch { return .failure(TestFailure("cannot run sh: \(error)")) }
        let message = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return process.terminationStatus == 0 ? .success(()) : .failure(TestFailure("setting up the test network failed: \(message)"))
    }()

    /// Makes the veth pair once per test process (idempotent), inside the tests' own namespace only.
    public static func janusLink() throws { try setUp.get() }

    /// IPv4 addresses outside loopback and the test ranges (198.51.100.0/24, 203.0.113.0/24).
    public static func nonTestAddresses() -> [String] {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return [] }
        defer { freeifaddrs(list) }
        var found: [String] = []
        for entry in sequence(first: first, next: { $0.pointee.ifa_next }) {
            guard let address = entry.pointee.ifa_addr, address.pointee.sa_family == sa_family_t(AF_INET),
                  entry.pointee.ifa_flags & UInt32(IFF_UP) != 0 else { continue }
            var text = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN))
            address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
                var addr = sin.pointee.sin_addr
                _ = inet_ntop(AF_INET, &addr, &text, socklen_t(INET_ADDRSTRLEN))
            }
            let ip = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if ip.hasPrefix("127.") || ip.hasPrefix("198.51.100.") || ip.hasPrefix("203.0.113.") { continue }
            found.append(ip)
        }
        return found
    }
}

/// A TCP port nothing listens on now.
public func freeTCPPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else { throw TestFailure("no free port") }
    return Int(UInt16(bigEndian: address.sin_port))
}

func canConnect(_ host: String, _ port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr(host)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}
