import Foundation
import Logging
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import Testing

/// What every `SignalingStore` promises, checked on SQLite and on a real PostgreSQL alike.
@Suite("Stores: SQLite and PostgreSQL keep the same promises", .timeLimit(.minutes(5)))
struct StoreContractTests {
    static let voip = VoIPRegistration(token: "a1b2c3", topic: "app.parley.voip", environment: .production)
    static let alerts = VoIPRegistration(token: "d4e5f6", topic: "app.parley", environment: .sandbox)

    /// Runs `body` on a fresh store of `kind`, and removes it after.
    func with(_ kind: StoreKind, _ body: (any SignalingStore, TestDatabase) async throws -> Void) async throws {
        guard TestDatabase.canRun(kind, "store tests") else { return }
        let database = try await TestDatabase(kind)
        defer { database.close() }
        let store = try await database.open()
        do { try await body(store, database) } catch {
            await store.close()
            throw error
        }
        await store.close()
    }

    /// Call ids are UUIDs: `id(3)` is the third.
    static func id(_ n: Int) -> CallID { CallID(rawValue: "00000000-0000-4000-8000-00000000000\(n)")! }

    static func call(_ id: String, caller: UserID = "alice", callee: UserID = "bob", at createdAt: Int64) -> StoredCall {
        StoredCall(record: CallRecord(call: Self.id(Int(id.dropFirst(2))!), caller: caller, callee: callee, callerDevice: "a1",
                                      media: MediaSpec(audio: true, video: false), createdAt: createdAt),
                   expiresAt: createdAt + 45_000, callerName: "Alice", metadata: .object(["topic": .string("résumé")]))
    }

