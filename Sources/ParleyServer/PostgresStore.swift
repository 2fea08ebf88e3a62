import Foundation
import Logging
import NIOSSL
import ParleyProtocol
import PostgresNIO
import NIOConcurrencyHelpers
import ServiceLifecycle

/// The store several nodes share: PostgreSQL, through a pool of postgres-nio connections.
///
/// `open` migrates the schema first (versioned, in one transaction under an advisory lock, so
/// nodes that start together migrate once) and refuses a schema newer than it knows. Rows mean
/// what `SQLiteStore`'s rows mean; the tests run one suite against both.
///
/// The pool is a service: queries wait until `run()` runs it (the server runs it first in its
/// `ServiceGroup`, so it stops last), and fail once it has ended, at a graceful shutdown or `close()`.
public final class PostgresStore: SignalingStore, Service {
    let client: PostgresClient
    private let logger: Logger
    public let location: PostgresLocation
    /// Whether `run()` has begun; `close()` waits for it to end only then.
    private let started = NIOLockedValueBox(false)
    /// Finished by `close()`: ends `run()`.
    private let closing = AsyncStream<Never>.makeStream()
    /// Reached as `run()` starts the pool; `running()` waits for it.
    private let poolRuns = Milestone()
    /// Reached when `run()` has ended: the pool's connections are closed.
    private let ended = Milestone()

    /// Connects, migrates, and answers the store; throws `StoreError` when the server cannot be
    /// reached within `timeout`, refuses the login, or holds a schema from a newer Parley.
    public static func open(_ location: PostgresLocation, logger: Logger, connections: Int = 8,
                            timeout: Duration = .seconds(15)) async throws(StoreError) -> PostgresStore {
        do {
            // One connection alone first: the pool retries quietly, and whoever starts a server wants
            // the reason (no such socket, refused, wrong password) at once.
            try await withDeadline(timeout, "no answer") { try await connect(location, logger: logger).close() }
        } catch {
            throw StoreError("could not open \(location): \(Self.explain(error))")
        }
        do {
            // On a connection of its own: the pool answers nothing until the store runs.
            try await withDeadline(timeout, "no answer") {
                let connection = try await connect(location, logger: logger)
                do {
                    try await migrate(on: connection, logger: logger)
                } catch {
                    try? await connection.close()
                    throw error
                }
                try await connection.close()
            }
        } catch {
            throw StoreError("could not open \(location): \(Self.explain(error))")
        }
        return PostgresStore(location: location, logger: logger, connections: connections)
    }

    /// One connection of its own (a cluster's listener names itself with `application`).
    static func connect(_ location: PostgresLocation, logger: Logger, application: String? = nil) async throws -> PostgresConnection {
        var configuration: PostgresConnection.Configuration
        switch location.endpoint {
        case .tcp(let host, let port):
            let tls: PostgresConnection.Configuration.TLS = switch location.tls {
            case .disable: .disable
            case .prefer: .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
            case .require: .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
            }
            configuration = .init(host: host, port: port, username: location.user, password: location.password,
                                  database: location.database, tls: tls)
        case .socket(let path):
            configuration = .init(unixSocketPath: path, username: location.user, password: location.password,
                                  database: location.database)
        }
        if let application {
            // A node whose machine or network dies is noticed in seconds, not at TCP's two hours.
            configuration.options.additionalStartupParameters = [
                ("application_name", application), ("tcp_keepalives_idle", "5"), ("tcp_keepalives_interval", "2"),
                ("tcp_keepalives_count", "3"),
            ]
        }
        return try await PostgresConnection.connect(configuration: configuration, id: 0, logger: logger)
    }

