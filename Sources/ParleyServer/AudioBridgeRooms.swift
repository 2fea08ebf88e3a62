import Crypto
import Foundation
import Logging
import ParleyJanus
import ParleyProtocol

/// The server's side of AudioBridge rooms (protocol v1, "Rooms"): one Janus session that creates
/// each room on its first join with a secret only the server knows, admits every joining device
/// with a one-time token through `allowed`, revokes the token and kicks the participant when the
/// device leaves, and destroys an empty room after a grace period. After Janus restarts, rooms are
/// created again under the same numbers on the next join.
///
/// A room's number and secret are derived from the deployment's room key (`JanusSettings.roomKey`),
/// so every node, and the same node after a restart or a crash, finds a room's Janus room where
/// the one that made it left it: a room whose node went away goes on in the same Janus room, and
/// its members on Janus are not split from those who join after.
actor AudioBridgeRooms {
    /// A device's admission to a room: its participant id and its token, both derived from the
    /// room key (`newMember`), so any node of the deployment can check and revoke them.
    private struct Member: Equatable {
        var token: String
        var participant: Int64
    }

    private struct Room {
        var number: Int64
        var secret: String
        var members: [DeviceKey: Member] = [:]
        /// The Janus session the room was created in; another one means Janus lost it.
        var createdIn: Int?
        /// Set when the room empties: its grace period ends in a destruction only if it is still set then.
        var emptied: UInt64?
    }

    /// A token Janus could not be told to remove yet.
    private struct Unrevoked {
        var number: Int64
        var secret: String
        var member: Member
    }

    /// How often a token Janus could not be told to remove is tried again.
    static let revocationRetry: Duration = .seconds(1)

    private var settings: JanusSettings
    private let logger: Logger
    private var rooms: [RoomID: Room] = [:]
    /// Tokens that still admit, for want of Janus: tried again every `revocationRetry` by
    /// `retrying` until Janus removed them or no longer has their room.
    private var unrevoked: [Unrevoked] = []
    private var retrying = false
    private var emptyings: UInt64 = 0
    /// What runs beside the requests (retried revocations, grace periods, watching the Janus
    /// session): children of `run()`.
    private let jobs = AsyncStream<@Sendable () async -> Void>.makeStream()
    /// Shut down: Janus is not reached again.
    private var closed = false
    private var bridge: AudioBridge?
    private var generation = 0
    private var connecting: Task<AudioBridge, any Error>?

    /// The key rooms' numbers and secrets are derived from: the deployment's (`JanusSettings.roomKey`,
    /// or `useDeploymentKey`), or one of this process's own.
    private var key: SymmetricKey

    init(settings: JanusSettings, logger: Logger) {
        self.settings = settings
        self.logger = logger
        self.key = settings.roomKey.map { SymmetricKey(data: $0) } ?? SymmetricKey(size: .bits256)
    }

    /// Takes the deployment's room key, read from the store as the server starts (before any room
    /// is joined: a room's number is the key's).
    func useDeploymentKey(_ roomKey: [UInt8]) {
        precondition(rooms.isEmpty, "the room key changed under rooms")
        settings.roomKey = roomKey
        key = SymmetricKey(data: roomKey)
    }

    /// Runs what the rooms hand off until cancelled (the hub runs it as a child of its own `run()`).
    func run() async {
        await withDiscardingTaskGroup { group in
            for await job in jobs.stream { group.addTask { await job() } }
        }
    }

    /// Admits `device` to room `name`, creating the Janus room if needed; answers what the client
    /// joins with.
    ///
    /// `keeping`: the Janus participant the device says it already is in the room (its session
    /// started anew: this server restarted, or its node went away). That admission is kept — the
    /// same participant and token; any other admission of the device's is revoked — when this
    /// deployment issued that id to this device for this room (`isIssued`) and Janus has the
    /// participant in the room. Otherwise the device gets a new admission, and the participant it
    /// named is revoked with its previous one.
    func admit(room name: RoomID, device: DeviceKey, keeping claimed: Int64? = nil) async throws -> RoomMedia.Janus {
        // One admission of a device to a room at a time: each reads the device's admission before
        // it awaits Janus and revokes it after, which another admission meanwhile would undo.
        let admitting = Admitting(room: name, device: device)
        await begin(admitting)
        defer { end(admitting) }
        let bridge = try await connected()
        let named = claimed.flatMap { issuedMember($0, room: name, device: device) }
        if let named, try await kept(named, room: name, device: device, on: bridge) {
            return ticket(for: named, in: rooms[name] ?? newRoom(name))
        }
        var room = rooms[name] ?? newRoom(name)
        room.emptied = nil
        let previous = room.members[device]
        var member = newMember(room: name, device: device)
        while member == previous || member == named { member = newMember(room: name, device: device) }
        room.members[device] = member
        rooms[name] = room
        do {
            if room.createdIn != generation {
                try await create(room, on: bridge)
                rooms[name]?.createdIn = generation
            } else {
                try await bridge.allowed(room: room.number, secret: room.secret, action: "add", tokens: [member.token])
            }
        } catch {
            if rooms[name]?.members[device]?.token == member.token { rooms[name]?.members[device] = previous }
            throw error
        }
        if let previous { _ = await revokeOrRetry(previous, in: room) }
        if let named, named != previous { _ = await revokeOrRetry(named, in: room) }
        return ticket(for: member, in: room)
    }

    /// Whether the device's admission as `member` holds in Janus, which lists its participant in
    /// the room: then it is the device's admission here from now on (taken over from the node that
    /// made it, or kept), and the room is known to be in this Janus session.
    private func kept(_ member: Member, room name: RoomID, device: DeviceKey, on bridge: AudioBridge) async throws -> Bool {
        let number = (rooms[name] ?? newRoom(name)).number
        let participants: [AudioBridgeParticipant]
        do {
            participants = try await bridge.listParticipants(room: number)
        } catch JanusError.audioBridge(.noSuchRoom, _) {
            return false
        }
        guard participants.contains(where: { $0.id == member.participant }) else { return false }
        var room = rooms[name] ?? newRoom(name)
        let previous = room.members[device]
        room.emptied = nil
        room.members[device] = member
        room.createdIn = generation
        rooms[name] = room
        if let previous, previous != member { _ = await revokeOrRetry(previous, in: room) }
        return true
    }

    private struct Admitting: Hashable {
        var room: RoomID
        var device: DeviceKey
    }

    /// Admissions under way, and those waiting for them, by room and device.
    private var admitting: [Admitting: [CheckedContinuation<Void, Never>]] = [:]

    /// Waits until no other admission of the device to the room is under way, and starts one.
    private func begin(_ admission: Admitting) async {
        guard admitting[admission] != nil else {
            admitting[admission] = []
            return
        }
        await withCheckedContinuation { admitting[admission, default: []].append($0) }
    }

    /// Ends an admission: the next one waiting goes on.
    private func end(_ admission: Admitting) {
        guard var waiting = admitting[admission], !waiting.isEmpty else {
            admitting[admission] = nil
            return
        }
        let next = waiting.removeFirst()
        admitting[admission] = waiting
        next.resume()
    }

    private func ticket(for member: Member, in room: Room) -> RoomMedia.Janus {
        RoomMedia.Janus(url: settings.clientURL, room: room.number, token: member.token, participant: member.participant)
    }

    /// The device left (or its session expired): its token no longer admits, its participant is
    /// kicked. With `token`, only if that is still the device's admission (a join taken back must
    /// not revoke a newer one). Answers once Janus has removed the token: true; false when Janus
    /// cannot be reached now, and the token is tried again until it is removed.
    @discardableResult
    func release(room name: RoomID, device: DeviceKey, token: String? = nil, roomIsEmpty: Bool) async -> Bool {
        guard var room = rooms[name], token == nil || room.members[device]?.token == token,
              let member = room.members.removeValue(forKey: device) else { return true }
        rooms[name] = room
        if roomIsEmpty, room.members.isEmpty { destroyLater(name) }
        return await revokeOrRetry(member, in: room)
    }

    /// Ends the Janus session (server shutdown). Rooms with members stay in Janus when their
    /// numbers are the deployment's (`roomKey`): their members go on talking, and the node that runs
    /// the room next (this one restarted, or another) finds it. Empty rooms, and rooms no other
    /// process could find again, are destroyed.
    func shutdown() async {
        closed = true
        jobs.continuation.finish()
        if !unrevoked.isEmpty {
            logger.warning("shutting down with room tokens Janus was never told to revoke",
                           metadata: ["tokens": "\(unrevoked.count)", "rooms": "\(Set(unrevoked.map(\.number)))"])
        }
        if let bridge {
            for room in rooms.values where room.createdIn == generation && (room.members.isEmpty || settings.roomKey == nil) {
                try? await bridge.destroy(room: room.number, secret: room.secret)
            }
            try? await bridge.client.destroy()
            await bridge.client.close()
        }
        rooms.removeAll()
        bridge = nil
    }

    /// The Janus room number of a room, while it exists (tests, metrics).
    func janusRoom(_ name: RoomID) -> Int64? { rooms[name]?.number }

    private func create(_ room: Room, on bridge: AudioBridge) async throws {
        var options = AudioBridgeRoomOptions()
        options.description = "parley"
        options.secret = room.secret
        options.isPrivate = true
        options.allowed = room.members.values.map(\.token)
        options.audioLevelEvent = true
        options.audioActivePackets = settings.audioActivePackets
        options.audioLevelAverage = settings.audioLevelAverage
        do {
            try await bridge.create(room: room.number, options: options)
        } catch JanusError.audioBridge(.roomExists, _) {
            // Created meanwhile (a concurrent join), or kept by Janus across our reconnect.
            try await bridge.allowed(room: room.number, secret: room.secret, action: "add", tokens: options.allowed ?? [])
        }
    }

    /// Removes the member's token from the room's `allowed` list and kicks its participant; if
    /// Janus cannot be reached, keeps the token to try again (answering false).
    private func revokeOrRetry(_ member: Member, in room: Room) async -> Bool {
        let entry = Unrevoked(number: room.number, secret: room.secret, member: member)
        // On the session there is: a `room.leave` waits for this, and connecting to a Janus that
        // does not answer takes seconds. Without one, the retries connect.
        if let bridge, await revoke(entry, on: bridge) != .unreachable { return true }
        logger.warning("Janus could not be told to revoke a room token; trying again until it is",
                       metadata: ["room": "\(room.number)"])
        unrevoked.append(entry)
        if !retrying {
            retrying = true
            jobs.continuation.yield { await self.retryRevocations() }
        }
        return false
    }

    private func retryRevocations() async {
        while !unrevoked.isEmpty, !closed {
            do { try await Task.sleep(for: Self.revocationRetry) } catch { break }
            // Those not done go back, beside any added while these were tried; the first that
            // cannot reach Janus ends the round (the others would not reach it either).
            var pending = unrevoked[...]
            unrevoked = []
            while let entry = pending.first, !closed {
                guard let bridge = try? await connected(), await revoke(entry, on: bridge) != .unreachable else { break }
                pending = pending.dropFirst()
            }
            unrevoked = Array(pending) + unrevoked
        }
        retrying = false
    }

    private enum Revocation { case done, unreachable }

    /// Done once Janus no longer admits the token: removed now, or its room is gone from Janus
    /// (restarted, or destroyed). The room's secret is the server's in any Janus session.
    private func revoke(_ entry: Unrevoked, on bridge: AudioBridge) async -> Revocation {
        do {
            try await bridge.allowed(room: entry.number, secret: entry.secret, action: "remove", tokens: [entry.member.token])
        } catch JanusError.audioBridge(.noSuchRoom, _) {
            return .done
        } catch {
            logger.notice("could not revoke an AudioBridge token", metadata: ["room": "\(entry.number)", "error": "\(error)"])
            return .unreachable
        }
        do {
            try await bridge.kick(room: entry.number, secret: entry.secret, id: entry.member.participant)
        } catch JanusError.audioBridge(.noSuchUser, _) {
            // Never joined Janus, or already left it.
        } catch {
            // The token no longer admits: a participant left in Janus can only stay until it leaves.
            logger.notice("could not kick an AudioBridge participant", metadata: ["room": "\(entry.number)", "error": "\(error)"])
        }
        return .done
    }

    /// Destroys room `name` after the grace period if it is empty then and has not been joined
    /// meanwhile (a join clears `emptied`).
    private func destroyLater(_ name: RoomID) {
        emptyings += 1
        let mark = emptyings, grace = settings.emptyRoomGrace
        rooms[name]?.emptied = mark
        jobs.continuation.yield {
            guard (try? await Task.sleep(for: grace)) != nil else { return }
            await self.destroyIfEmpty(name, emptied: mark)
        }
    }

    /// Destroys a room no member has joined again within the grace period, unless Janus still has
    /// participants in it: members from before this node ran the room (it was taken over from a node
    /// that went away), whom this node does not know. Those are asked after again a grace period on.
    private func destroyIfEmpty(_ name: RoomID, emptied mark: UInt64) async {
        guard let room = rooms[name], room.members.isEmpty, room.emptied == mark else { return }
        if let bridge, room.createdIn == generation,
           let participants = try? await bridge.listParticipants(room: room.number), !participants.isEmpty {
            if rooms[name]?.members.isEmpty == true, rooms[name]?.emptied == mark { destroyLater(name) }
            return
        }
        guard rooms[name]?.members.isEmpty == true else { return }
        rooms[name] = nil
        guard let bridge, room.createdIn == generation else { return }
        do {
            try await bridge.destroy(room: room.number, secret: room.secret)
        } catch {
            logger.notice("could not destroy an empty AudioBridge room", metadata: ["room": "\(room.number)", "error": "\(error)"])
        }
    }

    // MARK: The Janus session

    private func connected() async throws -> AudioBridge {
        if let bridge { return bridge }
        guard !closed else { throw JanusError.disconnected }
        if let connecting { return try await connecting.value }
        let settings = self.settings
        // Unstructured, and awaited: every request that needs the session meanwhile waits on this one attempt.
        let task = Task { () throws -> AudioBridge in
            let transport = try await JanusWebSocketTransport.connect(to: settings.url)
            let client = JanusClient(transport: transport, requestTimeout: settings.requestTimeout)
            try await client.createSession()
            return try await AudioBridge.attach(client, opaqueID: "parley-server")
        }
        connecting = task
        defer { connecting = nil }
        do {
            let bridge = try await task.value
            generation += 1
            self.bridge = bridge
            let current = generation
            jobs.continuation.yield {
                for await reason in bridge.client.sessionEnded {
                    await self.lost(current, reason: reason)
                    return
                }
                await self.lost(current, reason: .disconnected)
            }
            logger.info("connected to Janus", metadata: ["janus.url": "\(settings.url)"])
            return bridge
        } catch {
            logger.warning("cannot reach Janus", metadata: ["janus.url": "\(settings.url)", "error": "\(error)"])
            throw error
        }
    }

    private func lost(_ session: Int, reason: JanusError) {
        guard session == generation, bridge != nil else { return }
        logger.warning("lost the Janus session; rooms are created again on their next join", metadata: ["reason": "\(reason)"])
        bridge = nil
    }

    /// A room not in use here yet, under its derived number and secret.
    private func newRoom(_ name: RoomID) -> Room {
        let derived = Self.derive(name, key: key)
        return Room(number: derived.number, secret: derived.secret)
    }

    /// A room's Janus number (1 … 2^53 − 1, so JSON numbers carry it exactly) and secret: HMAC-SHA256
    /// of the room's name under the key. Clients cannot derive either without the key.
    static func derive(_ name: RoomID, key: SymmetricKey) -> (number: Int64, secret: String) {
        let number = HMAC<SHA256>.authenticationCode(for: Data("audiobridge room number \(name.rawValue)".utf8), using: key)
            .prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) } & ((1 << 53) - 1)
        let secret = HMAC<SHA256>.authenticationCode(for: Data("audiobridge room secret \(name.rawValue)".utf8), using: key)
            .map { String(format: "%02x", $0) }.joined()
        return (max(1, Int64(number)), secret)
    }

    /// A new admission of `device` to room `name`: a random nonce and a tag of it (`participant`),
    /// and the token that goes with that participant.
    private func newMember(room name: RoomID, device: DeviceKey) -> Member {
        let participant = Self.participant(room: name, device: device, nonce: UInt32.random(in: 1..<(1 << 21)), key: key)
        return Member(token: Self.token(room: name, device: device, participant: participant, key: key), participant: participant)
    }

    /// The admission `participant` stands for, if this deployment (its room key) issued it to
    /// `device` for room `name`.
    private func issuedMember(_ participant: Int64, room name: RoomID, device: DeviceKey) -> Member? {
        guard Self.isIssued(participant, room: name, device: device, key: key) else { return nil }
        return Member(token: Self.token(room: name, device: device, participant: participant, key: key), participant: participant)
    }

    /// A participant id Janus takes (1 … 2^53 − 1) that proves who it was issued to: a 21-bit
    /// nonce, then 32 bits of HMAC-SHA256 over the nonce, the room and the device under the room key.
    /// A device cannot name another's participant as its own (the tag would not match), nor make one up.
    static func participant(room name: RoomID, device: DeviceKey, nonce: UInt32, key: SymmetricKey) -> Int64 {
        let tag = mac(["audiobridge participant", name.rawValue, device.user.rawValue, device.device.rawValue, "\(nonce)"], key: key)
            .prefix(4).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        return Int64(UInt64(nonce) << 32 | tag)
    }

    static func isIssued(_ participant: Int64, room name: RoomID, device: DeviceKey, key: SymmetricKey) -> Bool {
        guard (1..<(1 << 53)).contains(participant) else { return false }
        let nonce = UInt32(participant >> 32)
        return nonce > 0 && Self.participant(room: name, device: device, nonce: nonce, key: key) == participant
    }

    /// The token that admits `participant` (128 bits of HMAC, in hex): known to every node of the
    /// deployment, so the node that runs the room next can revoke it.
    static func token(room name: RoomID, device: DeviceKey, participant: Int64, key: SymmetricKey) -> String {
        mac(["audiobridge token", name.rawValue, device.user.rawValue, device.device.rawValue, "\(participant)"], key: key)
            .prefix(16).map { String(format: "%02x", $0) }.joined()
    }

    /// HMAC-SHA256 of fields, each length-prefixed so that no two lists read alike.
    private static func mac(_ fields: [String], key: SymmetricKey) -> HashedAuthenticationCode<SHA256> {
        let message = fields.map { "\($0.utf8.count):\($0)" }.joined()
        return HMAC<SHA256>.authenticationCode(for: Data(message.utf8), using: key)
    }
}
