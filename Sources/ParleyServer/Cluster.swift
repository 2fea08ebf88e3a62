import ParleyProtocol

/// A node of a deployment: a random id for each server process.
public typealias NodeID = String

/// What one node tells another (docs/protocol.md, "Restarts and several nodes").
///
/// Every call belongs to one node, the one its invite reached (or the one that took it over from a
/// node that stopped); that node runs the call's state machine, so the first accept wins there. The
/// other nodes forward requests about the call to it and deliver what it sends to their devices.
/// Rooms likewise: a room runs on the node where it was first joined.
public enum NodeMessage: Sendable, Equatable, Codable {
    /// A frame for a device held by the node addressed (`frame`: a server frame without `seq`; the
    /// holding session numbers it), from the node that runs its call. `about` says what the frame
    /// is, so the holder numbers and sends it without decoding it (absent from older nodes).
    case deliver(to: DeviceKey, frame: String, from: NodeID, about: DeliveredFrame? = nil)
    /// A device's request about a call or room the addressed node runs (`frame`: the client's frame).
    /// `id` is what its `reply` carries back, or `unanswered` (0): the sending node acknowledged it
    /// itself, and wants no reply (a node that answers one anyway is ignored).
    case request(id: UInt64, from: NodeID, sender: DeviceKey, frame: String)
    /// The owner's answer to a forwarded request: the `ack`'s result, or the error.
    case reply(id: UInt64, result: AckResult?, error: ErrorMessage?)
    /// A device said hello on the node that sends this: the node that held a session for it lets it
    /// go (without ending its calls), and owners of calls ringing its user ring it too.
    case claimed(DeviceKey, by: NodeID)
    /// A device's session on the sending node expired: its calls end with `connection-lost`.
    case released(DeviceKey, by: NodeID)
    /// The sending node is leaving (a graceful stop) and has handed its calls and rooms back.
    case left(NodeID)
    /// A device asks the sending node to resume `session`, which the addressed node holds (a load
    /// balancer sent its reconnect elsewhere): the holder hands the session over and lets it go,
    /// without ending its calls, and sends on to the new node what comes for the device afterwards.
    case handover(id: UInt64, key: DeviceKey, session: String, from: NodeID)
    /// The answer to `handover`: the session, or nil when the node no longer holds it.
    case handedOver(id: UInt64, session: SessionHandover?)

    /// The id of a `request` that wants no `reply`.
    static let unanswered: UInt64 = 0

    /// What the message is, for metrics: `deliver`, `request`, `request_unanswered`, `reply`, `news`
    /// (`claimed`, `released`, `left`) or `handover` (either way).
    var kind: String {
        switch self {
        case .deliver: "deliver"
        case .request(let id, _, _, _): id == Self.unanswered ? "request_unanswered" : "request"
        case .reply: "reply"
        case .claimed, .released, .left: "news"
        case .handover, .handedOver: "handover"
        }
    }

    static let kinds = ["deliver", "request", "request_unanswered", "reply", "news", "handover"]
}

/// What a node needs to know of a frame it delivers for another: the message's type and the call
/// it is about.
public struct DeliveredFrame: Sendable, Equatable, Codable {
    public var type: String
    public var call: CallID?

    init(_ message: ServerMessage) {
        type = message.type
        call = message.aboutCall
    }

    init(type: String, call: CallID?) {
        self.type = type
        self.call = call
    }
}

extension DeviceKey: Codable {
    private enum CodingKeys: String, CodingKey { case user, device }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(user: try container.decode(UserID.self, forKey: .user), device: try container.decode(DeviceID.self, forKey: .device))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(user, forKey: .user)
        try container.encode(device, forKey: .device)
    }
}

/// How a node's messages reach the other nodes of its deployment.
public protocol ClusterMailbox: Sendable {
    var node: NodeID { get }
    /// Sends to one node, or to every live node, this one included (`to: nil`); a node's messages
    /// arrive in the order it sent them. Returns at once: a node that is gone misses them.
    func send(_ message: NodeMessage, to node: NodeID?)
    /// What other nodes send to this one, in order; one reader.
    var messages: AsyncStream<NodeMessage> { get }
    /// Nodes that were live and are not any more, as they are noticed; one reader.
    var departures: AsyncStream<NodeID> { get }
    /// Whether `node` runs the requests sent to it unanswered (`NodeMessage.unanswered`) in the
    /// order they come, as a node of this build does; false when this node does not know it (then
    /// each request goes for an answer, and the next leaves only after it).
    func runsUnansweredInOrder(_ node: NodeID) -> Bool
}

