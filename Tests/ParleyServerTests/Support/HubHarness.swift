import Foundation
import Logging
import NIOConcurrencyHelpers
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import ParleyTesting
import Testing

/// Records what the hub writes to one connection, synchronously.
final class RecordingSink: ConnectionSink, @unchecked Sendable {
    private let lock = NSLock()
    private var frames: [OutboundFrame] = []
    private var finished = false

    func write(_ frame: OutboundFrame) { lock.withLock { frames.append(frame) } }
    func finish() { lock.withLock { finished = true } }

    var isFinished: Bool { lock.withLock { finished } }

    /// The frames written since the last call, decoded.
    func take() -> [ServerFrame] {
        let taken: [OutboundFrame] = lock.withLock {
            defer { frames.removeAll { if case .text = $0 { return true } else { return false } } }
            return frames
        }
        return taken.compactMap { frame in
            guard case .text(let text) = frame else { return nil }
            do {
                return try WireCodec().decodeServerFrame(text)
            } catch {
                // A frame clients could not read is a bug of the hub's, not something to skip.
                Issue.record("the hub wrote a frame clients cannot decode: \(error)\n\(text)")
                return nil
            }
        }
    }

    var closeCode: CloseCode? {
        lock.withLock {
            for frame in frames { if case .close(let code, _) = frame { return code } }
            return nil
        }
    }
}

/// A hub on a manual clock with an in-memory store, and devices that talk to it directly.
struct HubHarness {
    let clock: ManualClock
    let store: SQLiteStore
    let hub: SignalingHub<ManualClock>
    let configuration: ServerConfiguration
    private let ids = Counter()
    /// The hub's `run()` (or its handed-off work) and its record writer, as the server runs them.
    private let running: Task<Void, Never>
    private let runEnded = NIOLockedValueBox(false)

    init(configure: (inout ServerConfiguration) -> Void = { _ in }) throws {
        try self.init(store: SQLiteStore(path: nil), clock: ManualClock(), configure: configure)
    }

    /// A hub on `hubStore` instead (a store that fails, say); `store` is then an empty one it never reads.
    init(hubStore: any SignalingStore) throws {
        try self.init(store: SQLiteStore(path: nil), hubStore: hubStore, clock: ManualClock(), configure: { _ in })
    }

    /// A node of an in-memory deployment of several (`InMemoryDeployment`), on the deployment's
    /// store over `store`, which every node shares, and a clock all the nodes share.
    init(node: InMemoryDeployment.Node, of deployment: InMemoryDeployment, store: SQLiteStore, clock: ManualClock) {
        self.init(store: store, hubStore: deployment.store, clock: clock, cluster: node, configure: { _ in })
    }

    /// A node of an in-memory deployment whose hub uses `hubStore`, a store in front of the deployment's.
    init(node: InMemoryDeployment.Node, store: SQLiteStore, hubStore: any SignalingStore, clock: ManualClock) {
        self.init(store: store, hubStore: hubStore, clock: clock, cluster: node, configure: { _ in })
    }

    private init(store: SQLiteStore, hubStore: (any SignalingStore)? = nil, clock: ManualClock, cluster: (any ClusterLink)? = nil,
                 configure: (inout ServerConfiguration) -> Void) {
        var configuration = ServerConfiguration()
        configuration.databasePath = nil
        configure(&configuration)
        self.configuration = configuration
        self.store = store
        self.clock = clock
        var logger = Logger(label: "test.hub")
        logger.logLevel = .critical
        hub = SignalingHub(configuration: configuration, store: hubStore ?? store, clock: clock, logger: logger, cluster: cluster,
                           wallClock: { clock.wallNow })
        // What the hub hands off (Janus admissions and releases) and its record writer run as under
        // the server; the clock is the test's, and so are the sweeps (`advance`). Abandoned with the
        // harness, as its hub is, unless a test stops it (`stopRunning`).
        // With other nodes it runs whole, to hear them (its sweeps wait on the manual clock).
        let clustered = cluster != nil
        running = Task { [hub, runEnded] in
            await withDiscardingTaskGroup { group in
                group.addTask {
                    clustered ? await hub.run() : await hub.runHandedOffWork()
                    runEnded.withLockedValue { $0 = true }
                }
                group.addTask { await hub.records.run() }
            }
        }
    }

