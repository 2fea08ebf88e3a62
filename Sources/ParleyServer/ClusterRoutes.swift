import ParleyProtocol

/// Where a node sends what is not for it alone, in a deployment of several nodes: which node holds
/// each device it has heard of, which node runs each call it has heard from, where the sessions it
/// handed over went; and what it waits for from other nodes (forwarded requests, session
/// handovers), each until a deadline on the hub's clock.
///
/// A value, like `SessionTable`: the hub tells it what happened and does what it answers (delivers,
/// ends a device's part in calls, answers a waiter). It holds no continuation and reads no clock.
struct ClusterRoutes {
    /// A device's part in a call another node runs.
    enum Part { case rung, answered }

    /// What a node waits for from another.
    enum Wait: Equatable {
        /// The answer to a request forwarded to the node that runs its call or room.
        case forward
        /// A session another node holds, asked for by a hello that resumes it here.
        case handover
    }

    private var holders = RemoteHolders()
    private var callOwners: [CallID: NodeID] = [:]
    /// Calls other nodes run that devices held here take part in: rung, or answered.
    private var parts: [DeviceKey: [CallID: (node: NodeID, part: Part)]] = [:]
    private var movedTo: [DeviceKey: NodeID] = [:]
    private var roomsElsewhere: [DeviceKey: [RoomID: (node: NodeID, join: RoomJoin)]] = [:]
    private var waits: [UInt64: (wait: Wait, node: NodeID, deadline: Duration)] = [:]
    private var lastWait: UInt64 = 0

    // MARK: Devices

    /// The node that holds a device's session, if another node does as far as this one has heard.
    func holder(of key: DeviceKey) -> NodeID? { holders[key] }

    /// The user's devices held on other nodes, as heard.
    func remoteDevices(of user: UserID) -> Set<DeviceID> { holders.devices(of: user) }

    /// The device is on `node` (the directory said so, or a request came from it there).
    mutating func heard(_ key: DeviceKey, isOn node: NodeID) {
        holders[key] = node
    }

    /// The device started a new session here.
    mutating func startedHere(_ key: DeviceKey) {
        holders[key] = nil
        movedTo[key] = nil
    }

    /// Another node says it holds the device now.
    mutating func claimed(_ key: DeviceKey, by node: NodeID) {
        holders[key] = node
        if movedTo[key] != nil { movedTo[key] = node }
    }

    /// A node says the device's session there expired. True when that node held it as far as this
    /// one knows: then the device's part in calls and rooms here ends.
    mutating func released(_ key: DeviceKey, by node: NodeID) -> Bool {
        if movedTo[key] == node { movedTo[key] = nil }
        guard holders[key] == node else { return false }
        holders[key] = nil
        return true
    }

    /// This node handed the device's session to `node`.
    mutating func handedOver(_ key: DeviceKey, to node: NodeID) {
        holders[key] = node
        movedTo[key] = node
    }

    /// A session handed over by another node is held here now.
    mutating func adopted(_ key: DeviceKey) {
        startedHere(key)
    }

    /// Where a frame that comes here for a device without a session here goes on to: the node this
    /// one handed its session to (nodes running its calls may not have heard yet).
    func sendOn(_ key: DeviceKey) -> NodeID? { movedTo[key] }

    // MARK: Calls

    /// The node that runs a call, as its frames said.
    func owner(of call: CallID) -> NodeID? { callOwners[call] }

    /// A frame for `key` about a call came from the node that runs it (`from`).
    mutating func heard(_ message: ServerMessage, from node: NodeID, for key: DeviceKey) {
        guard let call = message.aboutCall else { return }
        heard(call, message.type, from: node, for: key)
    }

    /// A frame of `type` about `call` came for `key` from the node that runs it. `call.ended` forgets
    /// the call (an end for one device of several too: its node is asked again then); `call.incoming`
    /// makes the device a part of it (`part`).
    mutating func heard(_ call: CallID, _ type: String, from node: NodeID, for key: DeviceKey) {
        let ended = type == "call.ended"
        callOwners[call] = ended ? nil : node
        if ended || parts[key]?[call].map({ $0.node != node }) == true { forget(call, partOf: key) }
        if type == "call.incoming", parts[key]?[call] == nil { parts[key, default: [:]][call] = (node, .rung) }
    }

    /// A device held here answered a call that `node` runs (its forwarded `call.accept` was taken there).
    mutating func answered(_ call: CallID, by key: DeviceKey, on node: NodeID) {
        parts[key, default: [:]][call] = (node, .answered)
    }

    /// The node that runs a call the device was rung for, or answered: until the call ends for the
    /// device, its frames come from another node, that node leaves, or the device's session here goes.
    func node(of call: CallID, partOf key: DeviceKey) -> NodeID? {
        parts[key]?[call]?.node
    }

