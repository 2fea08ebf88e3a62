import Foundation
import GRDB
import ParleyProtocol

/// Where the server keeps what must outlive a process: devices and call records.
///
/// SQLite (`SQLiteStore`) is the embedded default; a shared store such as PostgreSQL lets several
/// nodes serve one deployment. Calls are synchronous: the SQLite implementation writes in WAL
/// mode in tens of microseconds, which keeps call records ordered with the frames that caused them.
public protocol SignalingStore: Sendable {
    func upsertDevice(_ device: DeviceRecord) throws
    /// Removes a device; answers whether it existed.
    func deleteDevice(user: UserID, device: DeviceID) throws -> Bool
    func devices(of user: UserID) throws -> [DeviceRecord]
    /// Drops the VoIP token of a device (APNs said it is no longer valid).
    func removeVoIPToken(user: UserID, device: DeviceID) throws

    /// Inserts a call record, or updates what can change of it (answer, end, quality).
    func saveCall(_ record: CallRecord) throws
    func call(_ id: CallID) throws -> CallRecord?
    /// The user's calls as caller or callee, newest first.
    func calls(of user: UserID, limit: Int) throws -> [CallRecord]
    /// Ends every call left ringing or active (by a crash): they cannot go on without their server.
    func endUnfinishedCalls(reason: EndReason, at endedAt: Int64) throws -> Int
}

/// The embedded store: one SQLite file (or memory, for tests), migrated on open.
public final class SQLiteStore: SignalingStore {
    private let database: DatabaseQueue

    /// Opens (creating it if needed) the database at `path`; `nil` keeps it in memory.
    public init(path: String?) throws {
        var configuration = Configuration()
        configuration.busyMode = .timeout(5)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        if let path {
            database = try DatabaseQueue(path: path, configuration: configuration)
            try database.writeWithoutTransaction { db in
                _ = try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL")
            }
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
        return migrator
    }

    public func upsertDevice(_ device: DeviceRecord) throws {
        try database.write { db in
            try db.execute(sql: """
                INSERT INTO device (user, device, platform, voipToken, voipTopic, voipEnvironment, updatedAt)
                VALUES (?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(user, device) DO UPDATE SET platform = excluded.platform, voipToken = excluded.voipToken,
                  voipTopic = excluded.voipTopic, voipEnvironment = excluded.voipEnvironment, updatedAt = excluded.updatedAt
                """, arguments: [device.user.rawValue, device.device.rawValue, device.platform.rawValue,
                                 device.voip?.token, device.voip?.topic, device.voip?.environment.rawValue, device.updatedAt])
        }
    }

    public func deleteDevice(user: UserID, device: DeviceID) throws -> Bool {
        try database.write { db in
            try db.execute(sql: "DELETE FROM device WHERE user = ? AND device = ?", arguments: [user.rawValue, device.rawValue])
            return db.changesCount > 0
        }
    }

    public func devices(of user: UserID) throws -> [DeviceRecord] {
        try database.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM device WHERE user = ? ORDER BY device", arguments: [user.rawValue])
                .compactMap(Self.deviceRecord)
        }
    }

    public func removeVoIPToken(user: UserID, device: DeviceID) throws {
        try database.write { db in
            try db.execute(sql: "UPDATE device SET voipToken = NULL, voipTopic = NULL, voipEnvironment = NULL WHERE user = ? AND device = ?",
                           arguments: [user.rawValue, device.rawValue])
        }
    }

    public func saveCall(_ record: CallRecord) throws {
        let quality = try record.quality.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self) }
        try database.write { db in
            // Cached: this runs several times per call, and compiling the statement cost more than running it.
            try db.cachedStatement(sql: """
                INSERT INTO call (call, caller, callee, callerDevice, calleeDevice, audio, video, createdAt,
                  answeredAt, endedAt, reason, duration, quality)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(call) DO UPDATE SET calleeDevice = excluded.calleeDevice, answeredAt = excluded.answeredAt,
                  endedAt = excluded.endedAt, reason = excluded.reason, duration = excluded.duration, quality = excluded.quality
                """).execute(arguments: [record.call.rawValue, record.caller.rawValue, record.callee.rawValue,
                                 record.callerDevice.rawValue, record.calleeDevice?.rawValue, record.media.audio,
                                 record.media.video, record.createdAt, record.answeredAt, record.endedAt,
                                 record.reason?.rawValue, record.duration, quality])
        }
    }

    public func call(_ id: CallID) throws -> CallRecord? {
        try database.read { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM call WHERE call = ?"), arguments: [id.rawValue]).flatMap(Self.callRecord)
        }
    }

    public func calls(of user: UserID, limit: Int) throws -> [CallRecord] {
        try database.read { db in
            try Row.fetchAll(db, sql: """
                SELECT * FROM call WHERE caller = ? OR callee = ? ORDER BY createdAt DESC, rowid DESC LIMIT ?
                """, arguments: [user.rawValue, user.rawValue, limit]).compactMap(Self.callRecord)
        }
    }

    public func endUnfinishedCalls(reason: EndReason, at endedAt: Int64) throws -> Int {
        try database.write { db in
            try db.execute(sql: """
                UPDATE call SET endedAt = ?, reason = ?,
                  duration = CASE WHEN answeredAt IS NULL THEN NULL ELSE MAX(0, (? - answeredAt) / 1000.0) END
                WHERE endedAt IS NULL
                """, arguments: [endedAt, reason.rawValue, endedAt])
            return db.changesCount
        }
    }

    private static func deviceRecord(_ row: Row) -> DeviceRecord? {
        guard let user = UserID(rawValue: row["user"]), let device = DeviceID(rawValue: row["device"]) else { return nil }
        var voip: VoIPRegistration?
        if let token: String = row["voipToken"], let topic: String = row["voipTopic"],
           let environment = VoIPRegistration.Environment(rawValue: row["voipEnvironment"] ?? "") {
            voip = VoIPRegistration(token: token, topic: topic, environment: environment)
        }
        return DeviceRecord(user: user, device: device, platform: Platform(rawValue: row["platform"]), voip: voip,
                            updatedAt: row["updatedAt"])
    }

    private static func callRecord(_ row: Row) -> CallRecord? {
        guard let call = CallID(rawValue: row["call"]), let caller = UserID(rawValue: row["caller"]),
              let callee = UserID(rawValue: row["callee"]), let callerDevice = DeviceID(rawValue: row["callerDevice"])
        else { return nil }
        let quality = (row["quality"] as String?).flatMap { try? JSONDecoder().decode(CallQuality.self, from: Data($0.utf8)) }
        return CallRecord(call: call, caller: caller, callee: callee, callerDevice: callerDevice,
                          calleeDevice: (row["calleeDevice"] as String?).flatMap(DeviceID.init(rawValue:)),
                          media: MediaSpec(audio: row["audio"], video: row["video"]), createdAt: row["createdAt"],
                          answeredAt: row["answeredAt"], endedAt: row["endedAt"],
                          reason: (row["reason"] as String?).map(EndReason.init(rawValue:)), duration: row["duration"],
                          quality: quality)
    }
}
