import Foundation
import GRDB
import ParleyProtocol

/// A call as the store keeps it: its record, and while it has not ended, what the hub needs to go
/// on with it after a restart.
public struct StoredCall: Hashable, Sendable {
    public var record: CallRecord
    /// When the invite stops ringing (Unix milliseconds).
    public var expiresAt: Int64
    /// The caller's display name, for `call.incoming` to devices that connect later.
    public var callerName: String?
    public var metadata: JSONValue?
    /// The node that runs the call, with several nodes (set when the call is first stored).
    public var owner: NodeID?

    public init(record: CallRecord, expiresAt: Int64, callerName: String? = nil, metadata: JSONValue? = nil, owner: NodeID? = nil) {
        self.record = record
        self.expiresAt = expiresAt
        self.callerName = callerName
        self.metadata = metadata
        self.owner = owner
    }
}

extension StoredCall {
    /// The JSON columns of a call's row: quality, metadata, recordings (nil where absent).
    static func jsonColumns(of calls: [StoredCall]) throws -> [(call: StoredCall, quality: String?, metadata: String?, recordings: String?)] {
        let encoder = JSONEncoder()
        func json(_ value: (some Encodable)?) throws -> String? {
            try value.map { String(decoding: try encoder.encode($0), as: UTF8.self) }
        }
        return try calls.map { ($0, try json($0.record.quality), try json($0.metadata), try json($0.record.recordings)) }
    }

    /// The same call, run by `node`.
    public func owned(by node: NodeID?) -> StoredCall {
        var owned = self
        owned.owner = node
        return owned
    }
}

/// Which of a device's push tokens.
public enum PushTokenKind: Sendable, Equatable {
    case voip, alert
}

/// Where the server keeps what must outlive a process: devices, call records, and the calls that
/// have not ended (restored after a restart, so a restart ends no call).
///
/// SQLite (`SQLiteStore`) is the embedded default; PostgreSQL (`PostgresStore`) is shared by
/// several nodes of one deployment. The hub hands a call's changes to a `CallRecordWriter`, which
/// writes them in batches off its path; on PostgreSQL a new call goes in first with its
/// invite's reads (`ClusterDirectory.claim`).
public protocol SignalingStore: Sendable {
    func upsertDevice(_ device: DeviceRecord) async throws
    /// Removes a device; answers whether it existed.
    func deleteDevice(user: UserID, device: DeviceID) async throws -> Bool
    func devices(of user: UserID) async throws -> [DeviceRecord]
    /// Drops a device's push token that APNs rejected (its VoIP or its alert token): only if the
    /// device still has that token and did not register after `registeredBefore` (APNs' time of a
    /// 410, Unix milliseconds; nil for `BadDeviceToken`). Answers whether the token was dropped.
    func removePushToken(_ kind: PushTokenKind, user: UserID, device: DeviceID, token: String, registeredBefore: Int64?) async throws -> Bool

    /// Inserts calls, or updates what can change of them (answer, end, quality), in one transaction.
    func saveCalls(_ calls: [StoredCall]) async throws
    func call(_ id: CallID) async throws -> CallRecord?
    /// The user's calls as caller or callee, newest first.
    func calls(of user: UserID, limit: Int) async throws -> [CallRecord]
    /// Every call that has not ended (ringing or active), oldest first.
    func unfinishedCalls() async throws -> [StoredCall]
    /// A random 32-byte secret, made the first time it is asked for under `name` and kept from then
    /// on: for what every node of a deployment, and every run after a restart or a crash, must
    /// derive alike with nothing to configure (the AudioBridge rooms' numbers and secrets).
    func deploymentSecret(_ name: String) async throws -> [UInt8]
    /// Lets go of connections and files; nothing may be asked after it.
    func close() async
}

extension SignalingStore {
    public func close() async {}
}

/// The embedded store: one SQLite file (or memory, for tests), migrated on open.
///
/// A file is opened as a WAL pool, so reads (the hub's look-ups of old calls and push devices) never
/// wait for the writer's transactions.
public final class SQLiteStore: SignalingStore {
    private let database: any DatabaseWriter

