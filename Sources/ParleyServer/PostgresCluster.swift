import Crypto
import Foundation
import Logging
import NIOCore
import NIOConcurrencyHelpers
import NIOSSL
import ParleyProtocol
import PostgresNIO
import ServiceLifecycle

/// Nodes on one PostgreSQL: messages by `NOTIFY`, devices and call owners in tables, and a node
/// live exactly while its listening connection is (PostgreSQL drops a killed process's connections
/// at once, so a node that dies is noticed within a second).
///
/// - Each node listens on `parley_<node>`; a message for every node is one statement notifying each
///   live node's channel. The listening connection carries the application name
///   `parley-node <node>`, which is what "live" means.
/// - A message is JSON; one over `NOTIFY`'s limit goes into `cluster_message` and the notification
///   carries its row (`@<id>`). One task sends everything a node sends, in order.
/// - `cluster_device` says which node holds which device; `call.owner_node`, which node runs a call;
///   `cluster_room`, which node runs a room; `cluster_node`, where a node takes direct links.
/// - With `NodeBus.direct`, messages go over `NodeLinks` (a WebSocket to each node sent to) instead
///   of `NOTIFY`, to every node that published an address; the rest as above. PostgreSQL then
///   carries none of the hot path's messages, only the directory.
public final class PostgresCluster: ClusterLink, Service {
    public let node: NodeID
    public let bus: NodeBus
    public let messages: AsyncStream<NodeMessage>
    public let departures: AsyncStream<NodeID>
    /// Reached once the node listens (the others count it live from then on), or failed with why it
    /// could not join; the server's start waits for it.
    let joined = Milestone()
    private let inbox: AsyncStream<NodeMessage>.Continuation
    private let departed: AsyncStream<NodeID>.Continuation
    private let outbox: Outbox
    private let store: PostgresStore
    private let logger: Logger
    /// The deployment's key for direct links (`NodeBus.direct`), read as the node joins; nil before,
    /// and on `NOTIFY` alone.
    private var linkKey: SymmetricKey? { linkKeyBox.withLockedValue { $0 } }
    private let linkKeyBox = NIOLockedValueBox<SymmetricKey?>(nil)
    /// Messages sent so far over direct links, and by `NOTIFY` (a broadcast counts once per node);
    /// `compact`: those of the direct ones that went as compact lines (`NodeLine`).
    public var sent: (direct: Int, notified: Int, compact: Int) { counts.withLockedValue { $0 } }
    private let metrics: ServerMetrics?
    private let counts = NIOLockedValueBox((direct: 0, notified: 0, compact: 0))
    /// Lines heard so far, by form: JSON (a row's too; with `NOTIFY`, news for every node, this
    /// one's own included), and compact.
    public var heard: (json: Int, compact: Int) { heardCounts.withLockedValue { $0 } }
    private let heardCounts = NIOLockedValueBox((json: 0, compact: 0))
    /// The version (`NodeLine.version`) each other node showed, as it linked here or in the number
    /// of a line it notified; 0 for one that linked without (a build before version 3), none for
    /// one that showed nothing. Forgotten when the node is gone (a line of its read just after
    /// may leave an entry behind: small, and never asked for, as node ids are never reused).
    private let shownVersions = NIOLockedValueBox<[NodeID: Int]>([:])
    /// Other nodes' links to this one, closed when it leaves.
    private let heardLinks = NIOLockedValueBox<(channels: [ObjectIdentifier: any Channel], left: Bool)>(([:], false))

    fileprivate enum Outgoing {
        case message(NodeMessage, to: NodeID?)
        case holds(DeviceKey, Bool)
        /// Leaving: this node's calls, rooms and devices are no longer its own.
        case release
    }

    /// `NOTIFY` takes payloads under 8000 bytes.
    static let inlineLimit = 7900
    private static let counter = NIOLockedValueBox<UInt64>(0)
    /// A line's number, `<count>v<version>@<node>`: a count that keeps the lines apart, then this
    /// build's version (`NodeLine.version`) and the node that sends the line, which is not always
    /// the one its message names (a frame handed on after its session moved names the call's
    /// node). Every build reads a line's message from after its first space.
    private static func number(from node: NodeID) -> String {
        let count = counter.withLockedValue { value in
            value += 1
            return value
        }
        return "\(count)v\(NodeLine.version)@\(node)"
    }