    private init(location: PostgresLocation, logger: Logger, connections: Int) {
        var configuration: PostgresClient.Configuration
        switch location.endpoint {
        case .tcp(let host, let port):
            let tls: PostgresClient.Configuration.TLS = switch location.tls {
            case .disable: .disable
            case .prefer: .prefer(.makeClientConfiguration())
            case .require: .require(.makeClientConfiguration())
            }
            configuration = .init(host: host, port: port, username: location.user, password: location.password,
                                  database: location.database, tls: tls)
        case .socket(let path):
            configuration = .init(unixSocketPath: path, username: location.user, password: location.password,
                                  database: location.database)
        }
        configuration.options.maximumConnections = connections
        configuration.options.connectTimeout = .seconds(5)
        client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        self.location = location
        self.logger = logger
    }

    /// Runs the pool until a graceful shutdown, cancellation, or `close()`. Once only.
    public func run() async {
        let again = started.withLockedValue { started in
            defer { started = true }
            return started
        }
        precondition(!again, "a PostgresStore runs once")
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                self.poolRuns.reach()
                // postgres-nio's own run ends at a graceful shutdown.
                await self.client.run()
            }
            group.addTask { for await _ in self.closing.stream {} }
            await group.next()
            group.cancelAll()
        }
        ended.reach()
    }

    /// Returns as `run()` starts the pool (it waits until the store runs). A query sent before
    /// waits all the same, but postgres-nio warns of it in the log, so what starts with the store
    /// waits here first. postgres-nio does not say when its pool runs: this is reached just
    /// before, and a query sent in that instant would still draw the warning.
    public func running() async throws {
        try await poolRuns.wait()
    }

    /// Ends `run()` and waits until it has; queries after it fail.
    public func close() async {
        closing.continuation.finish()
        if started.withLockedValue({ $0 }) { try? await ended.wait() }
    }

    // MARK: Schema

    private struct Migration {
        var version: Int
        var description: String
        var statements: [String]
    }

    /// Applied in order, each once; a released version's statements never change.
    private static let migrations = [
        Migration(version: 1, description: "devices, and calls with what a restart needs", statements: [
            """
            CREATE TABLE device (
              user_id TEXT NOT NULL, device_id TEXT NOT NULL, platform TEXT NOT NULL,
              voip_token TEXT, voip_topic TEXT, voip_environment TEXT,
              alert_token TEXT, alert_topic TEXT, alert_environment TEXT,
              updated_at BIGINT NOT NULL,
              PRIMARY KEY (user_id, device_id))
            """,
            "CREATE INDEX device_voip_token ON device (voip_token) WHERE voip_token IS NOT NULL",
            "CREATE INDEX device_alert_token ON device (alert_token) WHERE alert_token IS NOT NULL",
            """
            CREATE TABLE call (
              call_id TEXT PRIMARY KEY,
              seq BIGINT GENERATED ALWAYS AS IDENTITY,
              caller TEXT NOT NULL, callee TEXT NOT NULL, caller_device TEXT NOT NULL, callee_device TEXT,
              audio BOOLEAN NOT NULL, video BOOLEAN NOT NULL,
              created_at BIGINT NOT NULL, answered_at BIGINT, ended_at BIGINT, reason TEXT, duration DOUBLE PRECISION,
              quality JSONB, recordings JSONB,
              expires_at BIGINT NOT NULL, caller_name TEXT, metadata JSONB)
            """,
            "CREATE INDEX call_caller ON call (caller, created_at DESC)",
            "CREATE INDEX call_callee ON call (callee, created_at DESC)",
            "CREATE INDEX call_unfinished ON call (created_at) WHERE ended_at IS NULL",
        ]),
        Migration(version: 2, description: "several nodes: who holds which device, who runs which call", statements: [
            "ALTER TABLE call ADD COLUMN owner_node TEXT",
            "CREATE INDEX call_owner ON call (owner_node) WHERE ended_at IS NULL",
            """
            CREATE TABLE cluster_device (
              user_id TEXT NOT NULL, device_id TEXT NOT NULL, node_id TEXT NOT NULL,
              PRIMARY KEY (user_id, device_id))
            """,
            "CREATE INDEX cluster_device_node ON cluster_device (node_id)",
            """
            CREATE TABLE cluster_message (
              id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload TEXT NOT NULL,
              created_at TIMESTAMPTZ NOT NULL DEFAULT now())
            """,
        ]),
        Migration(version: 3, description: "several nodes: who runs which room", statements: [
            "CREATE TABLE cluster_room (room_id TEXT PRIMARY KEY, node_id TEXT NOT NULL)",
        ]),
        Migration(version: 4, description: "secrets of the deployment", statements: [
            "CREATE TABLE deployment_secret (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        ]),
        Migration(version: 5, description: "several nodes: where each takes direct links", statements: [
            "CREATE TABLE cluster_node (node_id TEXT PRIMARY KEY, address TEXT NOT NULL)",
        ]),
        Migration(version: 6, description: "several nodes: which lines each reads on its links", statements: [
            "ALTER TABLE cluster_node ADD COLUMN lines SMALLINT NOT NULL DEFAULT 1",
        ]),
    ]

    /// The schema version this build migrates to.
    public static var schemaVersion: Int { migrations.last?.version ?? 0 }

    /// Any constant shared by every node: the lock that makes them migrate one at a time.
    private static let migrationLock: Int64 = 0x7061_726C_6579   // "parley"

    private static func migrate(on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.withTransaction(logger: logger) { connection in
            try await connection.query("SELECT pg_advisory_xact_lock(\(Self.migrationLock))", logger: logger)
            try await connection.query("""
                CREATE TABLE IF NOT EXISTS parley_migration (
                  version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())
                """, logger: logger)
            var applied: Set<Int> = []
            for try await version in try await connection.query("SELECT version FROM parley_migration", logger: logger).decode(Int.self) {
                applied.insert(version)
            }
            let known = Self.schemaVersion
            if let newest = applied.max(), newest > known {
                throw StoreError("the database's schema is version \(newest), from a newer Parley; this one knows up to \(known)")
            }
            for migration in Self.migrations where !applied.contains(migration.version) {
                for statement in migration.statements {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query("""
                    INSERT INTO parley_migration (version, description) VALUES (\(migration.version), \(migration.description))
                    """, logger: logger)
                logger.notice("migrated the database", metadata: ["db.version": "\(migration.version)",
                                                                  "db.migration": "\(migration.description)"])
            }
        }
    }

    // MARK: Devices

    public func upsertDevice(_ device: DeviceRecord) async throws {
        let logger = self.logger
        let user = device.user.rawValue, id = device.device.rawValue
        try await client.withTransaction(logger: logger) { connection in
            // A token belongs to one installation: whoever had it before (another user signed in on the
            // same phone) must not be woken by it any more.
            if let token = device.voip?.token {
                try await connection.query("""
                    UPDATE device SET voip_token = NULL, voip_topic = NULL, voip_environment = NULL
                    WHERE voip_token = \(token) AND NOT (user_id = \(user) AND device_id = \(id))
                    """, logger: logger)
            }
            if let token = device.alerts?.token {
                try await connection.query("""
                    UPDATE device SET alert_token = NULL, alert_topic = NULL, alert_environment = NULL
                    WHERE alert_token = \(token) AND NOT (user_id = \(user) AND device_id = \(id))
                    """, logger: logger)
            }
            try await connection.query("""
                INSERT INTO device (user_id, device_id, platform, voip_token, voip_topic, voip_environment,
                                    alert_token, alert_topic, alert_environment, updated_at)
                VALUES (\(user), \(id), \(device.platform.rawValue), \(device.voip?.token), \(device.voip?.topic),
                        \(device.voip?.environment.rawValue), \(device.alerts?.token), \(device.alerts?.topic),
                        \(device.alerts?.environment.rawValue), \(device.updatedAt))
                ON CONFLICT (user_id, device_id) DO UPDATE SET platform = excluded.platform, voip_token = excluded.voip_token,
                  voip_topic = excluded.voip_topic, voip_environment = excluded.voip_environment,
                  alert_token = excluded.alert_token, alert_topic = excluded.alert_topic,
                  alert_environment = excluded.alert_environment, updated_at = excluded.updated_at
                """, logger: logger)
        }
    }

    public func deleteDevice(user: UserID, device: DeviceID) async throws -> Bool {
        let rows = try await client.query("""
            DELETE FROM device WHERE user_id = \(user.rawValue) AND device_id = \(device.rawValue) RETURNING device_id
            """, logger: logger)
        return try await rows.collect().count > 0
    }

    /// A user's devices (every invite asks, for pushes).
    enum UserDevices: PreparedSQL {
        static let sql = """
            SELECT user_id, device_id, platform, voip_token, voip_topic, voip_environment,
                   alert_token, alert_topic, alert_environment, updated_at
            FROM device WHERE user_id = $1 ORDER BY device_id
            """
    }

    public func devices(of user: UserID) async throws -> [DeviceRecord] {
        var devices: [DeviceRecord] = []
        for try await encoded in try await client.execute(Prepared<UserDevices>([user.rawValue]), logger: logger) {
            if let device = Self.deviceRecord(try encoded.decode(DeviceRow.self)) { devices.append(device) }
        }
        return devices
    }

    /// A `device` row's columns as `UserDevices` reads them: the user, the device, its platform, its
    /// VoIP token, topic and environment, its alert token, topic and environment, when it was updated.
    typealias DeviceRow = (String, String, String, String?, String?, String?, String?, String?, String?, Int64)

    static func deviceRecord(_ row: DeviceRow) -> DeviceRecord? {
        func registration(_ token: String?, _ topic: String?, _ environment: String?) -> VoIPRegistration? {
            guard let token, let topic, let environment = environment.flatMap(VoIPRegistration.Environment.init(rawValue:)) else {
                return nil
            }
            return VoIPRegistration(token: token, topic: topic, environment: environment)
        }
        guard let user = UserID(rawValue: row.0), let device = DeviceID(rawValue: row.1) else { return nil }
        return DeviceRecord(user: user, device: device, platform: Platform(rawValue: row.2),
                            voip: registration(row.3, row.4, row.5), alerts: registration(row.6, row.7, row.8), updatedAt: row.9)
    }

    public func removePushToken(_ kind: PushTokenKind, user: UserID, device: DeviceID, token: String,
                                registeredBefore: Int64?) async throws -> Bool {
        let column = kind == .voip ? "voip" : "alert"
        let rows = try await client.query("""
            UPDATE device SET \(unescaped: column)_token = NULL, \(unescaped: column)_topic = NULL, \(unescaped: column)_environment = NULL
            WHERE user_id = \(user.rawValue) AND device_id = \(device.rawValue) AND \(unescaped: column)_token = \(token)
              AND (\(registeredBefore)::BIGINT IS NULL OR updated_at <= \(registeredBefore))
            RETURNING device_id
            """, logger: logger)
        return try await rows.collect().count > 0
    }

    // MARK: Calls

    /// A batch of calls in one statement: the rows travel as one JSON array, so a batch costs one
    /// parse, plan and execution however many calls it has (the writer sends each call once a
    /// batch, as `ON CONFLICT` needs). The rows go in in the array's order, which is the order the
    /// calls started in.
    enum SaveCalls: PreparedSQL {
        static let sql = """
            INSERT INTO call (call_id, caller, callee, caller_device, callee_device, audio, video, created_at,
              answered_at, ended_at, reason, duration, quality, recordings, expires_at, caller_name, metadata, owner_node)
            SELECT call_id, caller, callee, caller_device, callee_device, audio, video, created_at,
              answered_at, ended_at, reason, duration, quality, recordings, expires_at, caller_name, metadata, owner_node
            FROM jsonb_to_recordset($1::JSONB) AS row (call_id TEXT, caller TEXT, callee TEXT, caller_device TEXT,
              callee_device TEXT, audio BOOLEAN, video BOOLEAN, created_at BIGINT, answered_at BIGINT, ended_at BIGINT,
              reason TEXT, duration DOUBLE PRECISION, quality JSONB, recordings JSONB, expires_at BIGINT, caller_name TEXT,
              metadata JSONB, owner_node TEXT)
            ON CONFLICT (call_id) DO UPDATE SET callee_device = excluded.callee_device, answered_at = excluded.answered_at,
              ended_at = COALESCE(call.ended_at, excluded.ended_at), reason = COALESCE(call.reason, excluded.reason),
              duration = excluded.duration, quality = excluded.quality, recordings = excluded.recordings
            -- A node writes only calls it runs (a late write of a node the call moved from is dropped),
            -- and an ended call stays ended.
            WHERE call.owner_node IS NOT DISTINCT FROM excluded.owner_node OR call.ended_at IS NOT NULL
            """
    }

    /// A call's row as `SaveCalls` reads it.
    private struct WrittenCall: Encodable {
        var call_id: String, caller: String, callee: String, caller_device: String, callee_device: String?
        var audio: Bool, video: Bool
        var created_at: Int64, answered_at: Int64?, ended_at: Int64?, reason: String?, duration: Double?
        var quality: CallQuality?, recordings: [RecordingRecord]?
        var expires_at: Int64, caller_name: String?, metadata: JSONValue?, owner_node: String?

        init(_ stored: StoredCall) {
            let record = stored.record
            (call_id, caller, callee) = (record.call.rawValue, record.caller.rawValue, record.callee.rawValue)
            (caller_device, callee_device) = (record.callerDevice.rawValue, record.calleeDevice?.rawValue)
            (audio, video) = (record.media.audio, record.media.video)
            (created_at, answered_at, ended_at) = (record.createdAt, record.answeredAt, record.endedAt)
            (reason, duration, quality, recordings) = (record.reason?.rawValue, record.duration, record.quality, record.recordings)
            (expires_at, caller_name, metadata, owner_node) = (stored.expiresAt, stored.callerName, stored.metadata, stored.owner)
        }
    }

    public func saveCalls(_ calls: [StoredCall]) async throws {
        // Each call once (one statement may not update a row twice): its last state, in the place of its first.
        var last: [CallID: Int] = [:]
        for (index, call) in calls.enumerated() { last[call.record.call] = index }
        let rows = calls.indices.compactMap { index -> WrittenCall? in
            let id = calls[index].record.call
            guard let latest = last.removeValue(forKey: id) else { return nil }
            return WrittenCall(calls[latest])
        }
        guard !rows.isEmpty else { return }
        let batch = String(decoding: try JSONEncoder().encode(rows), as: UTF8.self)
        for try await _ in try await client.execute(Prepared<SaveCalls>([batch]), logger: logger) {}
    }

    static let callColumns = """
        call_id, caller, callee, caller_device, callee_device, audio, video, created_at, answered_at, ended_at, reason,
        duration, quality::TEXT, recordings::TEXT, expires_at, caller_name, metadata::TEXT
        """

    private typealias CallRow = (String, String, String, String, String?, Bool, Bool, Int64, Int64?, Int64?, String?,
                                 Double?, String?, String?, Int64, String?, String?)

    /// A call by its id (every invite asks whether its id is taken).
    enum CallByID: PreparedSQL {
        static let sql = "SELECT \(callColumns) FROM call WHERE call_id = $1"
    }

    public func call(_ id: CallID) async throws -> CallRecord? {
        try await storedCalls(try await client.execute(Prepared<CallByID>([id.rawValue]), logger: logger)).first?.record
    }

    public func calls(of user: UserID, limit: Int) async throws -> [CallRecord] {
        try await storedCalls("""
            SELECT \(unescaped: Self.callColumns) FROM call WHERE caller = \(user.rawValue) OR callee = \(user.rawValue)
            ORDER BY created_at DESC, seq DESC LIMIT \(limit)
            """).map(\.record)
    }

    public func deploymentSecret(_ name: String) async throws -> [UInt8] {
        // The first node to ask makes it; every other gets that one.
        let rows = try await client.query("""
            WITH made AS (
              INSERT INTO deployment_secret (name, value) VALUES (\(name), \(DeploymentSecret.make()))
              ON CONFLICT (name) DO NOTHING RETURNING value)
            SELECT value FROM made UNION ALL SELECT value FROM deployment_secret WHERE name = \(name)
            """, logger: logger)
        var kept: String?
        for try await value in rows.decode(String.self) where kept == nil { kept = value }
        if kept == nil {
            // Another node's insert won the race after this statement's snapshot: a new one sees it.
            let again = try await client.query("SELECT value FROM deployment_secret WHERE name = \(name)", logger: logger)
            for try await value in again.decode(String.self) where kept == nil { kept = value }
        }
        return try DeploymentSecret.read(kept, name: name)
    }

    public func unfinishedCalls() async throws -> [StoredCall] {
        try await storedCalls("SELECT \(unescaped: Self.callColumns) FROM call WHERE ended_at IS NULL ORDER BY created_at, seq")
    }

    func storedCalls(_ query: PostgresQuery) async throws -> [StoredCall] {
        try await storedCalls(try await client.query(query, logger: logger))
    }

    /// The calls in rows of `callColumns`.
    private func storedCalls<Rows: AsyncSequence>(_ rows: Rows) async throws -> [StoredCall] where Rows.Element == PostgresRow {
        let decoder = JSONDecoder()
        func decoded<T: Decodable>(_ type: T.Type, _ text: String?) -> T? {
            text.flatMap { try? decoder.decode(type, from: Data($0.utf8)) }
        }
        var calls: [StoredCall] = []
        for try await encoded in rows {
            let row = try encoded.decode(CallRow.self)
            guard let call = CallID(rawValue: row.0), let caller = UserID(rawValue: row.1), let callee = UserID(rawValue: row.2),
                  let callerDevice = DeviceID(rawValue: row.3) else { continue }
            let record = CallRecord(call: call, caller: caller, callee: callee, callerDevice: callerDevice,
                                    calleeDevice: row.4.flatMap(DeviceID.init(rawValue:)), media: MediaSpec(audio: row.5, video: row.6),
                                    createdAt: row.7, answeredAt: row.8, endedAt: row.9, reason: row.10.map(EndReason.init(rawValue:)),
                                    duration: row.11, quality: decoded(CallQuality.self, row.12),
                                    recordings: decoded([RecordingRecord].self, row.13))
            calls.append(StoredCall(record: record, expiresAt: row.14, callerName: row.15, metadata: decoded(JSONValue.self, row.16)))
        }
        return calls
    }

    // MARK: Errors

    /// What went wrong, readably: postgres-nio's errors describe themselves in a fixed sentence (so
    /// that a log never shows a query's values); the server's SQLSTATE and message say it all here.
    static func explain(_ error: any Error) -> String {
        if let error = error as? PostgresTransactionError {
            return [error.beginError, error.closureError, error.rollbackError, error.commitError]
                .compactMap { $0 }.first.map(explain) ?? "a transaction failed"
        }
        guard let error = error as? PSQLError else { return "\(error)" }
        if let info = error.serverInfo, let message = info[.message] {
            return "\(message) (SQLSTATE \(info[.sqlState] ?? "?"))"
        }
        if let underlying = error.underlying { return "\(underlying)" }
        return "\(error.code)"
    }
}

/// A store that could not be opened or used, in words for the person running the server.
public struct StoreError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// Runs `work`, throwing `StoreError(message)` if it has not finished within `limit`.
func withDeadline<T: Sendable>(_ limit: Duration, _ message: String,
                               _ work: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await work() }
        group.addTask {
            try await Task.sleep(for: limit)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            throw StoreError("\(message) within \(limit)")
        }
        return value
    }
}