    /// Opens (creating it if needed) the database at `path`; `nil` keeps it in memory.
    public init(path: String?) throws {
        var configuration = Configuration()
        configuration.busyMode = .timeout(5)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        if let path {
            database = try DatabasePool(path: path, configuration: configuration)
        } else {
            database = try DatabaseQueue(configuration: configuration)
        }
        try Self.migrator.migrate(database)
    }

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.create(table: "device") { t in
                t.column("user", .text).notNull()
                t.column("device", .text).notNull()
                t.column("platform", .text).notNull()
                t.column("voipToken", .text)
                t.column("voipTopic", .text)
                t.column("voipEnvironment", .text)
                t.column("updatedAt", .integer).notNull()
                t.primaryKey(["user", "device"])
            }
            try db.create(table: "call") { t in
                t.primaryKey("call", .text)
                t.column("caller", .text).notNull().indexed()
                t.column("callee", .text).notNull().indexed()
                t.column("callerDevice", .text).notNull()
                t.column("calleeDevice", .text)
                t.column("audio", .boolean).notNull()
                t.column("video", .boolean).notNull()
                t.column("createdAt", .integer).notNull().indexed()
                t.column("answeredAt", .integer)
                t.column("endedAt", .integer)
                t.column("reason", .text)
                t.column("duration", .double)
                t.column("quality", .text)
            }
        }
        migrator.registerMigration("v2: unfinished calls outlive a restart") { db in
            try db.alter(table: "call") { t in
                t.add(column: "expiresAt", .integer)
                t.add(column: "callerName", .text)
                t.add(column: "metadata", .text)
            }
            try db.execute(sql: "CREATE INDEX call_unfinished ON call(createdAt) WHERE endedAt IS NULL")
        }
        migrator.registerMigration("v3: alert tokens beside VoIP tokens") { db in
            try db.alter(table: "device") { t in
                t.add(column: "alertToken", .text)
                t.add(column: "alertTopic", .text)
                t.add(column: "alertEnvironment", .text)
            }
        }
        migrator.registerMigration("v4: recordings with consent") { db in
            try db.alter(table: "call") { t in t.add(column: "recordings", .text) }
        }
        migrator.registerMigration("v5: secrets of the deployment") { db in
            try db.create(table: "deploymentSecret") { t in
                t.primaryKey("name", .text)
                t.column("value", .text).notNull()
            }
        }
        return migrator
    }

    public func upsertDevice(_ device: DeviceRecord) async throws {
        try await database.write { db in
            // A token belongs to one installation: whoever had it before (another user signed in on the
            // same phone) must not be woken by it any more.
            if let token = device.voip?.token {
                try db.execute(sql: """
                    UPDATE device SET voipToken = NULL, voipTopic = NULL, voipEnvironment = NULL
                    WHERE voipToken = ? AND NOT (user = ? AND device = ?)
                    """, arguments: [token, device.user.rawValue, device.device.rawValue])
            }
            if let token = device.alerts?.token {
                try db.execute(sql: """
                    UPDATE device SET alertToken = NULL, alertTopic = NULL, alertEnvironment = NULL
                    WHERE alertToken = ? AND NOT (user = ? AND device = ?)
                    """, arguments: [token, device.user.rawValue, device.device.rawValue])
            }
            try db.execute(sql: """
                INSERT INTO device (user, device, platform, voipToken, voipTopic, voipEnvironment,
                                    alertToken, alertTopic, alertEnvironment, updatedAt)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(user, device) DO UPDATE SET platform = excluded.platform, voipToken = excluded.voipToken,
                  voipTopic = excluded.voipTopic, voipEnvironment = excluded.voipEnvironment, alertToken = excluded.alertToken,
                  alertTopic = excluded.alertTopic, alertEnvironment = excluded.alertEnvironment, updatedAt = excluded.updatedAt
                """, arguments: [device.user.rawValue, device.device.rawValue, device.platform.rawValue,
                                 device.voip?.token, device.voip?.topic, device.voip?.environment.rawValue,
                                 device.alerts?.token, device.alerts?.topic, device.alerts?.environment.rawValue, device.updatedAt])
        }
    }

    public func deleteDevice(user: UserID, device: DeviceID) async throws -> Bool {
        try await database.write { db in
            try db.execute(sql: "DELETE FROM device WHERE user = ? AND device = ?", arguments: [user.rawValue, device.rawValue])
            return db.changesCount > 0
        }
    }

    public func devices(of user: UserID) async throws -> [DeviceRecord] {
        // Read for every invite: prepared once (preparing costs more than the query), and outside a
        // transaction (`unsafeRead`: one statement reads consistently on its own, and GRDB's read
        // compiles four more to open and close one, which cost more than this whole read).
        try await database.unsafeRead { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT * FROM device WHERE user = ? ORDER BY device"), arguments: [user.rawValue])
                .compactMap(Self.deviceRecord)
        }
    }

    public func removePushToken(_ kind: PushTokenKind, user: UserID, device: DeviceID, token: String, registeredBefore: Int64?) async throws -> Bool {
        let column = kind == .voip ? "voip" : "alert"
        return try await database.write { db in
            try db.execute(sql: """
                UPDATE device SET \(column)Token = NULL, \(column)Topic = NULL, \(column)Environment = NULL
                WHERE user = ? AND device = ? AND \(column)Token = ? AND (? IS NULL OR updatedAt <= ?)
                """, arguments: [user.rawValue, device.rawValue, token, registeredBefore, registeredBefore])
            return db.changesCount > 0
        }
    }

    public func saveCalls(_ calls: [StoredCall]) async throws {
        let rows = try StoredCall.jsonColumns(of: calls)
        try await database.write { db in
            // Cached: this runs several times per call, and compiling the statement cost more than running it.
            let statement = try db.cachedStatement(sql: """
                INSERT INTO call (call, caller, callee, callerDevice, calleeDevice, audio, video, createdAt,
                  answeredAt, endedAt, reason, duration, quality, expiresAt, callerName, metadata, recordings)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(call) DO UPDATE SET calleeDevice = excluded.calleeDevice, answeredAt = excluded.answeredAt,
                  endedAt = excluded.endedAt, reason = excluded.reason, duration = excluded.duration, quality = excluded.quality,
                  recordings = excluded.recordings
                """)
            for (stored, quality, metadata, recordings) in rows {
                let record = stored.record
                try statement.execute(arguments: [record.call.rawValue, record.caller.rawValue, record.callee.rawValue,
                                                  record.callerDevice.rawValue, record.calleeDevice?.rawValue, record.media.audio,
                                                  record.media.video, record.createdAt, record.answeredAt, record.endedAt,
                                                  record.reason?.rawValue, record.duration, quality, stored.expiresAt,
                                                  stored.callerName, metadata, recordings])
            }
        }
    }

    public func call(_ id: CallID) async throws -> CallRecord? {
        // Read for every invite on a node of its own: one statement, outside a transaction, as `devices(of:)`.
        try await database.unsafeRead { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM call WHERE call = ?"), arguments: [id.rawValue]).flatMap(Self.callRecord)
        }
    }

    public func calls(of user: UserID, limit: Int) async throws -> [CallRecord] {
        try await database.read { db in
            try Row.fetchAll(db, sql: """
                SELECT * FROM call WHERE caller = ? OR callee = ? ORDER BY createdAt DESC, rowid DESC LIMIT ?
                """, arguments: [user.rawValue, user.rawValue, limit]).compactMap(Self.callRecord)
        }
    }

    public func deploymentSecret(_ name: String) async throws -> [UInt8] {
        let made = DeploymentSecret.make()
        let kept = try await database.write { db in
            try db.execute(sql: "INSERT OR IGNORE INTO deploymentSecret (name, value) VALUES (?, ?)", arguments: [name, made])
            return try String.fetchOne(db, sql: "SELECT value FROM deploymentSecret WHERE name = ?", arguments: [name])
        }
        return try DeploymentSecret.read(kept, name: name)
    }

    public func unfinishedCalls() async throws -> [StoredCall] {
        try await database.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM call WHERE endedAt IS NULL ORDER BY createdAt, rowid").compactMap { row in
                guard let record = Self.callRecord(row) else { return nil }
                let metadata = (row["metadata"] as String?).flatMap { try? JSONDecoder().decode(JSONValue.self, from: Data($0.utf8)) }
                // Rows written before v2 have no expiry: they ring no longer.
                return StoredCall(record: record, expiresAt: row["expiresAt"] ?? record.createdAt,
                                  callerName: row["callerName"], metadata: metadata)
            }
        }
    }

    private static func deviceRecord(_ row: Row) -> DeviceRecord? {
        guard let user = UserID(rawValue: row["user"]), let device = DeviceID(rawValue: row["device"]) else { return nil }
        func registration(_ column: String) -> VoIPRegistration? {
            guard let token: String = row["\(column)Token"], let topic: String = row["\(column)Topic"],
                  let environment = VoIPRegistration.Environment(rawValue: row["\(column)Environment"] ?? "") else { return nil }
            return VoIPRegistration(token: token, topic: topic, environment: environment)
        }
        return DeviceRecord(user: user, device: device, platform: Platform(rawValue: row["platform"]), voip: registration("voip"),
                            alerts: registration("alert"), updatedAt: row["updatedAt"])
    }

    private static func callRecord(_ row: Row) -> CallRecord? {
        guard let call = CallID(rawValue: row["call"]), let caller = UserID(rawValue: row["caller"]),
              let callee = UserID(rawValue: row["callee"]), let callerDevice = DeviceID(rawValue: row["callerDevice"])
        else { return nil }
        let quality = (row["quality"] as String?).flatMap { try? JSONDecoder().decode(CallQuality.self, from: Data($0.utf8)) }
        let recordings = (row["recordings"] as String?).flatMap { try? JSONDecoder().decode([RecordingRecord].self, from: Data($0.utf8)) }
        return CallRecord(call: call, caller: caller, callee: callee, callerDevice: callerDevice,
                          calleeDevice: (row["calleeDevice"] as String?).flatMap(DeviceID.init(rawValue:)),
                          media: MediaSpec(audio: row["audio"], video: row["video"]), createdAt: row["createdAt"],
                          answeredAt: row["answeredAt"], endedAt: row["endedAt"],
                          reason: (row["reason"] as String?).map(EndReason.init(rawValue:)), duration: row["duration"],
                          quality: quality, recordings: recordings)
    }
}