/// What the nodes of a deployment share beside the store: which node holds which device, and
/// which runs which call and room.
public protocol ClusterDirectory: Sendable {
    /// Records that this node holds a session for the device (or no longer does), in order with
    /// the mailbox's `send`; a new holder tells the node that held it before and the nodes running
    /// calls of its user (`claimed`).
    func holds(_ key: DeviceKey, _ holding: Bool)
    /// The user's devices held on other live nodes, and where.
    func remoteDevices(of user: UserID) async throws -> [DeviceKey: NodeID]
    /// Stores a new call unless its id is taken, and reads what its invite needs before it rings:
    /// whether the id was taken (then nothing was stored), where the callee's devices are held on
    /// other live nodes, and the callee's devices as the store keeps them (for pushes). Once this
    /// returns the store has the call and names this node as the one that runs it, so a request
    /// about it on another node is forwarded here. One statement on PostgreSQL, which claims the id
    /// atomically.
    func claim(_ call: StoredCall, store: any SignalingStore) async throws -> InviteClaim
    /// The live node that owns the call; nil if the call is unknown, or its owner is gone (then
    /// `adopt` takes it over).
    func owner(of call: CallID) async throws -> NodeID?
    /// The live node that runs a room; with `claim`, this node when none does (a room runs where it
    /// is first joined, and on that node while it lives). Nil without `claim` if none does.
    func roomOwner(_ room: RoomID, claim: Bool) async throws -> NodeID?
    /// Takes over the unfinished calls whose owner is gone (one call, or all of them): answers the
    /// calls this node now owns. Two nodes never both get one.
    func adopt(_ call: CallID?) async throws -> [StoredCall]
}

/// What a new call's claim answers (`ClusterDirectory.claim(_:store:)`).
public struct InviteClaim: Sendable, Equatable {
    /// Whether the store had a call with the invite's id already: then the new one was not stored.
    public var taken: Bool
    /// The callee's devices held on other live nodes, and where.
    public var held: [DeviceKey: NodeID]
    /// The callee's devices in the store, with their push registrations, in device order.
    public var devices: [DeviceRecord]

    public init(taken: Bool, held: [DeviceKey: NodeID], devices: [DeviceRecord]) {
        self.taken = taken
        self.held = held
        self.devices = devices
    }

    /// The claim one step after the other: the id read, the call stored if it was free, then the
    /// two reads. Unlike PostgreSQL's one statement, two nodes that claim one id at the same moment
    /// may both find it free.
    static func stepByStep(_ call: StoredCall, store: any SignalingStore, directory: some ClusterDirectory) async throws -> InviteClaim {
        let taken = try await store.call(call.record.call) != nil
        if !taken { try await store.saveCalls([call]) }
        return InviteClaim(taken: taken, held: try await directory.remoteDevices(of: call.record.callee),
                           devices: try await store.devices(of: call.record.callee))
    }
}

extension ClusterDirectory {
    /// The claim step by step (a directory that shares no database with the store).
    public func claim(_ call: StoredCall, store: any SignalingStore) async throws -> InviteClaim {
        try await InviteClaim.stepByStep(call, store: store, directory: self)
    }
}

/// A hub's link to the other nodes: a mailbox and a directory. `PostgresCluster` is both, on the
/// PostgreSQL the nodes share; `InMemoryDeployment.Node` (ParleyServerTesting) both, in memory, for
/// tests; a hub without one is a deployment of one node.
public typealias ClusterLink = ClusterMailbox & ClusterDirectory

/// Devices on other nodes, by user (an invite asks for one user's).
struct RemoteHolders {
    private var byUser: [UserID: [DeviceID: NodeID]] = [:]

    subscript(key: DeviceKey) -> NodeID? {
        get { byUser[key.user]?[key.device] }
        set {
            byUser[key.user, default: [:]][key.device] = newValue
            if byUser[key.user]?.isEmpty == true { byUser[key.user] = nil }
        }
    }

    func devices(of user: UserID) -> Set<DeviceID> { Set(byUser[user]?.keys ?? [:].keys) }

    func keys(on node: NodeID) -> [DeviceKey] {
        byUser.flatMap { user, devices in devices.filter { $0.value == node }.map { DeviceKey(user: user, device: $0.key) } }
    }
}

extension ClientMessage {
    /// The call a request is about, for every call request but the invite (which starts one).
    var aboutCall: CallID? {
        switch self {
        case .callRinging(let request): request.call
        case .callAccept(let request), .callState(let request): request.call
        case .callDecline(let decline): decline.call
        case .callSignal(let signal): signal.call
        case .callUpdate(let update): update.call
        case .callHangup(let hangup): hangup.call
        case .callReport(let report): report.call
        case .hello, .ping, .ack, .callInvite, .roomJoin, .roomLeave, .roomSignal: nil
        }
    }

    /// The room a request is about.
    var aboutRoom: RoomID? {
        switch self {
        case .roomJoin(let join): join.room
        case .roomLeave(let leave): leave.room
        case .roomSignal(let signal): signal.room
        default: nil
        }
    }

    var isRoomJoin: Bool {
        if case .roomJoin = self { true } else { false }
    }
}

extension ServerMessage {
    /// The call a frame for a device is about, when it is about one.
    var aboutCall: CallID? {
        switch self {
        case .callIncoming(let message): message.call
        case .callRinging(let message): message.call
        case .callAccepted(let message): message.call
        case .callEnded(let message): message.call
        case .callSignal(let message): message.call
        case .callUpdated(let message): message.call
        case .welcome, .ack, .error, .roomParticipantJoined, .roomParticipantLeft, .roomSignal: nil
        }
    }
}

extension Result {
    var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}