    /// The node to send a device's request on to unanswered, when that node could refuse it only
    /// because the call has ended (the device then hears `call.ended` all the same, as it does on
    /// one node when the end is handled just after the request): `call.ringing` of a device that
    /// was rung, and `call.signal` and `call.update` (not a recording step, which the call's state
    /// may refuse) of the device that answered. Nil: the request goes for an answer.
    func unanswered(_ message: ClientMessage, about call: CallID, by key: DeviceKey) -> NodeID? {
        guard let (node, part) = parts[key]?[call] else { return nil }
        switch message {
        case .callRinging: return node
        case .callSignal: return part == .answered ? node : nil
        case .callUpdate(let update): return part == .answered && update.recording == nil ? node : nil
        default: return nil
        }
    }

    private mutating func forget(_ call: CallID, partOf key: DeviceKey) {
        parts[key]?[call] = nil
        if parts[key]?.isEmpty == true { parts[key] = nil }
    }

    /// The call's node did not answer: asked of the directory again next time.
    mutating func forgetOwner(of call: CallID) {
        callOwners[call] = nil
        for key in parts.keys where parts[key]?[call] != nil { forget(call, partOf: key) }
    }

    // MARK: Rooms

    /// A device held here joined a room that `node` runs: `join` is how it joins again (its
    /// display, and the Janus participant its ack gave) if that node goes away.
    mutating func joined(_ join: RoomJoin, by key: DeviceKey, on node: NodeID) {
        roomsElsewhere[key, default: [:]][join.room] = (node, join)
    }

    /// The room's node admitted the device as Janus participant `participant` (nil: none, a mesh
    /// room), if the join remembered is still the one made there.
    mutating func admitted(_ participant: Int64?, to room: RoomID, by key: DeviceKey, on node: NodeID) {
        guard roomsElsewhere[key]?[room]?.node == node else { return }
        roomsElsewhere[key]?[room]?.join.participant = participant
    }

    /// The device left the room, or joins it anew (with `node`: only if it had joined it there).
    mutating func left(_ room: RoomID, by key: DeviceKey, on node: NodeID? = nil) {
        guard node == nil || roomsElsewhere[key]?[room]?.node == node else { return }
        roomsElsewhere[key]?[room] = nil
        if roomsElsewhere[key]?.isEmpty == true { roomsElsewhere[key] = nil }
    }

    /// The device's session here ended, or went to another node: its rooms, and its parts in
    /// calls, are no longer this node's business.
    mutating func sessionGone(_ key: DeviceKey) {
        roomsElsewhere[key] = nil
        parts[key] = nil
    }

    // MARK: Waits

    /// Starts waiting on `node` until `deadline`; answers the id the other node's answer carries.
    mutating func wait(_ wait: Wait, on node: NodeID, until deadline: Duration) -> UInt64 {
        lastWait += 1
        waits[lastWait] = (wait, node, deadline)
        return lastWait
    }

    /// The answer with this id came: what was waited for, if it still was (nil for an answer that
    /// comes after its deadline, or one never asked for).
    mutating func answered(_ id: UInt64) -> Wait? {
        waits.removeValue(forKey: id)?.wait
    }

    /// The waits whose deadline is `now` or earlier (all of them for nil: the hub stops), no
    /// longer waited for.
    mutating func due(at now: Duration?) -> [(id: UInt64, wait: Wait)] {
        let due = waits.filter { entry in now.map { entry.value.deadline <= $0 } ?? true }
        for id in due.keys { waits[id] = nil }
        return due.map { ($0.key, $0.value.wait) }.sorted { $0.id < $1.id }
    }

    // MARK: Nodes

    /// A node is gone: the devices it held (whose part in calls and rooms here is as if they had
    /// disconnected now), the waits on it, which will not be answered, and the joins of devices
    /// held here to rooms it ran, to be made again where those rooms run next.
    mutating func nodeLeft(_ node: NodeID) -> (devices: [DeviceKey], waits: [(id: UInt64, wait: Wait)], rejoins: [(key: DeviceKey, join: RoomJoin)]) {
        var rejoins: [(key: DeviceKey, join: RoomJoin)] = []
        for (key, rooms) in roomsElsewhere {
            for (room, entry) in rooms where entry.node == node {
                rejoins.append((key, entry.join))
                left(room, by: key)
            }
        }
        callOwners = callOwners.filter { $0.value != node }
        parts = parts.compactMapValues { calls in
            let left = calls.filter { $0.value.node != node }
            return left.isEmpty ? nil : left
        }
        movedTo = movedTo.filter { $0.value != node }
        let devices = holders.keys(on: node)
        for key in devices { holders[key] = nil }
        let abandoned = waits.filter { $0.value.node == node }
        for id in abandoned.keys { waits[id] = nil }
        return (devices, abandoned.map { ($0.key, $0.value.wait) }.sorted { $0.id < $1.id },
                rejoins.sorted { ($0.key.description, $0.join.room.rawValue) < ($1.key.description, $1.join.room.rawValue) })
    }
}
