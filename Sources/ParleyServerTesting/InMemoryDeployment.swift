import Foundation
import ParleyProtocol
import ParleyServer

/// Several nodes of one deployment in one process, without PostgreSQL: what `PostgresCluster` keeps
/// in the database and sends by `NOTIFY` — who holds which device, which node runs which call and
/// room, each node's mailbox, who is live — kept in memory under the same rules, so hub tests with
/// two nodes run in milliseconds beside the real-PostgreSQL ones.
///
/// Every node's hub uses `store`, which records the node that runs each call as the hub saves it
/// (the `owner_node` column), over one store the nodes share.
public final class InMemoryDeployment: @unchecked Sendable {
    private let lock = NSLock()
    private var mailboxes: [NodeID: AsyncStream<NodeMessage>.Continuation] = [:]
    private var departures: [NodeID: AsyncStream<NodeID>.Continuation] = [:]
    private var devices: [DeviceKey: NodeID] = [:]
    /// Unfinished calls' nodes and parties, as saved.
    private var calls: [CallID: (owner: NodeID?, users: Set<UserID>)] = [:]
    private var rooms: [RoomID: NodeID] = [:]
    private var joined = 0
    private var older: Set<NodeID> = []
    private var posted: [(from: NodeID, to: NodeID?, message: NodeMessage)] = []
    public let store: DeploymentStore

    public init(sharing store: any SignalingStore) {
        self.store = DeploymentStore(store)
        self.store.deployment = self
    }

    /// A new node: live from now, hearing what is sent to it from now. `olderBuild`: the others
    /// count it as a node of a build that may run requests sent unanswered out of order
    /// (`ClusterMailbox.runsUnansweredInOrder`), as during a rolling upgrade. The others know
    /// every other live node's build at once, where `PostgresCluster` learns it from the node's link
    /// or its notifications.
    public func join(olderBuild: Bool = false) -> Node {
        lock.withLock {
            joined += 1
            let node = Node(id: "m\(joined)", deployment: self)
            mailboxes[node.node] = node.inbox
            departures[node.node] = node.departed
            if olderBuild { older.insert(node.node) }
            return node
        }
    }

    fileprivate func runsUnansweredInOrder(_ node: NodeID) -> Bool {
        lock.withLock { live.contains(node) && !older.contains(node) }
    }

    private var live: Set<NodeID> { Set(mailboxes.keys) }

    /// Every message a node sent, in the order sent (`to`: nil for every node): what crosses nodes.
    public var sent: [(from: NodeID, to: NodeID?, message: NodeMessage)] { lock.withLock { posted } }

    fileprivate func post(_ message: NodeMessage, from sender: NodeID, to node: NodeID?) {
        // Through JSON, as `PostgresCluster` sends it: what does not survive the trip does not arrive.
        guard let sent = try? JSONDecoder().decode(NodeMessage.self, from: JSONEncoder().encode(message)) else {
            preconditionFailure("a node message that does not survive JSON: \(message)")
        }
        lock.withLock {
            posted.append((sender, node, sent))
            // Like one `NOTIFY` per live node: to every live node, the sender included, or to one.
            let targets = node.map { [$0] } ?? mailboxes.keys.sorted()
            for target in targets { mailboxes[target]?.yield(sent) }
        }
    }

    fileprivate func holds(_ key: DeviceKey, _ holding: Bool, node: NodeID) {
        lock.withLock {
            guard holding else {
                if devices[key] == node { devices[key] = nil }
                return
            }
            var told: Set<NodeID> = []
            if let previous = devices[key], previous != node, live.contains(previous) { told.insert(previous) }
            for (_, call) in calls where call.users.contains(key.user) {
                if let owner = call.owner, owner != node, live.contains(owner) { told.insert(owner) }
            }
            devices[key] = node
            for target in told.sorted() { mailboxes[target]?.yield(.claimed(key, by: node)) }
        }
    }

    fileprivate func remoteDevices(of user: UserID, from node: NodeID) -> [DeviceKey: NodeID] {
        lock.withLock { devices.filter { $0.key.user == user && $0.value != node && live.contains($0.value) } }
    }

    fileprivate func owner(of call: CallID) -> NodeID? {
        lock.withLock { calls[call]?.owner.flatMap { live.contains($0) ? $0 : nil } }
    }

    fileprivate func roomOwner(_ room: RoomID, claim: Bool, node: NodeID) -> NodeID? {
        lock.withLock {
            if let owner = rooms[room], live.contains(owner) { return owner }
            guard claim else { return nil }
            rooms[room] = node
            return node
        }
    }

