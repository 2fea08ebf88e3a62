import Foundation
import GRDB
import Logging
import NIOConcurrencyHelpers
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import ServiceLifecycle
import Testing

@Suite("Persistence off the hub's path", .timeLimit(.minutes(5)))
struct PersistenceTests {
    let call: CallID = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a"

    /// Another process holds the database's write lock (a backup, a migration, a stuck writer).
    final class WriteLockHolder: @unchecked Sendable {
        private let release = DispatchSemaphore(value: 0)
        private let taken = DispatchSemaphore(value: 0)
        private let thread: Thread

        init(path: String) {
            let (release, taken) = (release, taken)
            thread = Thread {
                do {
                    let queue = try DatabaseQueue(path: path)
                    try queue.write { db in
                        try db.execute(sql: "INSERT INTO device (user, device, platform, updatedAt) VALUES ('lock', 'lock', 'linux', 0)")
                        taken.signal()
                        release.wait()
                    }
                } catch {
                    Issue.record("could not take the write lock: \(error)")
                    taken.signal()
                }
            }
            thread.start()
            taken.wait()
        }

        func unlock() { release.signal() }
    }

    @Test func aLockedDatabaseDelaysRecordsNeverSignalingAndLosesNone() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("parley-\(UUID().uuidString).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let server = try await LiveServer.start(databasePath: path)
        let alice = try await server.device("alice", "a1")
        let bob = try await server.device("bob", "b1")

        let lock = WriteLockHolder(path: path)
        // Each of these changes the call's record; none may wait for the database (5 s busy timeout).
        #expect(try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
        #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        #expect(try await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        #expect(try await server.http("GET", "/v1/calls", token: server.token("alice")).decode(CallList.self).calls.isEmpty,
                "nothing could be written yet")
        lock.unlock()

        await server.server.hub.flushRecords()
        let calls = try await server.http("GET", "/v1/calls", token: server.token("alice")).decode(CallList.self).calls
        #expect(calls.map(\.call) == [call])
        #expect(calls.first?.reason == .hangup)
        #expect(calls.first?.answeredAt != nil)
        try await server.stop()
    }

    @Test func theWriterWritesOnlyTheNewestStateOfACall() async throws {
        let store = try SQLiteStore(path: nil)
        let writer = CallRecordWriter(store: store, logger: .init(label: "test"))
        var record = CallRecord(call: call, caller: "alice", callee: "bob", callerDevice: "a1", media: .audioOnly, createdAt: 1)
        for step in 0..<100 {
            record.answeredAt = Int64(step)
            writer.save(StoredCall(record: record, expiresAt: 2))
        }
        #expect(writer.isPending(call), "nothing is written before the writer runs")
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await writer.run() }
            await writer.flush()
            group.cancelAll()
        }
        #expect(!writer.isPending(call))
        #expect(try await store.call(call)?.answeredAt == 99)
    }

    /// A batch gathers before it is written: what is handed over meanwhile, of any number of calls,
    /// goes in one statement, each call's newest state once.
    @Test func changesHandedOverWhileABatchGathersGoInOneStatement() async throws {
        let store = BatchCountingStore(try SQLiteStore(path: nil))
        let written = Milestone()
        let pauses = NIOLockedValueBox(0)
        let writer = CallRecordWriter(store: store, logger: .init(label: "test")) { _ in
            // The first batch gathers until the test has handed over the rest; later ones do not wait.
            guard pauses.withLockedValue({ $0 += 1; return $0 }) == 1 else { return }
            try? await written.wait()
        }
        let other: CallID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
        var record = CallRecord(call: call, caller: "alice", callee: "bob", callerDevice: "a1", media: .audioOnly, createdAt: 1)
        let running = Task { await writer.run() }
        writer.save(StoredCall(record: record, expiresAt: 2))
        try await eventually("the first batch gathers") { pauses.withLockedValue { $0 } == 1 }
        record.answeredAt = 5
        writer.save(StoredCall(record: record, expiresAt: 2))
        writer.save(StoredCall(record: CallRecord(call: other, caller: "carol", callee: "dave", callerDevice: "c1", media: .audioOnly, createdAt: 3),
                               expiresAt: 4))
        written.reach()
        await writer.flush()
        running.cancel()
        await running.value
        #expect(store.batches == [[call, other]], "one statement, the calls in the order they were first handed over")
        #expect(try await store.call(call)?.answeredAt == 5)
    }

    @Test func aGracefulShutdownWritesWhatIsLeftAndTheWriterEnds() async throws {
        let store = try SQLiteStore(path: nil)
        let writer = CallRecordWriter(store: store, logger: .init(label: "test"))
        let record = CallRecord(call: call, caller: "alice", callee: "bob", callerDevice: "a1", media: .audioOnly, createdAt: 1)
        let (shutdown, stop) = AsyncStream.makeStream(of: Void.self)
        let group = ServiceGroup(configuration: .init(services: [.init(service: writer),
                                                                 .init(service: Stopper(stops: shutdown), successTerminationBehavior: .gracefullyShutdownGroup)],
                                                      logger: Logger(label: "test")))
        try await withThrowingTaskGroup(of: Void.self) { services in
            services.addTask { try await group.run() }
            writer.save(StoredCall(record: record, expiresAt: 2))
            stop.yield()
            try await services.next()
        }
        #expect(try await store.call(call) != nil, "written by the time the service group ended")
    }
}

