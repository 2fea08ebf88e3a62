import Foundation
import Logging
import ParleyServer
import ParleyServerTesting
import Testing

/// The stores a test runs against: the same test, once each.
enum StoreKind: String, CaseIterable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue == "sqlite" ? "SQLite" : "PostgreSQL" }
}

/// A database of a test's own, of either kind: a SQLite file in the temporary directory, or a new
/// database on a private PostgreSQL server started for the test. `close()` removes it all.
final class TestDatabase: Sendable {
    let kind: StoreKind
    /// What `ServerConfiguration.databasePath` and `--database` take.
    let setting: String
    let postgres: PostgresServer?
    /// The PostgreSQL database's name.
    let name: String

    init(_ kind: StoreKind) async throws {
        self.kind = kind
        switch kind {
        case .sqlite:
            setting = FileManager.default.temporaryDirectory.appendingPathComponent("parley-\(UUID().uuidString).sqlite").path
            name = ""
            postgres = nil
        case .postgres:
            let server = try await PostgresServer.start()
            do { name = try server.createDatabase() } catch {
                server.stop()
                throw error
            }
            setting = server.url(database: name)
            postgres = server
        }
    }

    /// Opens the store as the server would, and runs it as the server would (a `PostgresStore`
    /// answers once it runs) until the test closes it.
    func open() async throws -> any SignalingStore {
        let store = try await SignalingServer.openStore(setting, logger: Self.logger)
        // Ended by the store's `close()`, which waits for it.
        if let postgres = store as? PostgresStore {
            Task { await postgres.run() }
            try await postgres.running()
        }
        return store
    }

    static let logger: Logger = {
        var logger = Logger(label: "test.store")
        logger.logLevel = ProcessInfo.processInfo.environment["PARLEY_TEST_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .critical
        return logger
    }()

    func close() {
        postgres?.stop()
        if kind == .sqlite { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: setting + suffix) } }
    }

    /// Whether tests on `kind` can run here (PostgreSQL installed, or required by `scripts/test.sh`).
    static func canRun(_ kind: StoreKind, _ what: String) -> Bool {
        kind == .sqlite || PostgresServer.testsCanRun(what)
    }
}
