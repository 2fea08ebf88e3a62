import ParleyProtocol

/// The rooms one node runs: who is in which, and the rules of protocol v1's rooms (a device id
/// belongs to one user in a room, a full room takes no newcomer, a join of a member updates its
/// display without telling the others again, only members signal, and only to members).
///
/// A value, like `HubCall`: each event changes the table and returns what to deliver to
/// whom; the hub delivers it, and provisions AudioBridge rooms on Janus.
struct RoomTable {
    private var members: [RoomID: [RoomParticipant]] = [:]
    private var roomsByDevice: [DeviceKey: Set<RoomID>] = [:]

    /// The room's members in the order they joined; empty for a room that has none.
    func members(of room: RoomID) -> [RoomParticipant] { members[room] ?? [] }
    /// Rooms with members: a room its last member left is forgotten.
    var count: Int { members.count }

    /// The rooms the device is in.
    func rooms(of key: DeviceKey) -> Set<RoomID> { roomsByDevice[key] ?? [] }

    func contains(_ key: DeviceKey, in room: RoomID) -> Bool { rooms(of: key).contains(room) }

    /// Whether the device may join the room now: refused when its device id is in the room under
    /// another user, or when the room is full (`limit` devices) and it is not in it yet.
    func checkJoin(_ room: RoomID, by key: DeviceKey, limit: Int) throws(ErrorMessage) {
        let members = members(of: room)
        if let member = members.first(where: { $0.device == key.device }), member.user != key.user {
            throw ErrorMessage(code: .badRequest, message: "device \(key.device) is already in the room under another user")
        }
        if !members.contains(where: { $0.device == key.device }), members.count >= limit {
            throw ErrorMessage(code: .roomFull, message: "room \(room) is full (\(limit) devices)")
        }
    }

    /// Puts the device in the room, or updates its display if it is in already (checked first
    /// with `checkJoin`). Answers the other members, and `room.participant.joined` for each of
    /// them when the device is new to the room.
    mutating func admit(_ join: RoomJoin, by key: DeviceKey) -> (others: [RoomParticipant], deliveries: [Delivery]) {
        var members = members(of: join.room)
        var deliveries: [Delivery] = []
        if let index = members.firstIndex(where: { $0.device == key.device && $0.user == key.user }) {
            members[index].display = join.display ?? members[index].display
        } else {
            let participant = RoomParticipant(user: key.user, device: key.device, display: join.display)
            let joined = ServerMessage.roomParticipantJoined(RoomParticipantJoined(room: join.room, participant: participant))
            deliveries = members.map { Delivery(to: $0.key, message: joined) }
            members.append(participant)
            roomsByDevice[key, default: []].insert(join.room)
        }
        self.members[join.room] = members
        return (members.filter { $0.device != key.device }, deliveries)
    }

    /// Takes the device out of the room: `room.participant.left` for each member left. `isEmpty`:
    /// the room has no member any more (and is forgotten). Nil for a device that is not in the
    /// room: nothing changes.
    mutating func leave(_ room: RoomID, by key: DeviceKey) -> (deliveries: [Delivery], isEmpty: Bool)? {
        roomsByDevice[key]?.remove(room)
        if roomsByDevice[key]?.isEmpty == true { roomsByDevice[key] = nil }
        var members = members(of: room)
        guard members.contains(where: { $0.key == key }) else { return nil }
        members.removeAll { $0.key == key }
        self.members[room] = members.isEmpty ? nil : members
        let left = ServerMessage.roomParticipantLeft(RoomParticipantLeft(room: room, user: key.user, device: key.device))
        return (members.map { Delivery(to: $0.key, message: left) }, members.isEmpty)
    }

    /// A member's `room.signal` to another member, as the target gets it.
    func signal(_ signal: RoomSignal, from key: DeviceKey) throws(ErrorMessage) -> Delivery {
        let members = members(of: signal.room)
        guard members.contains(where: { $0.key == key }) else {
            throw ErrorMessage(code: .notInRoom, message: "this device is not in room \(signal.room)")
        }
        guard let target = members.first(where: { $0.device == signal.to }) else {
            throw ErrorMessage(code: .notFound, message: "device \(signal.to) is not in room \(signal.room)")
        }
        let relayed = RoomSignalled(room: signal.room, from: Party(user: key.user, device: key.device), signal: signal.signal)
        return Delivery(to: target.key, message: .roomSignal(relayed))
    }
}

extension RoomParticipant {
    var key: DeviceKey { DeviceKey(user: user, device: device) }
}
