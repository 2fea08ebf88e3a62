import Foundation
import Hummingbird
import HummingbirdWebSocket
import Logging
import NIOCore
import ParleyAPNs
import ParleyProtocol
import ServiceLifecycle
import UnixSignals

/// The Parley signaling server: protocol v1 over WebSocket, the HTTP endpoints, metrics.
///
/// ```swift
/// let server = try await SignalingServer(configuration: configuration, logger: logger)
/// try await server.run()   // until SIGTERM or SIGINT
/// ```
public final class SignalingServer: Sendable {
    public let configuration: ServerConfiguration
    public let store: any SignalingStore
    /// Whether the server opened the store (and closes it when it stops).
    private let ownsStore: Bool
    /// The other nodes, when the store is PostgreSQL: every node on one database is one deployment.
    public let cluster: PostgresCluster?
    public let metrics: ServerMetrics
    public let hub: SignalingHub<ContinuousClock>
    let tokens: TokenAuthority
    private let logger: Logger
    private let pushSender: (any PushSender)?
    /// APNs, when configured and no other sender was given: its key is read once, here.
    private let apns: APNsClient.Configuration?
    private let pushes: AsyncStream<Push>
    private let onRunning: @Sendable (Int) async -> Void

    /// Where the server's start has got to: the hub's service reaches it once the cluster is joined
    /// and the calls of earlier runs are taken over; the HTTP server listens only then.
    private let started = Milestone()

    /// Checks the configuration and opens the store; what else needs the database (joining the
    /// other nodes, the room key, the calls of earlier runs) is the first thing `run()` does.
    /// - Parameters:
    ///   - store: where devices and call records live; by default the one `databasePath` names
    ///     (`openStore`), which the server runs and closes. A store given here is the caller's to
    ///     run and stays open: a `PostgresStore` answers once it runs, and the server's start waits
    ///     until it does.
    ///   - pushSender: sends pushes; by default APNs when the configuration has `apns`, else none
    ///     (pushes are logged and dropped).
    ///   - onRunning: told the port the server listens on, once it does.
    public init(configuration: ServerConfiguration, logger: Logger, store: (any SignalingStore)? = nil,
                pushSender: (any PushSender)? = nil, onRunning: @escaping @Sendable (Int) async -> Void = { _ in }) async throws {
        try configuration.validate()
        if configuration.developmentMode, !configuration.isLoopback {
            logger.warning("development mode off loopback: anyone who can reach this server can mint tokens for any user",
                           metadata: ["server.host": "\(configuration.host)"])
        }
        self.configuration = configuration
        self.logger = logger
        // What can fail without a database, first: a store opened is a store to close.
        self.tokens = try await TokenAuthority(key: configuration.tokenKey)
        self.apns = pushSender == nil ? try configuration.apns?.clientConfiguration() : nil
        ownsStore = store == nil
        let store = if let store { store } else { try await Self.openStore(configuration.databasePath, logger: logger) }
        self.store = store
        let metrics = ServerMetrics()
        self.metrics = metrics
        cluster = (store as? PostgresStore).map { PostgresCluster(store: $0, bus: configuration.nodeBus, metrics: metrics, logger: logger) }
        let (pushes, pushContinuation) = AsyncStream<Push>.makeStream()
        self.pushes = pushes
        self.pushSender = pushSender
        self.onRunning = onRunning
        self.hub = SignalingHub(configuration: configuration, store: store, metrics: metrics, clock: ContinuousClock(),
                                logger: logger, pushes: pushContinuation, cluster: cluster)
    }

    /// Opens the store a database setting names: a `postgres://` URL (`PostgresStore`, shared by
    /// several nodes), a SQLite file's path, or nil for SQLite in memory.
    public static func openStore(_ database: String?, logger: Logger) async throws -> any SignalingStore {
        guard let database, PostgresLocation.isURL(database) else { return try SQLiteStore(path: database) }
        return try await PostgresStore.open(try PostgresLocation(url: database), logger: logger)
    }

    /// Mints an access token this server accepts (with the configured key).
    public func mintToken(user: UserID, name: String? = nil, lifetime: Duration) async throws -> String {
        try await tokens.mint(user: user, name: name, lifetime: lifetime).token
    }