/// How both stores make and read a deployment secret: 32 random bytes, kept as hex text.
enum DeploymentSecret {
    struct Unreadable: Error, CustomStringConvertible {
        var name: String
        var description: String { "the store's deployment secret \"\(name)\" is missing or not 64 hex digits" }
    }

    static func make() -> String {
        var generator = SystemRandomNumberGenerator()
        return hex((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    static func read(_ text: String?, name: String) throws -> [UInt8] {
        guard let text, let bytes = bytes(hex: text) else { throw Unreadable(name: name) }
        return bytes
    }

    /// 32 bytes as 64 lower-case hex digits (a secret, a node link's HMAC).
    static func hex(_ bytes: some Sequence<UInt8>) -> String {
        bytes.map { String(format: "%02x", $0) }.joined()
    }

    /// The 32 bytes of 64 lower-case hex digits; nil for anything else.
    static func bytes(hex text: String) -> [UInt8]? {
        func digit(_ char: UInt8) -> UInt8? {
            switch char {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): char - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): char - UInt8(ascii: "a") + 10
            default: nil
            }
        }
        let chars = Array(text.utf8)
        guard chars.count == 64 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for index in stride(from: 0, to: 64, by: 2) {
            guard let high = digit(chars[index]), let low = digit(chars[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }
}
