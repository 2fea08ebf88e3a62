import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real PostgreSQL (Debian's `postgresql`) of a test's own: a fresh cluster in a temporary
/// directory, listening on a Unix socket there and nowhere else, with fsync off. Stopped by PID.
///
/// PostgreSQL refuses to run as root; as root the cluster belongs to Debian's `postgres` user
/// (`setpriv` drops to it). Each `database()` is a new, empty database for one test.
public final class PostgresServer: @unchecked Sendable {
    /// The running server's process (a new one after `restart()`).
    public var process: Process { lock.withLock { current } }
    public let directory: URL
    public let port: Int
    private let binaries: String
    private let log: URL
    private let owner: (uid: uid_t, gid: gid_t)?
    private let settings: [String]
    private var current: Process
    private let lock = NSLock()
    private var databases = 0

    /// The cluster's superuser (trust authentication on the socket).
    public static let user = "parley"

    /// Where Debian installs the server's programs, newest major version first; nil if it is not installed.
    public static var installed: String? {
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).compactMap(Int.init).sorted(by: >)
        return versions.map { "\(root)/\($0)/bin" }.first { FileManager.default.isExecutableFile(atPath: "\($0)/postgres") }
    }

    /// Makes a cluster and starts it; returns once it accepts connections. `settings`: more
    /// `name=value` server settings (`-c`), after the ones every start has.
    public static func start(maxConnections: Int = 200, settings: [String] = []) async throws -> PostgresServer {
        guard let binaries = installed else {
            throw TestFailure("PostgreSQL is not installed: scripts/setup.sh --tests installs postgresql")
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-pg-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let owner = try owner()
        if let owner { chown(directory.path, owner.uid, owner.gid) }
        // Any port number will do: the socket is a file in our own directory, and nothing listens on TCP.
        let port = 5432
        let data = directory.appendingPathComponent("data").path
        let initdb = try await offThePool {
            try run(binaries + "/initdb", as: owner, ["-D", data, "-A", "trust", "-U", user, "-E", "UTF8", "--no-sync", "--no-instructions"])
        }
        guard initdb.status == 0 else {
            try? FileManager.default.removeItem(at: directory)
            throw TestFailure("initdb failed: \(initdb.output.suffix(2000))")
        }
        let server = try PostgresServer(binaries: binaries, directory: directory, port: port, owner: owner,
                                        settings: ["max_connections=\(maxConnections)"] + settings)
        do { try await server.ready() } catch {
            server.stop()
            throw error
        }
        return server
    }

    /// Stops PostgreSQL as an operator's restart does (a fast shutdown: every connection is closed)
    /// and starts it again on the same data; returns once it accepts connections.
    public func restart() async throws {
        stopProcess(process, with: SIGINT, grace: 5)
        let next = try Self.launch(binaries: binaries, directory: directory, port: port, owner: owner, settings: settings, log: log)
        lock.withLock { current = next }
        try await ready()
    }

    private func ready() async throws {
        try await eventually(timeout: .seconds(20), "PostgreSQL accepting connections in \(directory.path)") {
            guard self.process.isRunning else { throw TestFailure("postgres exited: \(self.output.suffix(2000))") }
            return try Self.run(self.binaries + "/pg_isready", as: nil, ["-q", "-h", self.directory.path, "-p", "\(self.port)"]).status == 0
        }
    }

    private init(binaries: String, directory: URL, port: Int, owner: (uid: uid_t, gid: gid_t)?, settings: [String]) throws {
        self.binaries = binaries
        self.directory = directory
        self.port = port
        self.owner = owner
        self.settings = settings
        log = directory.appendingPathComponent("postgres.log")
        guard FileManager.default.createFile(atPath: log.path, contents: nil) else { throw TestFailure("cannot write \(log.path)") }
        if let owner { chown(log.path, owner.uid, owner.gid) }
        current = try Self.launch(binaries: binaries, directory: directory, port: port, owner: owner, settings: settings, log: log)
    }

    private static func launch(binaries: String, directory: URL, port: Int, owner: (uid: uid_t, gid: gid_t)?, settings: [String],
                               log: URL) throws -> Process {
        let process = Process()
        let arguments = [binaries + "/postgres", "-D", directory.appendingPathComponent("data").path, "-k", directory.path,
                         "-p", "\(port)", "-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
                         "-c", "full_page_writes=off"] + settings.flatMap { ["-c", $0] }
        (process.executableURL, process.arguments) = command(arguments, as: owner)
        let output = try FileHandle(forWritingTo: log)
        output.seekToEndOfFile()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        return process
    }

    /// Creates a new, empty database and answers its name (`url(database:)` makes its URL).
    public func createDatabase() throws -> String {
        let name = lock.withLock {
            databases += 1
            return "test\(databases)"
        }
        let created = try Self.run(binaries + "/createdb", as: nil, ["-h", directory.path, "-p", "\(port)", "-U", Self.user, name])
        guard created.status == 0 else { throw TestFailure("createdb failed: \(created.output)") }
        return name
    }

    public func url(database: String) -> String {
        "postgres://\(Self.user)@/\(database)?host=\(directory.path)&port=\(port)"
    }

    /// Runs SQL with `psql` (for what a test must do behind the server's back); answers its output.
    @discardableResult
    public func psql(_ sql: String, database: String) throws -> String {
        let result = try Self.run(binaries + "/psql", as: nil, ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", directory.path,
                                                                 "-p", "\(port)", "-U", Self.user, "-d", database, "-c", sql])
        guard result.status == 0 else { throw TestFailure("psql failed: \(result.output)") }
        return result.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// What PostgreSQL logged (for a failing test's message).
    public var output: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

    /// Stops PostgreSQL (SIGINT: fast shutdown; SIGKILL after 5 s) and removes the cluster.
    public func stop() {
        stopProcess(process, with: SIGINT, grace: 5)
        try? FileManager.default.removeItem(at: directory)
    }

    /// Whether tests of `what` that need a real PostgreSQL can run here. Where they cannot, prints why
    /// and answers false (the tests skip), except under `PARLEY_REQUIRE_ALL_TESTS=1` (set by
    /// `scripts/test.sh`), where they run and fail with the reason.
    public static func testsCanRun(_ what: String) -> Bool {
        if installed != nil { return true }
        if ProcessInfo.processInfo.environment["PARLEY_REQUIRE_ALL_TESTS"] == "1" { return true }
        print("◇ \(what) skipped: PostgreSQL is not installed (scripts/setup.sh --tests installs it)")
        return false
    }

    /// As root, Debian's `postgres` user (PostgreSQL will not run as root); otherwise nobody to change to.
    private static func owner() throws -> (uid: uid_t, gid: gid_t)? {
        guard geteuid() == 0 else { return nil }
        guard let entry = getpwnam("postgres") else {
            throw TestFailure("running as root, and there is no postgres user to run PostgreSQL as (Debian's postgresql package makes it)")
        }
        return (entry.pointee.pw_uid, entry.pointee.pw_gid)
    }

    private static func command(_ arguments: [String], as owner: (uid: uid_t, gid: gid_t)?) -> (URL, [String]) {
        guard let owner else { return (URL(fileURLWithPath: arguments[0]), Array(arguments.dropFirst())) }
        // setpriv execs the program itself: the PID we hold is PostgreSQL's.
        return (URL(fileURLWithPath: "/usr/bin/setpriv"),
                ["--reuid=\(owner.uid)", "--regid=\(owner.gid)", "--init-groups", "--"] + arguments)
    }

    private static func run(_ program: String, as owner: (uid: uid_t, gid: gid_t)?, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        (process.executableURL, process.arguments) = command([program] + arguments, as: owner)
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}