    fileprivate func adopt(_ call: CallID?, by node: NodeID, unfinished: [StoredCall]) -> [StoredCall] {
        lock.withLock {
            var adopted: [StoredCall] = []
            for stored in unfinished where call == nil || stored.record.call == call {
                let id = stored.record.call
                if let owner = calls[id]?.owner, live.contains(owner) { continue }
                calls[id, default: (nil, [stored.record.caller, stored.record.callee])].owner = node
                adopted.append(stored.owned(by: node))
            }
            return adopted
        }
    }

    fileprivate func saved(_ stored: [StoredCall]) {
        lock.withLock {
            for call in stored {
                if call.record.endedAt != nil {
                    calls[call.record.call] = nil
                } else {
                    calls[call.record.call] = (call.owner, [call.record.caller, call.record.callee])
                }
            }
        }
    }

    /// A graceful stop: its calls and rooms handed back, the others told.
    fileprivate func leave(_ node: NodeID) {
        lock.withLock {
            for (id, call) in calls where call.owner == node { calls[id]?.owner = nil }
            rooms = rooms.filter { $0.value != node }
            devices = devices.filter { $0.value != node }
            mailboxes.removeValue(forKey: node)?.finish()
            departures.removeValue(forKey: node)?.finish()
            for target in mailboxes.keys.sorted() { mailboxes[target]?.yield(.left(node)) }
        }
    }

    /// A node that dies: the others notice it gone (as PostgreSQL drops its listening connection).
    public func crash(_ node: Node) {
        lock.withLock {
            mailboxes.removeValue(forKey: node.node)?.finish()
            departures.removeValue(forKey: node.node)?.finish()
            for other in departures.values { other.yield(node.node) }
        }
    }

    /// One node's link to the others.
    public final class Node: ClusterLink, @unchecked Sendable {
        public let node: NodeID
        public let messages: AsyncStream<NodeMessage>
        public let departures: AsyncStream<NodeID>
        fileprivate let inbox: AsyncStream<NodeMessage>.Continuation
        fileprivate let departed: AsyncStream<NodeID>.Continuation
        /// Held strongly: the nodes keep their deployment.
        private let deployment: InMemoryDeployment

        fileprivate init(id: NodeID, deployment: InMemoryDeployment) {
            node = id
            self.deployment = deployment
            (messages, inbox) = AsyncStream.makeStream()
            (departures, departed) = AsyncStream.makeStream()
        }

        public func send(_ message: NodeMessage, to node: NodeID?) { deployment.post(message, from: self.node, to: node) }
        public func runsUnansweredInOrder(_ node: NodeID) -> Bool { deployment.runsUnansweredInOrder(node) }
        public func holds(_ key: DeviceKey, _ holding: Bool) { deployment.holds(key, holding, node: node) }
        public func remoteDevices(of user: UserID) async throws -> [DeviceKey: NodeID] {
            deployment.remoteDevices(of: user, from: node)
        }
        public func owner(of call: CallID) async throws -> NodeID? { deployment.owner(of: call) }
        public func roomOwner(_ room: RoomID, claim: Bool) async throws -> NodeID? {
            deployment.roomOwner(room, claim: claim, node: node)
        }
        public func adopt(_ call: CallID?) async throws -> [StoredCall] {
            deployment.adopt(call, by: node, unfinished: try await deployment.store.unfinishedCalls())
        }

        /// Leaves the deployment, as `PostgresCluster.leave()` does.
        public func leave() { deployment.leave(node) }
    }

    /// The store every node's hub writes to: the shared store, and the deployment's record of which
    /// node runs each unfinished call.
    public final class DeploymentStore: SignalingStore, @unchecked Sendable {
        private let base: any SignalingStore
        fileprivate weak var deployment: InMemoryDeployment?

        fileprivate init(_ base: any SignalingStore) { self.base = base }

        public func upsertDevice(_ device: DeviceRecord) async throws { try await base.upsertDevice(device) }
        public func deleteDevice(user: UserID, device: DeviceID) async throws -> Bool { try await base.deleteDevice(user: user, device: device) }
        public func devices(of user: UserID) async throws -> [DeviceRecord] { try await base.devices(of: user) }
        public func removePushToken(_ kind: PushTokenKind, user: UserID, device: DeviceID, token: String,
                                    registeredBefore: Int64?) async throws -> Bool {
            try await base.removePushToken(kind, user: user, device: device, token: token, registeredBefore: registeredBefore)
        }
        public func saveCalls(_ calls: [StoredCall]) async throws {
            try await base.saveCalls(calls)
            deployment?.saved(calls)
        }
        public func call(_ id: CallID) async throws -> CallRecord? { try await base.call(id) }
        public func calls(of user: UserID, limit: Int) async throws -> [CallRecord] { try await base.calls(of: user, limit: limit) }
        public func unfinishedCalls() async throws -> [StoredCall] { try await base.unfinishedCalls() }
        public func deploymentSecret(_ name: String) async throws -> [UInt8] { try await base.deploymentSecret(name) }
        public func close() async { await base.close() }
    }
}