    /// Starts (joins the other nodes, takes over the calls of earlier runs), serves until SIGTERM or
    /// SIGINT, then closes clients with 1001 (they reconnect and resume, here or at the next start),
    /// stores every call, and returns. Calls go on: the next start restores them.
    public func run() async throws {
        try await makeServiceGroup(signals: [.sigterm, .sigint]).run()
    }

    static func quietingRefusedUpgrades(_ logger: Logger) -> Logger {
        var quiet = logger
        quiet.handler = RefusedUpgradeLogHandler(wrapped: logger.handler)
        return quiet
    }

    /// The server's services, for a caller that runs its own `ServiceGroup` (tests do).
    public func makeServiceGroup(signals: [UnixSignal]) -> ServiceGroup {
        let router = Router(context: ParleyRequestContext.self)
        let limiter = AddressRateLimiter(rate: configuration.limits.httpRequestsPerSecond, burst: configuration.limits.httpBurst)
        HTTPRoutes(configuration: configuration, store: store, tokens: tokens, metrics: metrics,
                   wallClock: { Int64(Date().timeIntervalSince1970 * 1000) },
                   isShuttingDown: { [hub] in await hub.isShuttingDown }, limiter: limiter,
                   isPresent: { [hub] user in await hub.isPresent(user) },
                   lanGate: configuration.lan.map { LANGate(settings: $0, logger: logger) },
                   recordsWritten: { [hub] in
                       // A store that cannot be written within 2 s is read as it is (its read says if it fails too).
                       _ = try? await withDeadline(.seconds(2), "call records written") { await hub.records.flush() }
                   }).register(on: router)
        let openConnections = OpenConnections()
        let endpoint = WebSocketEndpoint(hub: hub, tokens: tokens, metrics: metrics, open: openConnections, limiter: limiter,
                                         cluster: cluster, logger: logger)
        let onRunning = self.onRunning
        let app = Application(
            router: router,
            server: .http1WebSocketUpgrade(
                // The heartbeat is the client's to send (protocol v1); silence closes with 4002 in the hub.
                configuration: .init(ws: .init(maxFrameSize: configuration.limits.maxFrameSize, autoPing: .disabled)),
                shouldUpgrade: { request, channel, _ in await endpoint.shouldUpgrade(request, channel: channel) }
            ),
            configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "parley"),
            onServerRunning: { [cluster, configuration, logger] channel in
                let port = channel.localAddress?.port ?? 0
                if let cluster, configuration.nodeBus == .direct {
                    if let address = configuration.nodeLinkAddress(port: port) {
                        await cluster.advertise(address)
                    } else {
                        logger.notice("no address for direct links from the other nodes (a wildcard --host and no --node-address): they send here by NOTIFY")
                    }
                }
                await onRunning(port)
            },
            logger: Self.quietingRefusedUpgrades(logger)
        )
        // They start together; the hub's service starts the server (`started`), and the HTTP server
        // waits for that. Graceful shutdown runs from the last to the first: the hub (1001 to
        // clients, calls stored), the cluster (calls and rooms handed back, the others told, their
        // links closed), the push queue, the HTTP server, the call record writer (the hub flushes
        // its calls through it as it stops), the store (after every call is written).
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
        if ownsStore { services.append(.init(service: StoreService(store: store))) }
        services += [
            .init(service: hub.records),
            .init(service: AfterStart(started: started, service: ShutdownDeadline(service: app, limit: .seconds(5), logger: logger))),
            .init(service: PushService(pushes: pushes, sender: pushSender, apns: apns, store: store, metrics: metrics, logger: logger)),
        ]
        // A node that no longer hears the others stops, gracefully: its clients get 1001 and go elsewhere.
        if let cluster { services.append(.init(service: cluster, failureTerminationBehavior: .gracefullyShutdownGroup)) }
        services.append(.init(service: HubService(hub: hub, open: openConnections, store: store, cluster: cluster,
                                                  readsRoomKey: configuration.janus != nil, started: started)))
        var group = ServiceGroupConfiguration(services: services, gracefulShutdownSignals: signals, logger: logger)
        // Every step of the stop has its own bound (the hub's records 10 s and 5 s, the clients'
        // drain 5 s, pushes 5 s, the HTTP server 5 s): past all of them together the stop is
        // cancelled, and a service that ignores even that ends the process. A node stuck in its
        // stop holds its port and its clients' calls from the nodes that would take them over.
        group.maximumGracefulShutdownDuration = Self.stopLimit
        group.maximumCancellationDuration = .seconds(10)
        return ServiceGroup(configuration: group)
    }

    /// How long a graceful stop may take before it is cancelled.
    public static var stopLimit: Duration { .seconds(40) }
}