    /// The node that sent a numbered line and its version, when its number says (a build before
    /// version 3 numbers its lines with a count alone).
    static func shown(by numbered: Substring) -> (node: NodeID, version: Int)? {
        guard let space = numbered.utf8.firstIndex(of: UInt8(ascii: " ")) else { return nil }
        let number = numbered[..<space]
        guard let mark = number.firstIndex(of: "v"), let at = number.firstIndex(of: "@"), mark < at,
              let version = Int(number[number.index(after: mark)..<at]) else { return nil }
        let node = number[number.index(after: at)...]
        return node.isEmpty ? nil : (String(node), version)
    }
    static let applicationPrefix = "parley-node "
    /// Every live node: those with a listening connection, named after the node. Reading it copies
    /// every backend's activity, a tenth of a millisecond and more of the server's time however few
    /// rows are wanted: the watcher reads it once a second, and a hello's batch once (it joins it
    /// with many rows); the queries of a setup, and takeovers, use `live`.
    private static let liveNodes = """
        SELECT substr(application_name, \(applicationPrefix.count + 1)) FROM pg_stat_get_activity(NULL)
        WHERE application_name LIKE 'parley-node %'
        """
    /// What a node's advisory lock is keyed by: `hashtextextended` of its id with this seed ("node").
    static let lockSeed: Int64 = 0x6E6F_6465
    /// Whether the node named in `column` is live. A node holds a session lock keyed by its id on its
    /// listening connection, so the lock lives exactly as long as the connection `liveNodes` sees: a
    /// query that cannot take it shared knows the node lives from the lock table alone, and reads
    /// the activity only for a node that holds no lock (gone, or an older node that takes none).
    /// A gone node's lock is taken for the rest of the statement, which holds nothing from anyone.
    static func live(_ column: String) -> String {
        """
        (NOT pg_try_advisory_xact_lock_shared(hashtextextended(\(column), \(lockSeed))) OR \(column) IN (\(liveNodes)))
        """
    }

    /// A node of the deployment on the store's database, with a new id; it joins when it runs.
    /// What is sent before waits for it. With `.direct`, the node sends over direct links to the
    /// nodes that take them (once it has said where it takes them itself, `advertise`, the others
    /// link to it).
    public init(store: PostgresStore, bus: NodeBus = .direct, metrics: ServerMetrics? = nil, logger: Logger) {
        node = "n" + (0..<6).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
        self.store = store
        self.metrics = metrics
        self.bus = bus
        var logger = logger
        logger[metadataKey: "cluster.node"] = "\(node)"
        self.logger = logger
        (messages, inbox) = AsyncStream.makeStream()
        (departures, departed) = AsyncStream.makeStream()
        outbox = Outbox()
    }

    /// Joins the deployment (`joined`) and takes part in it until a graceful shutdown, then leaves:
    /// hands this node's unfinished calls and its rooms back (the others take them over at once),
    /// tells the others, and stops listening. Throws if it cannot join, or at once when it no longer
    /// hears the others (it has lost its listening connection, and they count it as gone and take
    /// its calls over): the server must then stop, and a supervisor start it again.
    public func run() async throws {
        let listener: PostgresConnection
        do {
            // A stop asked for meanwhile ends the join where it waits (not inside a query: postgres-nio's
            // do not end when cancelled).
            listener = try await cancelWhenGracefulShutdown { [self] in
                try await store.running()
                if bus == .direct {
                    let key = SymmetricKey(data: try await store.deploymentSecret("node-links"))
                    linkKeyBox.withLockedValue { $0 = key }
                }
                let listener = try await PostgresStore.connect(store.location, logger: logger, application: Self.applicationPrefix + node)
                do {
                    try await Self.lock(node, on: listener, logger: logger)
                } catch {
                    try? await listener.close()
                    throw error
                }
                return listener
            }
        } catch {
            finishStreams(nil)
            joined.fail(error)
            // Stopped before it joined: nothing to leave.
            if Task.isShuttingDownGracefully { return }
            throw error
        }
        // Listening before anything is sent, so no reply to this node is missed. One channel, one
        // reader: what a node sends arrives in the order it was sent. The listener and the sender
        // are tasks of this run's, not children: a query postgres-nio has sent does not end when
        // cancelled, and a database that stops answering must not hold the node's stop (each gets
        // 5 s, then is left behind).
        let listening = Milestone()
        let deaf = AsyncStream<String>.makeStream()
        let hearing = Task { [store, logger, departed] in
            await withDiscardingTaskGroup { group in
                group.addTask { await self.listen(on: listener, ready: listening, deaf: deaf.continuation) }
                // Nodes coming and going are watched once this one hears them.
                guard (try? await listening.wait()) != nil else { return }
                group.addTask { [shownVersions] in
                    await Self.watch(store: store, logger: logger) { node in
                        shownVersions.withLockedValue { $0[node] = nil }
                        departed.yield(node)
                    }
                }
            }
        }
        do {
            try await cancelWhenGracefulShutdown { try await listening.wait() }
        } catch {
            hearing.cancel()
            try? await listener.close()
            await Self.awaitEnd(of: hearing, within: .seconds(5))
            finishStreams(deaf.continuation)
            joined.fail(error)
            if Task.isShuttingDownGracefully { return }
            throw error
        }
        let sender = Task { [store, logger, node, inbox, outbox, linkKey, counts] in
            let links = linkKey.map { NodeLinks(node: node, key: $0, logger: logger) }
            let writer = Writer(node: node, links: links, local: inbox, counts: counts, store: store, logger: logger)
            await Self.send(outbox, writer: writer, logger: logger)
            links?.close()
        }
        logger.notice("joined the cluster", metadata: ["cluster.bus": "\(bus)"])
        joined.reach()
        // Until a graceful shutdown (the hub has stopped), or until the node is deaf.
        let lost = await withTaskGroup(of: String?.self) { race in
            race.addTask { try? await gracefulShutdown(); return nil }
            race.addTask { for await reason in deaf.stream { return reason }; return nil }
            let first = await race.next() ?? nil
            race.cancelAll()
            return first
        }
        if lost == nil {
            // Leaving: what was sent, then its calls and rooms handed back, then the news.
            outbox.add(.release)
            outbox.add(.message(.left(node), to: nil))
            outbox.close()
            await Self.awaitEnd(of: sender, within: .seconds(5))
        } else {
            // Deaf, it is gone for the others already (they take its calls over): it stops at once,
            // for its clients to go elsewhere.
            outbox.close()
            sender.cancel()
        }
        // What other nodes still send here is for a node that has left.
        for channel in heardLinks.withLockedValue({ state in
            state.left = true
            defer { state.channels = [:] }
            return Array(state.channels.values)
        }) { channel.close(promise: nil) }
        hearing.cancel()
        try? await listener.close()
        await Self.awaitEnd(of: hearing, within: .seconds(5))
        finishStreams(deaf.continuation)
        if let lost { throw StoreError("lost the cluster's listening connection: \(lost)") }
    }