    /// Cancels the hub's `run()` (or its handed-off work), as the server does as it stops, and waits
    /// at most `limit` for it to return.
    func stopRunning(within limit: Duration = .seconds(5)) async throws {
        running.cancel()
        try await eventually(timeout: limit, "the hub's run() returned") { runEnded.withLockedValue { $0 } }
    }

    final class Counter: @unchecked Sendable {
        private let lock = NSLock()
        private var value: UInt64 = 0
        func next() -> UInt64 { lock.withLock { value += 1; return value } }
    }

    /// Opens a connection without saying hello.
    func open(_ user: UserID, name: String? = nil, tokenLifetime: Int64 = 3600) async -> TestDevice {
        let sink = RecordingSink()
        let identity = Identity(user: user, name: name, expiresAt: clock.wallNow / 1000 + tokenLifetime)
        let connection = Connection(id: ids.next(), identity: identity, outbound: sink, now: hub.now())
        await hub.connect(connection)
        return TestDevice(hub: hub, connection: connection, sink: sink, user: user)
    }

    /// Opens a connection and says hello; the welcome is consumed.
    func device(_ user: UserID, _ device: DeviceID, name: String? = nil, resume: ResumeRequest? = nil) async -> TestDevice {
        let client = await open(user, name: name)
        await client.send(.hello(Hello(id: "hello", device: device, resume: resume)))
        var frames = client.sink.take()
        if let first = frames.first, case .welcome(let welcome) = first.message {
            client.welcome = welcome
            frames.removeFirst()
        }
        client.pending = frames
        client.device = device
        return client
    }

    /// A new hub on the same store, as after the process died: the old hub is simply abandoned
    /// (only what its writer had stored survives), and the new one restores the unfinished calls.
    func restarted(after downtime: Duration = .seconds(2), configure: (inout ServerConfiguration) -> Void = { _ in }) async throws -> HubHarness {
        await hub.flushRecords()
        clock.advance(by: downtime)
        let next = HubHarness(store: store, clock: clock, configure: configure)
        await next.hub.restore(try store.unfinishedCalls())
        return next
    }

    func advance(_ duration: Duration) async {
        clock.advance(by: duration)
        await hub.sweep()
    }
}

final class TestDevice: @unchecked Sendable {
    let hub: SignalingHub<ManualClock>
    let connection: Connection
    let sink: RecordingSink
    let user: UserID
    var device: DeviceID = "unset"
    var welcome: Welcome?
    private var requests = 0

    init(hub: SignalingHub<ManualClock>, connection: Connection, sink: RecordingSink, user: UserID) {
        self.hub = hub
        self.connection = connection
        self.sink = sink
        self.user = user
    }

    var key: DeviceKey { DeviceKey(user: user, device: device) }

    func send(_ message: ClientMessage) async {
        connection.touch(now: hub.now())
        await hub.receive(connection.id, message)
    }

    func nextID() -> String {
        requests += 1
        return "r\(requests)"
    }

    /// Sends a request and answers the ack's result, or the error.
    @discardableResult
    func request(_ make: (String) -> ClientMessage) async -> Result<Ack, ErrorMessage> {
        let id = nextID()
        await send(make(id))
        for frame in sink.take() {
            switch frame.message {
            case .ack(let ack) where ack.re == id: return .success(ack)
            case .error(let error) where error.re == id: return .failure(error)
            default: pending.append(frame)
            }
        }
        return .failure(ErrorMessage(code: .internal, message: "no answer to \(id)"))
    }

    /// Frames other than the answers `request` consumed.
    var pending: [ServerFrame] = []

    func events() -> [ServerMessage] {
        let all = pending + sink.take()
        pending = []
        return all.map(\.message)
    }

    func disconnect() async { await hub.disconnected(connection.id) }
}

extension Result where Failure == ErrorMessage {
    var errorCode: ErrorCode? { if case .failure(let error) = self { error.code } else { nil } }
    var isSuccess: Bool { if case .success = self { true } else { false } }
}