/// A store in front of another: it passes on what it does not change itself.
protocol StoreInFront: SignalingStore {
    var store: any SignalingStore { get }
}

extension StoreInFront {
    func saveCalls(_ calls: [StoredCall]) async throws { try await store.saveCalls(calls) }
    func upsertDevice(_ device: DeviceRecord) async throws { try await store.upsertDevice(device) }
    func deleteDevice(user: UserID, device: DeviceID) async throws -> Bool { try await store.deleteDevice(user: user, device: device) }
    func devices(of user: UserID) async throws -> [DeviceRecord] { try await store.devices(of: user) }
    func removePushToken(_ kind: PushTokenKind, user: UserID, device: DeviceID, token: String, registeredBefore: Int64?) async throws -> Bool {
        try await store.removePushToken(kind, user: user, device: device, token: token, registeredBefore: registeredBefore)
    }
    func call(_ id: CallID) async throws -> CallRecord? { try await store.call(id) }
    func calls(of user: UserID, limit: Int) async throws -> [CallRecord] { try await store.calls(of: user, limit: limit) }
    func unfinishedCalls() async throws -> [StoredCall] { try await store.unfinishedCalls() }
    func deploymentSecret(_ name: String) async throws -> [UInt8] { try await store.deploymentSecret(name) }
}

/// A store that keeps the calls of each batch written, in order, and stores them in another.
final class BatchCountingStore: StoreInFront {
    let store: any SignalingStore
    private let written = NIOLockedValueBox<[[CallID]]>([])
    var batches: [[CallID]] { written.withLockedValue { $0 } }

    init(_ store: any SignalingStore) { self.store = store }

    func saveCalls(_ calls: [StoredCall]) async throws {
        written.withLockedValue { $0.append(calls.map(\.record.call)) }
        try await store.saveCalls(calls)
    }
}

/// A store in front of another whose writes of calls fail while `failing`: before they reach the
/// other store (`.refusing`), or after it has them (`.losingAnswers`: the answer lost on the way back).
final class FailingCallWrites: StoreInFront {
    enum Failing { case no, refusing, losingAnswers }
    struct Refused: Error {}
    let store: any SignalingStore
    private let state = NIOLockedValueBox(Failing.no)
    var failing: Failing {
        get { state.withLockedValue { $0 } }
        set { state.withLockedValue { $0 = newValue } }
    }

    init(_ store: any SignalingStore) { self.store = store }

    func saveCalls(_ calls: [StoredCall]) async throws {
        let failing = self.failing
        if failing == .refusing { throw Refused() }
        try await store.saveCalls(calls)
        if failing == .losingAnswers { throw Refused() }
    }
}