/// Runs the store the server opened (a `PostgresStore`'s pool), and closes it when the server stops.
struct StoreService: Service {
    let store: any SignalingStore

    func run() async throws {
        if let postgres = store as? PostgresStore { await postgres.run() } else { try? await gracefulShutdown() }
        await store.close()
    }
}

/// Runs `service` once the server has started; not at all if the start failed or the server
/// stops first.
struct AfterStart<Wrapped: Service>: Service {
    let started: Milestone
    let service: Wrapped

    func run() async throws {
        do {
            try await cancelWhenGracefulShutdown { try await started.wait() }
        } catch {
            // A service leaves only on its own turn (or when the group is cancelled, as it is when
            // the start fails).
            try? await gracefulShutdown()
            return
        }
        try await service.run()
    }
}

/// Runs `service`; once a graceful shutdown began, gives it `limit` to finish on its own, then
/// cancels it (Hummingbird's server then closes the connections it still has). Its graceful
/// shutdown ends only when every connection has closed: in one CI run a browser test waited 26
/// minutes on its server's stop, the listener closed and one page's kept-alive connection still
/// open and answered. The cause is not found; the stop is bounded whatever a client does.
struct ShutdownDeadline<Wrapped: Service>: Service {
    let service: Wrapped
    let limit: Duration
    let logger: Logger

    func run() async throws {
        try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                try await service.run()
                return true
            }
            group.addTask {
                try await gracefulShutdown()
                try await Task.sleep(for: limit)
                return false
            }
            // The first to finish: the service (done, or failed), or the deadline.
            defer { group.cancelAll() }
            if try await group.next() == false {
                logger.notice("the HTTP server had not stopped \(limit) into the shutdown; closing its connections")
            }
        }
    }
}

/// Starts the server (`start()`), then runs the hub's timeouts. On graceful shutdown it shuts the
/// hub down and waits (up to 5 s) until every client has its last frames and its close, before the
/// cluster leaves and the HTTP server stops.
///
/// On the server's own clock, not generic over it: `ServiceGroup` calls `run()` through `Service`,
/// and a generic service would run the hub's `run()` (every message from another node, every
/// sweep) as unspecialized generic code.
struct HubService: Service {
    let hub: SignalingHub<ContinuousClock>
    let open: OpenConnections
    let store: any SignalingStore
    let cluster: PostgresCluster?
    /// Whether rooms are on Janus: their numbers come from the deployment's room key.
    let readsRoomKey: Bool
    /// Reached once the hub can take connections.
    let started: Milestone

    func run() async throws {
        do {
            // A stop asked for meanwhile (SIGTERM) ends the start, and the server never listens.
            try await cancelWhenGracefulShutdown { try await start() }
            if Task.isShuttingDownGracefully { throw CancellationError() }
        } catch {
            started.fail(error)
            if Task.isShuttingDownGracefully { return }
            throw error
        }
        started.reach()
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await hub.run() }
            try? await gracefulShutdown()
            await hub.shutdown()
            // A store that keeps failing must not hold the process forever: what is not written in
            // time is logged by the writer, and the calls it concerns end by resume expiry next start.
            await withTaskGroup(of: Void.self) { flush in
                flush.addTask { await hub.flushRecords() }
                flush.addTask { try? await Task.sleep(for: .seconds(10)) }
                await flush.next()
                flush.cancelAll()
            }
            await open.drained(within: .seconds(5))
            await hub.closeRooms()
            group.cancelAll()
        }
        // Requests forwarded here while the clients drained changed calls: written before they go.
        await withTaskGroup(of: Void.self) { flush in
            flush.addTask { await hub.flushRecords() }
            flush.addTask { try? await Task.sleep(for: .seconds(5)) }
            await flush.next()
            flush.cancelAll()
        }
    }

    /// Before the first connection: a restart, graceful or a crash, ends no call. With several
    /// nodes, this one joins the others first, then takes over the calls of nodes that are gone,
    /// and only those.
    private func start() async throws {
        if let cluster { try await cluster.joined.wait() }
        // The hub's rooms take the deployment's key, which it alone sees.
        if readsRoomKey { await hub.useRoomKey(try await store.deploymentSecret("audiobridge-rooms")) }
        if cluster != nil { await hub.adopt() } else { await hub.restore(try await store.unfinishedCalls()) }
    }
}