    @Test(arguments: StoreKind.allCases)
    func devicesRoundTripAndAPushTokenBelongsToOneInstallation(_ kind: StoreKind) async throws {
        try await with(kind) { store, _ in
            let phone = DeviceRecord(user: "alice", device: "iphone", platform: .ios, voip: Self.voip, alerts: Self.alerts, updatedAt: 10)
            try await store.upsertDevice(phone)
            try await store.upsertDevice(DeviceRecord(user: "alice", device: "browser", platform: .web, voip: nil, updatedAt: 11))
            #expect(try await store.devices(of: "alice") == [DeviceRecord(user: "alice", device: "browser", platform: .web, voip: nil,
                                                                          updatedAt: 11), phone], "sorted by device")
            // Bob signs in on the same phone: its VoIP token is his now, and no longer Alice's; her alert token stays.
            try await store.upsertDevice(DeviceRecord(user: "bob", device: "iphone", platform: .ios, voip: Self.voip, updatedAt: 12))
            let alices = try await store.devices(of: "alice").first { $0.device == "iphone" }
            #expect(alices?.voip == nil)
            #expect(alices?.alerts == Self.alerts)
            #expect(try await store.devices(of: "bob").map(\.voip) == [Self.voip])
            // A registration again replaces what the device had.
            try await store.upsertDevice(DeviceRecord(user: "alice", device: "iphone", platform: .ios, voip: nil, alerts: nil, updatedAt: 13))
            #expect(try await store.devices(of: "alice").first { $0.device == "iphone" }?.alerts == nil)
            #expect(try await store.deleteDevice(user: "alice", device: "iphone"))
            #expect(try await !store.deleteDevice(user: "alice", device: "iphone"), "gone already")
            #expect(try await !store.deleteDevice(user: "carol", device: "browser"), "another user's device id")
            #expect(try await store.devices(of: "alice").map(\.device) == ["browser"])
            #expect(try await store.devices(of: "nobody").isEmpty)
        }
    }

    @Test(arguments: StoreKind.allCases)
    func aRejectedTokenIsDroppedOnlyWhileTheDeviceStillHasItFromBefore(_ kind: StoreKind) async throws {
        try await with(kind) { store, _ in
            try await store.upsertDevice(DeviceRecord(user: "bob", device: "b1", platform: .ios, voip: Self.voip, alerts: Self.alerts,
                                                      updatedAt: 1_000))
            #expect(try await !store.removePushToken(.voip, user: "bob", device: "b1", token: "ffff", registeredBefore: nil), "not its token")
            #expect(try await !store.removePushToken(.voip, user: "bob", device: "b1", token: Self.voip.token, registeredBefore: 999),
                    "registered after APNs's 410")
            #expect(try await !store.removePushToken(.voip, user: "carol", device: "b1", token: Self.voip.token, registeredBefore: nil))
            #expect(try await store.removePushToken(.voip, user: "bob", device: "b1", token: Self.voip.token, registeredBefore: 1_000))
            var bob = try #require(try await store.devices(of: "bob").first)
            #expect(bob.voip == nil)
            #expect(bob.alerts == Self.alerts, "the other token stays")
            #expect(try await store.removePushToken(.alert, user: "bob", device: "b1", token: Self.alerts.token, registeredBefore: nil))
            bob = try #require(try await store.devices(of: "bob").first)
            #expect(bob.alerts == nil)
        }
    }

    @Test(arguments: StoreKind.allCases)
    func aCallIsStoredOnceAndOnlyWhatCanChangeChanges(_ kind: StoreKind) async throws {
        try await with(kind) { store, _ in
            let ringing = Self.call("c-1", at: 1_000)
            try await store.saveCalls([ringing])
            #expect(try await store.call(Self.id(1)) == ringing.record)
            #expect(try await store.unfinishedCalls() == [ringing])

            var ended = ringing
            ended.record.calleeDevice = "b1"
            ended.record.answeredAt = 2_000
            ended.record.endedAt = 62_000
            ended.record.reason = .hangup
            ended.record.duration = 60.5
            ended.record.quality = CallQuality(mos: 4.1, rttMs: 38, jitterMs: 2.5, lossPct: 0.25, bitrateKbps: 32)
            ended.record.recordings = [RecordingRecord(requestedBy: Party(user: "alice", device: "a1"),
                                                       consentedBy: Party(user: "bob", device: "b1"), startedAt: 3_000,
                                                       endedAt: 9_000, stoppedBy: Party(user: "bob", device: "b1"))]
            var changedAfterTheFact = ended
            changedAfterTheFact.record.caller = "mallory"
            changedAfterTheFact.record.createdAt = 5
            changedAfterTheFact.callerName = "Mallory"
            try await store.saveCalls([changedAfterTheFact])
            #expect(try await store.call(Self.id(1)) == ended.record, "who called and when stay as first stored")
            #expect(try await store.unfinishedCalls().isEmpty)
            #expect(try await store.calls(of: "mallory", limit: 10).isEmpty)
            #expect(try await store.call(Self.id(2)) == nil)
        }
    }

    @Test(arguments: StoreKind.allCases)
    func historyIsNewestFirstEitherSideAndLimited(_ kind: StoreKind) async throws {
        try await with(kind) { store, _ in
            try await store.saveCalls([Self.call("c-1", at: 1_000), Self.call("c-2", caller: "bob", callee: "alice", at: 2_000),
                                       Self.call("c-3", caller: "carol", callee: "dave", at: 3_000)])
            // Two calls in the same millisecond: the one stored later is the newer.
            try await store.saveCalls([Self.call("c-4", at: 2_000)])
            #expect(try await store.calls(of: "alice", limit: 10).map(\.call) == [Self.id(4), Self.id(2), Self.id(1)])
            #expect(try await store.calls(of: "alice", limit: 2).map(\.call) == [Self.id(4), Self.id(2)])
            #expect(try await store.calls(of: "dave", limit: 10).map(\.call) == [Self.id(3)])
            #expect(try await store.unfinishedCalls().map(\.record.call) == [Self.id(1), Self.id(2), Self.id(4), Self.id(3)], "oldest first")
        }
    }

    @Test(arguments: StoreKind.allCases)
    func reopeningKeepsEverythingAndMigratesNothingAgain(_ kind: StoreKind) async throws {
        try await with(kind) { store, database in
            try await store.saveCalls([Self.call("c-1", at: 1_000)])
            try await store.upsertDevice(DeviceRecord(user: "bob", device: "b1", platform: .ios, voip: Self.voip, updatedAt: 1))
            let again = try await database.open()
            #expect(try await again.unfinishedCalls().map(\.record.call) == [Self.id(1)])
            #expect(try await again.devices(of: "bob").count == 1)
            await again.close()
            if let postgres = database.postgres {
                #expect(try postgres.psql("SELECT count(*) FROM parley_migration", database: database.name) == "\(PostgresStore.schemaVersion)")
            }
        }
    }

    /// Made once, then the same for every store opened on the database (every node, every restart),
    /// also when several ask at once; another name is another secret.
    @Test(arguments: StoreKind.allCases)
    func aDeploymentSecretIsMadeOnceAndKept(_ kind: StoreKind) async throws {
        try await with(kind) { store, database in
            let other = try await database.open()
            let secrets = try await withThrowingTaskGroup(of: [UInt8].self) { group in
                for index in 0..<8 { group.addTask { try await (index.isMultiple(of: 2) ? store : other).deploymentSecret("rooms") } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            await other.close()
            #expect(secrets[0].count == 32)
            #expect(Set(secrets).count == 1)
            #expect(Set(secrets[0]).count > 8, "random bytes, not a constant")
            let reopened = try await database.open()
            #expect(try await reopened.deploymentSecret("rooms") == secrets[0])
            #expect(try await reopened.deploymentSecret("other") != secrets[0])
            await reopened.close()
        }
    }

    @Test func nodesThatStartTogetherMigrateOnce() async throws {
        guard TestDatabase.canRun(.postgres, "PostgreSQL migration tests") else { return }
        let database = try await TestDatabase(.postgres)
        defer { database.close() }
        let stores = try await withThrowingTaskGroup(of: (any SignalingStore).self) { group in
            for _ in 0..<4 { group.addTask { try await database.open() } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(stores.count == 4)
        try await stores[0].saveCalls([Self.call("c-1", at: 1)])
        #expect(try await stores[3].call(Self.id(1)) != nil, "one database behind every node")
        for store in stores { await store.close() }
        let name = database.name
        #expect(try database.postgres?.psql("SELECT count(*) FROM parley_migration", database: name) == "\(PostgresStore.schemaVersion)",
                "each migration once")
    }

    @Test func aSchemaFromANewerParleyIsRefusedAndLeftAlone() async throws {
        guard TestDatabase.canRun(.postgres, "PostgreSQL migration tests") else { return }
        let database = try await TestDatabase(.postgres)
        defer { database.close() }
        try await database.open().close()
        let name = database.name
        try database.postgres?.psql("INSERT INTO parley_migration (version, description) VALUES (99, 'from the future')", database: name)
        do {
            _ = try await database.open()
            Issue.record("a newer schema was opened")
        } catch {
            #expect("\(error)".contains("version 99, from a newer Parley"), "\(error)")
        }
        #expect(try database.postgres?.psql("SELECT max(version) FROM parley_migration", database: name) == "99")
    }

    @Test func aServerThatIsNotThereIsAClearErrorInTime() async throws {
        let location = try PostgresLocation(url: "postgres://parley@/parley?host=/nonexistent-parley-dir")
        let started = ContinuousClock.now
        do {
            _ = try await PostgresStore.open(location, logger: TestDatabase.logger, timeout: .seconds(2))
            Issue.record("opened a store on nothing")
        } catch {
            #expect(error.description.hasPrefix("could not open postgres://parley@/parley (socket /nonexistent-parley-dir/.s.PGSQL.5432)"),
                    "\(error)")
        }
        #expect(ContinuousClock.now - started < .seconds(10))
    }

    @Test func databaseURLsReadAsLibpqReadsThem() throws {
        let tcp = try PostgresLocation(url: "postgres://app:s%40cret@db.internal:6543/parley?sslmode=require", environment: [:])
        #expect(tcp == PostgresLocation(endpoint: .tcp(host: "db.internal", port: 6543), user: "app", password: "s@cret",
                                        database: "parley", tls: .require))
        #expect(tcp.description == "postgres://app@db.internal:6543/parley", "no password in logs")
        let socket = try PostgresLocation(url: "postgresql://app@/calls?host=/run/postgresql", environment: ["PGPASSWORD": "pw"])
        #expect(socket == PostgresLocation(endpoint: .socket(path: "/run/postgresql/.s.PGSQL.5432"), user: "app", password: "pw",
                                           database: "calls", tls: .disable))
        #expect(try PostgresLocation(url: "postgres://app@127.0.0.1/x").tls == .disable, "loopback needs no TLS")
        #expect(try PostgresLocation(url: "postgres://app@10.0.0.5/x").tls == .prefer, "libpq's default elsewhere")
        #expect(try PostgresLocation(url: "postgres://app@[::1]:5433/x").endpoint == .tcp(host: "::1", port: 5433))
        #expect(try PostgresLocation(url: "postgres://app@db").database == "app", "the database defaults to the user")
        for bad in ["postgres://app@db:99999/x", "postgres://app@db/x?sslmode=maybe", "postgres://app@db/x?colour=blue",
                    "postgres://app@/x?host=/tmp&sslmode=require", "mysql://app@db/x"] {
            #expect(throws: ConfigurationError.self, "\(bad)") { try PostgresLocation(url: bad) }
        }
        var configuration = ServerConfiguration()
        configuration.databasePath = "postgres://app@db/x?sslmode=maybe"
        #expect(throws: ConfigurationError.self) { try configuration.validate() }
    }
}