/// A store whose writes, and reads of calls, always fail (a full disk, a dropped database).
struct FailingStore: SignalingStore {
    struct Down: Error {}
    func upsertDevice(_ device: DeviceRecord) throws { throw Down() }
    func deleteDevice(user: UserID, device: DeviceID) throws -> Bool { throw Down() }
    func devices(of user: UserID) throws -> [DeviceRecord] { [] }
    func removePushToken(_ kind: PushTokenKind, user: UserID, device: DeviceID, token: String, registeredBefore: Int64?) throws -> Bool { false }
    func saveCalls(_ calls: [StoredCall]) throws { throw Down() }
    func call(_ id: CallID) throws -> CallRecord? { throw Down() }
    func calls(of user: UserID, limit: Int) throws -> [CallRecord] { [] }
    func unfinishedCalls() throws -> [StoredCall] { [] }
    func deploymentSecret(_ name: String) throws -> [UInt8] { throw Down() }
}

@Suite("A store that keeps failing")
struct FailingStoreTests {
    /// A call the hub does not hold may still be in the store: when the store cannot say, the
    /// answer is "try again", never "no such call" (the client would drop a live call) and never a
    /// new call under an id that may be taken.
    @Test func aCallThatCannotBeLookedUpIsUnavailableNotUnknown() async throws {
        let h = try HubHarness(hubStore: FailingStore())
        let alice = await h.device("alice", "a1")
        _ = await h.device("bob", "b1")
        let call: CallID = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"
        #expect(await alice.request { .callState(CallRequest(id: $0, call: call)) }.errorCode == .unavailable)
        #expect(await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.errorCode == .unavailable)
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.errorCode == .unavailable)
    }

    /// A store that keeps failing must not hold a graceful stop: the writer stops retrying, makes
    /// its last try, and ends, keeping what it could not write.
    @Test(.timeLimit(.minutes(1))) func aGracefulShutdownEndsTheWriterWhoseStoreKeepsFailing() async throws {
        var quiet = Logger(label: "test")
        quiet.logLevel = .critical
        let writer = CallRecordWriter(store: FailingStore(), logger: quiet, maxBackoff: .seconds(30))
        let call: CallID = "4d3c2b1a-0f9e-4d8c-9b7a-5f4e3d2c1b0a"
        let (shutdown, stop) = AsyncStream.makeStream(of: Void.self)
        let group = ServiceGroup(configuration: .init(services: [.init(service: writer),
                                                                 .init(service: Stopper(stops: shutdown), successTerminationBehavior: .gracefullyShutdownGroup)],
                                                      logger: quiet))
        let started = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { services in
            services.addTask { try await group.run() }
            writer.save(StoredCall(record: CallRecord(call: call, caller: "alice", callee: "bob", callerDevice: "a1", media: .audioOnly, createdAt: 1),
                                   expiresAt: 2))
            // Into its backoff (50 ms, 100 ms, …, up to 30 s) before the stop.
            try await Task.sleep(for: .milliseconds(400))
            stop.yield()
            try await services.next()
        }
        #expect(ContinuousClock.now - started < .seconds(5), "the stop did not wait out the backoff")
        #expect(writer.isPending(call), "kept, not dropped")
    }

    @Test func aFlushGivesUpWhenCancelledAndTheRecordStaysQueued() async throws {
        var quiet = Logger(label: "test")
        quiet.logLevel = .critical
        // The writer goes on retrying for the rest of the test process, every second at most.
        let writer = CallRecordWriter(store: FailingStore(), logger: quiet, maxBackoff: .seconds(1))
        let call: CallID = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a"
        writer.save(StoredCall(record: CallRecord(call: call, caller: "alice", callee: "bob", callerDevice: "a1", media: .audioOnly, createdAt: 1),
                               expiresAt: 2))
        let running = Task { await writer.run() }
        let flush = Task { await writer.flush() }
        try await Task.sleep(for: .milliseconds(200))
        flush.cancel()
        await flush.value
        #expect(writer.isPending(call), "kept for the next try, not dropped")
        running.cancel()
        await running.value
        #expect(writer.isPending(call), "a writer that stops keeps what it could not write")
    }
}

/// A service that ends when told to, which shuts its group down gracefully.
struct Stopper: Service {
    let stops: AsyncStream<Void>
    func run() async throws {
        for await _ in stops { return }
    }
}