    private func finishStreams(_ deaf: AsyncStream<String>.Continuation?) {
        inbox.finish()
        departed.finish()
        deaf?.finish()
    }

    /// Waits for `task` to end, cancelling it if it has not ended within `limit`.
    private static func awaitEnd(of task: Task<Void, Never>, within limit: Duration) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await task.value }
            group.addTask { if (try? await Task.sleep(for: limit)) != nil { task.cancel() } }
            await group.next()
            group.cancelAll()
        }
    }

    /// Takes the node's lock (`live`) on its listening connection, for as long as the connection lives.
    static func lock(_ node: NodeID, on listener: PostgresConnection, logger: Logger) async throws {
        let rows = try await listener.query("SELECT pg_try_advisory_lock(hashtextextended(\(node), \(lockSeed)))", logger: logger)
        for try await locked in rows.decode(Bool.self) where !locked {
            throw StoreError("another connection holds node \(node)'s lock")
        }
    }

    /// Hears what is sent to this node on its channel, until the listening connection ends. Says
    /// `ready` once it listens; and, unless cancelled (the node leaving), says the node is `deaf` when
    /// the connection ends.
    private func listen(on listener: PostgresConnection, ready: Milestone, deaf: AsyncStream<String>.Continuation) async {
        var heard = false
        do {
            try await listener.listen(on: "parley_\(node)") { notifications in
                heard = true
                ready.reach()
                for try await notification in notifications {
                    guard let message = await Self.decode(notification.payload[...], store: store, logger: logger, heard: heardCounts) else { continue }
                    if let (sender, version) = Self.shown(by: notification.payload[...]) {
                        shownVersions.withLockedValue { $0[sender] = version }
                    }
                    inbox.yield(message)
                }
            }
            // Ended without an error (the connection closed): deaf all the same.
            ready.fail(StoreError("the listening connection closed"))
            if heard, !Task.isCancelled {
                logger.critical("the cluster's listening connection closed; this node no longer hears the others and stops")
                deaf.yield("the listening connection closed")
            }
        } catch {
            ready.fail(error)
            if heard, !Task.isCancelled {
                logger.critical("lost the cluster's listening connection; this node no longer hears the others and stops",
                                metadata: ["error": "\(PostgresStore.explain(error))"])
                deaf.yield(PostgresStore.explain(error))
            }
        }
    }

    // MARK: ClusterLink

    public func send(_ message: NodeMessage, to node: NodeID?) {
        metrics?.sentToNode(message)
        outbox.add(.message(message, to: node))
    }

    /// Known of a node from the way the calls it runs send their frames here: its link showed its
    /// version as it linked, a notification in its line's number. A node that has sent nothing here
    /// yet is sent every request for an answer.
    public func runsUnansweredInOrder(_ node: NodeID) -> Bool {
        shownVersions.withLockedValue { $0[node] ?? 0 } >= NodeLine.unansweredSince
    }

    public func holds(_ key: DeviceKey, _ holding: Bool) {
        outbox.add(.holds(key, holding))
    }

    // MARK: Direct links

    /// Publishes where the other nodes link to this one (`host:port` of its listening socket), once
    /// it listens and before it says so: the nodes that send here from then on find the address
    /// (one that finds none sends by `NOTIFY` and looks again a second later). With
    /// `NodeBus.postgres` it publishes nothing and is sent to by `NOTIFY`.
    public func advertise(_ address: String) async {
        guard linkKey != nil else { return }
        do {
            try await store.client.query("""
                INSERT INTO cluster_node (node_id, address, lines) VALUES (\(node), \(address), \(Int16(NodeLine.version)))
                ON CONFLICT (node_id) DO UPDATE SET address = excluded.address, lines = excluded.lines
                """, logger: logger)
            logger.notice("takes direct links from the other nodes", metadata: ["cluster.address": "\(address)"])
        } catch {
            logger.error("could not publish where the other nodes link to this one; they send here by NOTIFY",
                         metadata: ["error": "\(PostgresStore.explain(error))"])
        }
    }

    /// The node a link to this one comes from, when it shows the deployment's key for the pair and
    /// its time (`NodeLinks.linkingNode`); nil for anyone else.
    func linkingNode(header: String, authorization: String) -> NodeID? {
        guard let linkKey else { return nil }
        return NodeLinks.linkingNode(header: header, to: node, authorization: authorization,
                                     now: Int64(Date().timeIntervalSince1970), key: linkKey)
    }

    /// Hears another node's link until it closes, or until this node leaves (which closes it).
    /// `frames` are the link's text frames (lines, as `NOTIFY` carries them). A frame's messages go
    /// to the hub as the frame is read, on the reading task: no task between the socket and the hub.
    /// Only a frame with a line kept in the database (`@row`) is handed to a task beside, which reads
    /// the row meanwhile, so that the link is still read (a link whose frames are not read does not
    /// answer its node's pings either); the frames read while it has any follow it there, so that
    /// the messages keep their order.
    /// `version`: the `NodeLine.version` the link showed (nil: a build before version 3, which
    /// showed none).
    func hear(link channel: any Channel, from other: NodeID, version: Int?,
              frames: some AsyncSequence<String, any Error>) async {
        let id = ObjectIdentifier(channel)
        guard heardLinks.withLockedValue({ state in
            if !state.left { state.channels[id] = channel }
            return !state.left
        }) else { return }
        defer { _ = heardLinks.withLockedValue { $0.channels.removeValue(forKey: id) } }
        shownVersions.withLockedValue { $0[other] = version ?? 0 }
        logger.debug("a node linked to this one", metadata: ["cluster.peer": "\(other)", "cluster.peer_version": "\(version ?? 0)"])
        let (besides, beside) = AsyncStream<String>.makeStream()
        // Frames handed to the task beside and not yet heard: the reading task hears a frame itself
        // only when there are none.
        let handed = NIOLockedValueBox(0)
        await withDiscardingTaskGroup { group in
            group.addTask { [store, logger, inbox, heardCounts] in
                for await frame in besides {
                    for line in Self.lines(of: frame) {
                        if let message = await Self.decode(line, store: store, logger: logger, heard: heardCounts) { inbox.yield(message) }
                    }
                    handed.withLockedValue { $0 -= 1 }
                }
            }
            do {
                for try await frame in frames {
                    let lines = Self.lines(of: frame)
                    if handed.withLockedValue({ $0 }) == 0, !lines.contains(where: Self.isStored) {
                        for line in lines {
                            if let message = Self.read(Self.payload(of: line), logger: logger, heard: heardCounts) { inbox.yield(message) }
                        }
                    } else {
                        handed.withLockedValue { $0 += 1 }
                        beside.yield(frame)
                    }
                }
            } catch {
                logger.debug("a node's link failed", metadata: ["cluster.peer": "\(other)", "error": "\(error)"])
            }
            beside.finish()
        }
        logger.debug("a node's link ended", metadata: ["cluster.peer": "\(other)"])
    }

    /// A frame's lines (by bytes: "\r\n" is one Character, and a line must end at every newline).
    private static func lines(of frame: String) -> [Substring] {
        frame.utf8.split(separator: UInt8(ascii: "\n")).map { Substring($0) }
    }

    /// Where a user's devices are, on live nodes other than this one (every invite asks).
    enum RemoteDevices: PreparedSQL {
        static let sql = """
            SELECT device_id, node_id FROM cluster_device
            WHERE user_id = $1 AND node_id <> $2 AND \(live("node_id"))
            """
    }

    public func remoteDevices(of user: UserID) async throws -> [DeviceKey: NodeID] {
        var devices: [DeviceKey: NodeID] = [:]
        let rows = try await store.client.execute(Prepared<RemoteDevices>([user.rawValue, node]), logger: logger)
        for try await row in rows {
            let (device, node) = try row.decode((String, String).self)
            guard let device = DeviceID(rawValue: device) else { continue }
            devices[DeviceKey(user: user, device: device)] = node
        }
        return devices
    }

    /// A new call's claim, in one statement: the call's row goes in unless its id is taken (then a
    /// row `taken` says so), and with it come a row `held` for each device of the callee's on another
    /// live node and a row `device` for each of the callee's devices in the store (its columns, and
    /// their order, as `PostgresStore.UserDevices` reads them). As separate statements the insert and
    /// the reads cost PostgreSQL a wake-up, an executor start and a commit each, which was most of
    /// what it spent on a call setup; and the id is claimed atomically (a concurrent insert of it
    /// is waited for, and then finds it taken).
    enum ClaimCall: PreparedSQL {
        static let sql = """
            WITH claimed AS (
              INSERT INTO call (call_id, caller, callee, caller_device, callee_device, audio, video, created_at, answered_at,
                                ended_at, reason, duration, quality, recordings, expires_at, caller_name, metadata, owner_node)
              VALUES ($3, $4, $1, $5, $6::TEXT, $7, $8, $9, $10::BIGINT, $11::BIGINT, $12::TEXT, $13::DOUBLE PRECISION,
                      $14::TEXT::JSONB, $15::TEXT::JSONB, $16, $17::TEXT, $18::TEXT::JSONB, $19::TEXT)
              ON CONFLICT (call_id) DO NOTHING
              RETURNING call_id)
            SELECT 'taken' AS kind, NULL::TEXT AS device_id, NULL::TEXT AS node_id, NULL::TEXT AS platform,
                   NULL::TEXT AS voip_token, NULL::TEXT AS voip_topic, NULL::TEXT AS voip_environment,
                   NULL::TEXT AS alert_token, NULL::TEXT AS alert_topic, NULL::TEXT AS alert_environment, 0::BIGINT AS updated_at
              WHERE NOT EXISTS (SELECT FROM claimed)
            UNION ALL
            SELECT 'held', device_id, node_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0 FROM cluster_device
              WHERE user_id = $1 AND node_id <> $2 AND \(live("node_id"))
            UNION ALL
            SELECT 'device', device_id, NULL, platform, voip_token, voip_topic, voip_environment,
                   alert_token, alert_topic, alert_environment, updated_at
              FROM device WHERE user_id = $1
            ORDER BY kind, device_id
            """
    }

    public func claim(_ call: StoredCall, store: any SignalingStore) async throws -> InviteClaim {
        // A store on another database than this cluster's is claimed in as any directory claims in it.
        guard store as? PostgresStore === self.store else {
            return try await InviteClaim.stepByStep(call, store: store, directory: self)
        }
        let record = call.record
        let json = try StoredCall.jsonColumns(of: [call])[0]
        let values: [(any PostgresDynamicTypeEncodable)?] = [
            record.callee.rawValue, node, record.call.rawValue, record.caller.rawValue, record.callerDevice.rawValue,
            record.calleeDevice?.rawValue, record.media.audio, record.media.video, record.createdAt, record.answeredAt,
            record.endedAt, record.reason?.rawValue, record.duration, json.quality, json.recordings, call.expiresAt,
            call.callerName, json.metadata, call.owner,
        ]
        var claim = InviteClaim(taken: false, held: [:], devices: [])
        for try await row in try await self.store.client.execute(Prepared<ClaimCall>(values), logger: logger) {
            let (kind, device, node, platform, voipToken, voipTopic, voipEnvironment, alertToken, alertTopic, alertEnvironment, updatedAt)
                = try row.decode((String, String?, String?, String?, String?, String?, String?, String?, String?, String?, Int64).self)
            switch kind {
            case "taken":
                claim.taken = true
            case "held":
                guard let device = device.flatMap(DeviceID.init(rawValue:)), let node else { continue }
                claim.held[DeviceKey(user: record.callee, device: device)] = node
            default:
                guard let device, let platform,
                      let stored = PostgresStore.deviceRecord((record.callee.rawValue, device, platform, voipToken, voipTopic,
                                                               voipEnvironment, alertToken, alertTopic, alertEnvironment, updatedAt))
                else { continue }
                claim.devices.append(stored)
            }
        }
        return claim
    }

    /// The live node that runs an unfinished call (a request about a call this node does not run asks).
    enum CallOwner: PreparedSQL {
        static let sql = """
            SELECT owner_node FROM call WHERE call_id = $1 AND ended_at IS NULL AND \(live("owner_node"))
            """
    }

    public func owner(of call: CallID) async throws -> NodeID? {
        for try await row in try await store.client.execute(Prepared<CallOwner>([call.rawValue]), logger: logger) {
            return try row.decode(String.self)
        }
        return nil
    }

    public func roomOwner(_ room: RoomID, claim: Bool) async throws -> NodeID? {
        if claim {
            let claimed = try await store.client.query("""
                INSERT INTO cluster_room (room_id, node_id) VALUES (\(room.rawValue), \(node))
                ON CONFLICT (room_id) DO UPDATE SET node_id = excluded.node_id
                  WHERE NOT \(unescaped: Self.live("cluster_room.node_id"))
                RETURNING node_id
                """, logger: logger)
            for try await owner in claimed.decode(String.self) { return owner }
        }
        let rows = try await store.client.query("""
            SELECT node_id FROM cluster_room WHERE room_id = \(room.rawValue) AND \(unescaped: Self.live("node_id"))
            """, logger: logger)
        for try await owner in rows.decode(String.self) { return owner }
        return nil
    }

    public func adopt(_ call: CallID?) async throws -> [StoredCall] {
        // Read committed: a second node's update waits for the first's and then sees a live owner.
        let adopted = try await store.storedCalls("""
            UPDATE call SET owner_node = \(node)
            WHERE ended_at IS NULL AND (\(call?.rawValue)::TEXT IS NULL OR call_id = \(call?.rawValue))
              AND (owner_node IS NULL OR NOT \(unescaped: Self.live("owner_node")))
            RETURNING \(unescaped: PostgresStore.callColumns)
            """)
        if !adopted.isEmpty {
            logger.notice("took over calls whose node is gone", metadata: ["calls.count": "\(adopted.count)"])
        }
        return adopted
    }

    // MARK: Sending, listening, watching

    /// Writes what the node sends, in order, in batches: whatever has gathered while the last batch
    /// was written goes in a few statements (a thousand devices saying hello after a node died are a
    /// handful of round trips, not two thousand), and its messages in one frame per node linked.
    private static func send(_ outbox: Outbox, writer: Writer, logger: Logger) async {
        for await _ in outbox.wakes {
            while !Task.isCancelled {
                let batch = outbox.take()
                if batch.isEmpty { break }
                for run in Outbox.runs(of: batch) {
                    do {
                        try await writer.write(run)
                    } catch {
                        logger.error("could not reach the other nodes", metadata: ["error": "\(PostgresStore.explain(error))",
                                                                                   "cluster.items": "\(run.count)"])
                    }
                }
            }
        }
    }

    /// Writes runs of what the node sends; the sending task's own.
    private final class Writer {
        let node: NodeID
        let links: NodeLinks?
        /// This node's own inbox, for what it sends to every node when its links carry it.
        let local: AsyncStream<NodeMessage>.Continuation
        let counts: NIOLockedValueBox<(direct: Int, notified: Int, compact: Int)>
        let store: PostgresStore
        let logger: Logger
        let encoder = JSONEncoder()

        init(node: NodeID, links: NodeLinks?, local: AsyncStream<NodeMessage>.Continuation,
             counts: NIOLockedValueBox<(direct: Int, notified: Int, compact: Int)>, store: PostgresStore, logger: Logger) {
            self.node = node
            self.links = links
            self.local = local
            self.counts = counts
            self.store = store
            self.logger = logger
        }

        /// One run of items of one kind, in one statement (a few more for messages too big to notify).
        func write(_ run: [Outgoing]) async throws {
            switch run.first {
            case .holds(_, true)?:
                try await claim(run)
            case .holds(_, false)?:
                let keys = run.compactMap { if case .holds(let key, _) = $0 { key } else { nil } }
                try await store.client.query("""
                    DELETE FROM cluster_device USING unnest(\(keys.map(\.user.rawValue))::TEXT[], \(keys.map(\.device.rawValue))::TEXT[]) AS t(u, d)
                    WHERE user_id = t.u AND device_id = t.d AND node_id = \(node)
                    """, logger: logger)
            case .release?:
                try await store.client.query("UPDATE call SET owner_node = NULL WHERE owner_node = \(node) AND ended_at IS NULL",
                                             logger: logger)
                try await store.client.query("DELETE FROM cluster_room WHERE node_id = \(node)", logger: logger)
                try await store.client.query("DELETE FROM cluster_device WHERE node_id = \(node)", logger: logger)
                try await store.client.query("DELETE FROM cluster_node WHERE node_id = \(node)", logger: logger)
            case .message?:
                try await send(run.compactMap { if case .message(let message, let to) = $0 { (message, to) } else { nil } })
            case nil:
                return
            }
        }

        private func claim(_ run: [Outgoing]) async throws {
            // The last word on each device (one statement may not update a row twice).
            var latest: [DeviceKey: Int] = [:]
            for case (let index, .holds(let key, _)) in run.enumerated() { latest[key] = index }
            let keys = latest.sorted { $0.value < $1.value }.map(\.key)
            let users = keys.map(\.user.rawValue), devices = keys.map(\.device.rawValue)
            // Who is told: the live node that held the device before (it lets its session go), and the
            // nodes running calls of its user (they deliver to it here from now on, and ring it if the
            // call rings). Nobody else: a hello is not news for every node of a deployment.
            var told: [(DeviceKey, NodeID)] = []
            let moved = try await store.client.query("""
                WITH previous AS (
                  SELECT c.user_id, c.device_id, c.node_id FROM cluster_device c
                  JOIN unnest(\(users)::TEXT[], \(devices)::TEXT[]) AS t(u, d) ON c.user_id = t.u AND c.device_id = t.d
                  WHERE c.node_id <> \(node) AND c.node_id IN (\(unescaped: liveNodes))),
                claimed AS (
                  INSERT INTO cluster_device (user_id, device_id, node_id)
                  SELECT u, d, \(node) FROM unnest(\(users)::TEXT[], \(devices)::TEXT[]) AS t(u, d)
                  ON CONFLICT (user_id, device_id) DO UPDATE SET node_id = excluded.node_id)
                SELECT user_id, device_id, node_id FROM previous
                """, logger: logger)
            for try await (user, device, holder) in moved.decode((String, String, String).self) {
                if let user = UserID(rawValue: user), let device = DeviceID(rawValue: device) { told.append((DeviceKey(user: user, device: device), holder)) }
            }
            let calling = try await store.client.query("""
                SELECT DISTINCT t.u, c.owner_node FROM call c JOIN unnest(\(Array(Set(users)))::TEXT[]) AS t(u)
                  ON c.callee = t.u OR c.caller = t.u
                WHERE c.ended_at IS NULL AND c.owner_node <> \(node) AND c.owner_node IN (\(unescaped: liveNodes))
                """, logger: logger)
            for try await (user, owner) in calling.decode((String, String).self) {
                for key in keys where key.user.rawValue == user { told.append((key, owner)) }
            }
            if !told.isEmpty { try await send(told.map { (.claimed($0.0, by: node), $0.1) }) }
        }

        /// A message too large to travel itself, as a row of `cluster_message`: `@` and the row's id.
        private func stored(_ payload: String) async throws -> String {
            let rows = try await store.client.query("INSERT INTO cluster_message (payload) VALUES (\(payload)) RETURNING id", logger: logger)
            for try await id in rows.decode(Int64.self) { return "@\(id)" }
            throw PostgresClusterError.messageNotStored
        }

        /// The longest compact line whose JSON is made only when needed: JSON escapes a line's
        /// quotes, backslashes and slashes into two bytes each (it holds no control character), so
        /// its JSON fits a frame.
        static let lazyLimit = (NodeLinks.frameLimit - 1024) / 2

        /// Messages, each to its node or to every live node (this one too: it ignores its own news),
        /// in the order sent: over the direct links where they reach (compact where the node reads
        /// it, `NodeLine`), by `NOTIFY` elsewhere (JSON; too large for a notification, by its row).
        private func send(_ messages: [(NodeMessage, to: NodeID?)]) async throws {
            // Numbered: PostgreSQL delivers identical notifications of one transaction only once.
            var lines: [(to: NodeID?, line: NodeLinks.JSONLine, compact: String?)] = []
            for (message, to) in messages {
                let number = PostgresCluster.number(from: node)
                if links != nil, let compact = NodeLine.compact(message), compact.utf8.count <= Self.lazyLimit {
                    // Its JSON only if a node needs it: within a frame, as JSON at most doubles a line.
                    let json = NodeLinks.JSONLine { [encoder] in
                        // Parley's own values, whose every number is finite: encoding cannot fail.
                        "\(number) " + String(decoding: try! encoder.encode(message), as: UTF8.self)
                    }
                    lines.append((to, json, "\(number) \(compact)"))
                    continue
                }
                var json = String(decoding: try encoder.encode(message), as: UTF8.self)
                var compact = NodeLine.compact(message)
                if json.utf8.count > NodeLinks.frameLimit - 32 {
                    // Larger than a link's frame: it travels by its row whichever way it goes.
                    json = try await stored(json)
                    compact = nil
                }
                lines.append((to, NodeLinks.JSONLine("\(number) \(json)"),
                              compact.flatMap { $0.utf8.count > NodeLinks.frameLimit - 32 ? nil : "\(number) \($0)" }))
            }
            var notified: [(to: NodeID?, line: String)]
            if let links {
                var everyNode: [NodeID] = []
                if lines.contains(where: { $0.to == nil }) {
                    for try await live in try await store.client.query(PostgresQuery(unsafeSQL: liveNodes), logger: logger).decode(String.self) {
                        everyNode.append(live)
                    }
                }
                var direct: [NodeLinks.Line] = []
                for (index, (to, line, compact)) in lines.enumerated() {
                    if let to {
                        direct.append(NodeLinks.Line(to: to, json: line, compact: compact, broadcast: false))
                    } else {
                        direct += everyNode.filter { $0 != node }.map { NodeLinks.Line(to: $0, json: line, compact: compact, broadcast: true) }
                        local.yield(messages[index].0)
                    }
                }
                let (undelivered, compact) = await links.send(direct) { [store, logger] nodes in
                    var found: [NodeID: NodeLinks.Published] = [:]
                    let rows = try await store.client.query(
                        "SELECT node_id, address, lines FROM cluster_node WHERE node_id = ANY(\(nodes)::TEXT[])", logger: logger)
                    for try await (node, address, lines) in rows.decode((String, String, Int16).self) {
                        found[node] = NodeLinks.Published(address: address, version: Int(lines))
                    }
                    return found
                }
                notified = undelivered.map { (Optional($0.to), $0.line) }
                counts.withLockedValue {
                    $0.direct += direct.count - notified.count
                    $0.compact += compact
                }
            } else {
                notified = lines.map { (to: $0.to, line: $0.line.line) }
            }
            guard !notified.isEmpty else { return }
            counts.withLockedValue { $0.notified += notified.count }
            for index in notified.indices where notified[index].line.utf8.count > inlineLimit {
                let line = notified[index].line
                let space = line.firstIndex(of: " ") ?? line.startIndex
                notified[index].line = "\(line[..<space]) \(try await stored(String(line[line.index(after: space)...])))"
            }
            // Each to its node, or to every live node, in the order sent: the subquery's order is the
            // order the notifications are made in.
            try await store.client.query("""
                SELECT pg_notify(channel, payload) FROM (
                  SELECT 'parley_' || live.node AS channel, t.payload
                  FROM unnest(\(notified.map { $0.to ?? "" })::TEXT[], \(notified.map(\.line))::TEXT[]) WITH ORDINALITY AS t(target, payload, i)
                  JOIN (\(unescaped: liveNodes)) AS live(node) ON t.target = '' OR t.target = live.node
                  ORDER BY t.i) AS ordered
                """, logger: logger)
        }
    }

    /// A numbered line's message: `<number> <payload>`.
    private static func payload(of numbered: Substring) -> Substring {
        numbered.utf8.firstIndex(of: UInt8(ascii: " ")).map { numbered[numbered.utf8.index(after: $0)...] } ?? numbered
    }

    /// Whether a line's message is kept in the database (`@row`), to be read from there.
    private static func isStored(_ numbered: Substring) -> Bool { payload(of: numbered).utf8.first == UInt8(ascii: "@") }

    /// A line's message, read from the database if it is kept there (`@row`).
    private static func decode(_ numbered: Substring, store: PostgresStore, logger: Logger,
                               heard: NIOLockedValueBox<(json: Int, compact: Int)>) async -> NodeMessage? {
        let payload = payload(of: numbered)
        guard payload.utf8.first == UInt8(ascii: "@") else { return read(payload, logger: logger, heard: heard) }
        guard let id = Int64(payload.dropFirst()) else {
            logger.error("a node sent a line this one cannot read", metadata: ["line.start": "\(payload.prefix(40))"])
            return nil
        }
        do {
            let rows = try await store.client.query("SELECT payload FROM cluster_message WHERE id = \(id)", logger: logger)
            for try await text in rows.decode(String.self) { return read(Substring(text), logger: logger, heard: heard) }
            logger.error("a node's message was not found", metadata: ["cluster.row": "\(id)"])
        } catch {
            logger.error("could not read a node's message", metadata: ["error": "\(PostgresStore.explain(error))"])
        }
        return nil
    }

    /// A message as a line carries it: JSON, or compact (`NodeLine`).
    private static func read(_ payload: Substring, logger: Logger, heard: NIOLockedValueBox<(json: Int, compact: Int)>) -> NodeMessage? {
        let compact = payload.utf8.first.map { $0 != UInt8(ascii: "{") } ?? false
        heard.withLockedValue { if compact { $0.compact += 1 } else { $0.json += 1 } }
        if compact {
            guard let message = NodeLine.parse(payload) else {
                logger.error("a node sent a line this one cannot read", metadata: ["line.start": "\(payload.prefix(40))"])
                return nil
            }
            return message
        }
        do {
            return try JSONDecoder().decode(NodeMessage.self, from: Data(payload.utf8))
        } catch {
            logger.error("a node sent what this one cannot read", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// Once a second: which nodes are live, and whoever is no longer; now and then, the rows that
    /// gone nodes and old messages left.
    private static func watch(store: PostgresStore, logger: Logger, departed: (NodeID) -> Void) async {
        var live: Set<NodeID> = []
        var round = 0
        while !Task.isCancelled {
            do {
                var now: Set<NodeID> = []
                for try await node in try await store.client.query(PostgresQuery(unsafeSQL: liveNodes), logger: logger).decode(String.self) {
                    now.insert(node)
                }
                for node in live.subtracting(now).sorted() {
                    logger.notice("a node left the cluster", metadata: ["cluster.departed": "\(node)"])
                    departed(node)
                }
                live = now
                if round % 60 == 0 {
                    try await store.client.query("DELETE FROM cluster_device WHERE node_id NOT IN (\(unescaped: liveNodes))", logger: logger)
                    try await store.client.query("DELETE FROM cluster_room WHERE node_id NOT IN (\(unescaped: liveNodes))", logger: logger)
                    try await store.client.query("DELETE FROM cluster_node WHERE node_id NOT IN (\(unescaped: liveNodes))", logger: logger)
                    try await store.client.query("DELETE FROM cluster_message WHERE created_at < now() - INTERVAL '5 minutes'", logger: logger)
                }
                round += 1
            } catch {
                if !Task.isCancelled { logger.error("could not see the other nodes", metadata: ["error": "\(PostgresStore.explain(error))"]) }
            }
            try? await Task.sleep(for: .seconds(1))
        }
    }
}

/// What a node has to send, gathered between the sender's batches.
private final class Outbox: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [PostgresCluster.Outgoing] = []
    private var closed = false
    let wakes: AsyncStream<Void>
    private let wake: AsyncStream<Void>.Continuation

    init() {
        (wakes, wake) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    func add(_ item: PostgresCluster.Outgoing) {
        let open = lock.withLock {
            if !closed { items.append(item) }
            return !closed
        }
        if open { wake.yield() }
    }

    func take() -> [PostgresCluster.Outgoing] {
        lock.withLock {
            defer { items = [] }
            return items
        }
    }

    /// Nothing more is taken; what is queued is still sent.
    func close() {
        lock.withLock { closed = true }
        wake.yield()
        wake.finish()
    }

    /// Consecutive items of one kind, at most a thousand each, in order.
    static func runs(of batch: [PostgresCluster.Outgoing]) -> [[PostgresCluster.Outgoing]] {
        func kind(_ item: PostgresCluster.Outgoing) -> Int {
            switch item {
            case .holds(_, true): 0
            case .holds(_, false): 1
            case .message: 2
            case .release: 3
            }
        }
        var runs: [[PostgresCluster.Outgoing]] = []
        for item in batch {
            if let last = runs.last?.last, kind(last) == kind(item), kind(item) != 3, runs[runs.count - 1].count < 1000 {
                runs[runs.count - 1].append(item)
            } else {
                runs.append([item])
            }
        }
        return runs
    }
}

enum PostgresClusterError: Error, CustomStringConvertible {
    /// `INSERT … RETURNING id` answered no row.
    case messageNotStored

    var description: String { "a message too large to send could not be stored for the other nodes" }
}