/// Sends the hub's pushes, many at once (one that APNs makes wait never holds up the others, and
/// none holds up signaling), and forgets the tokens APNs rejects. On graceful shutdown the pushes
/// under way get 5 s to finish.
struct PushService: Service {
    let pushes: AsyncStream<Push>
    let sender: (any PushSender)?
    /// Without a sender: APNs, with a connection opened for the service's run and closed after.
    let apns: APNsClient.Configuration?
    let store: any SignalingStore
    let metrics: ServerMetrics
    let logger: Logger
    var concurrency = 64

    func run() async throws {
        var sender = self.sender
        var client: APNsClient?
        if sender == nil, let apns {
            let apnsClient = try APNsClient(configuration: apns, logger: logger) { [metrics] in metrics.apnsRequest($0) }
            client = apnsClient
            sender = APNsPushSender(client: apnsClient)
        }
        await send(pushes, with: sender)
        try? await client?.shutdown()
        // A service leaves only on its own turn.
        try? await gracefulShutdown()
    }

    private func send(_ pushes: AsyncStream<Push>, with sender: (any PushSender)?) async {
        // Each task answers whether it is the shutdown deadline.
        await withTaskGroup(of: Bool.self) { group in
            var running = 0
            for await push in pushes {
                guard let sender else {
                    logger.debug("no push sender configured; push dropped", metadata: ["call.id": "\(push.call)"])
                    continue
                }
                if running == concurrency {
                    _ = await group.next()
                    running -= 1
                }
                running += 1
                group.addTask { await send(push, with: sender); return false }
            }
            // The hub finished the queue: it is shutting down.
            guard running > 0 else { return }
            group.addTask { try? await Task.sleep(for: .seconds(5)); return true }
            while let deadlinePassed = await group.next(), !deadlinePassed {
                running -= 1
                if running == 0 { break }
            }
            group.cancelAll()
        }
    }

    private func send(_ push: Push, with sender: any PushSender) async {
        let device: Logger.MetadataValue = "\(push.user)/\(push.device)"
        let outcome = await sender.send(push)
        // Counted once handled (a rejected token forgotten), so the count says the work is done.
        defer { metrics.pushed(push, outcome) }
        switch outcome {
        case .delivered(let id):
            logger.info("push delivered", metadata: ["peer.device": device, "call.id": "\(push.call)", "apns.id": "\(id)",
                                                     "apns.push_type": "\(push.pushType)"])
        case .tokenInvalid(let reason, let since):
            do {
                if try await store.removePushToken(push.isVoIP ? .voip : .alert, user: push.user, device: push.device,
                                             token: push.registration.token, registeredBefore: since) {
                    metrics.pushTokensRemoved.increment()
                    logger.notice("APNs rejected a push token; forgot it", metadata: ["peer.device": device, "apns.reason": "\(reason)"])
                } else {
                    logger.notice("APNs rejected a push token the device has since replaced; kept the new one",
                                  metadata: ["peer.device": device, "apns.reason": "\(reason)"])
                }
            } catch {
                logger.error("could not forget a rejected VoIP token", metadata: ["peer.device": device, "error": "\(error)"])
            }
        case .failed(let reason):
            logger.warning("push failed", metadata: ["peer.device": device, "call.id": "\(push.call)", "error": "\(reason)"])
        }
    }
}
