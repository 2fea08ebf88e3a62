import ParleyProtocol

/// A participant of an AudioBridge room as Janus lists it.
public struct AudioBridgeParticipant: Hashable, Sendable {
    public var id: Int64
    public var display: String?
    /// Whether its PeerConnection is up.
    public var setup: Bool
    public var muted: Bool
    /// Present when the room sends audio-level events.
    public var talking: Bool?

    init?(_ value: JSONValue) {
        guard let id = value["id"]?.int64 else { return nil }
        self.id = id
        display = value["display"]?.stringValue
        setup = value["setup"] == .bool(true)
        muted = value["muted"] == .bool(true)
        talking = value["talking"].flatMap { if case .bool(let b) = $0 { b } else { nil } }
    }

    static func list(_ value: JSONValue?) -> [AudioBridgeParticipant] {
        guard case .array(let items)? = value else { return [] }
        return items.compactMap(AudioBridgeParticipant.init)
    }
}

/// Events of an AudioBridge handle, typed.
public enum AudioBridgeEvent: Hashable, Sendable {
    /// Someone joined (`participants` lists them), or our own join's list of who was there.
    case joined(room: Int64, participants: [AudioBridgeParticipant])
    /// Participants changed (mute, display, setup).
    case participantsUpdated(room: Int64, participants: [AudioBridgeParticipant])
    case leaving(room: Int64, id: Int64)
    case talking(room: Int64, id: Int64, talking: Bool)
    case destroyed(room: Int64)
    /// A participant was kicked: us when `id` is our own.
    case kicked(room: Int64, id: Int64?)
    /// Our own `changeroom` landed.
    case roomChanged(room: Int64, id: Int64, participants: [AudioBridgeParticipant])
    /// An answer to our `configure` offer that came as an event.
    case answer(JSEP)
    case webrtcUp
    case media(receiving: Bool)
    case slowLink(uplink: Bool, lost: Int)
    case hangup(reason: String)
    case detached
    /// A plugin event this type does not know, as Janus sent it.
    case other([String: JSONValue])

    package static func from(_ event: JanusHandleEvent) -> AudioBridgeEvent? {
        switch event {
        case .webrtcUp: return .webrtcUp
        case .media(_, let receiving): return .media(receiving: receiving)
        case .slowLink(let uplink, let lost): return .slowLink(uplink: uplink, lost: lost)
        case .hangup(let reason): return .hangup(reason: reason)
        case .detached: return .detached
        case .trickle: return nil
        case .plugin(let data, let jsep):
            let room = data["room"]?.int64 ?? 0
            switch data["audiobridge"]?.stringValue {
            case "joined":
                return .joined(room: room, participants: AudioBridgeParticipant.list(data["participants"]))
            case "roomchanged":
                return .roomChanged(room: room, id: data["id"]?.int64 ?? 0, participants: AudioBridgeParticipant.list(data["participants"]))
            case "talking", "stopped-talking":
                return .talking(room: room, id: data["id"]?.int64 ?? 0, talking: data["audiobridge"]?.stringValue == "talking")
            case "destroyed":
                return .destroyed(room: room)
            case "kicked":
                return .kicked(room: room, id: nil)
            case "event":
                if let id = data["leaving"]?.int64 { return .leaving(room: room, id: id) }
                if let id = data["kicked"]?.int64 { return .kicked(room: room, id: id) }
                if data["participants"] != nil {
                    return .participantsUpdated(room: room, participants: AudioBridgeParticipant.list(data["participants"]))
                }
                if let jsep { return .answer(jsep) }
                return .other(data)
            default:
                if let jsep { return .answer(jsep) }
                return .other(data)
            }
        }
    }
}

/// Options of an AudioBridge room at `create`.
public struct AudioBridgeRoomOptions: Sendable {
    public var description: String?
    public var secret: String?
    public var pin: String?
    public var isPrivate = true
    public var samplingRate: Int?
    /// Join tokens; with `allowed` set, only joins that carry one of them are admitted.
    public var allowed: [String]?
    public var audioLevelEvent = true
    /// Whether participants' `ssrc-audio-level` RTP extension is used (Janus's default: yes).
    public var audioLevelExtension: Bool?
    /// Packets in a window (20 ms each) for talking detection.
    public var audioActivePackets: Int?
    /// Average level (0 loudest … 127 silence) above which a participant counts as talking.
    public var audioLevelAverage: Int?
    public var permanent = false

    public init() {}
}

/// The AudioBridge plugin on one Janus handle: typed requests and a stream of typed events.
public struct AudioBridge: Sendable {
    public let client: JanusClient
    public let handle: Int64
    /// The handle's events, typed as they are read (those of other kinds are skipped).
    public let events: Events
    public typealias Events = AsyncCompactMapSequence<AsyncStream<JanusHandleEvent>, AudioBridgeEvent>

    public static let plugin = "janus.plugin.audiobridge"

    /// Attaches a new handle to the AudioBridge plugin.
    public static func attach(_ client: JanusClient, opaqueID: String? = nil) async throws -> AudioBridge {
        let (handle, raw) = try await client.attach(plugin: plugin, opaqueID: opaqueID)
        return AudioBridge(client: client, handle: handle, events: raw.compactMap(AudioBridgeEvent.from))
    }

    private func send(_ request: String, _ fields: [String: JSONValue] = [:], jsep: JSEP? = nil) async throws -> (data: [String: JSONValue], jsep: JSEP?) {
        var body = fields
        body["request"] = .string(request)
        return try await client.message(handle, body: body, jsep: jsep)
    }

    private static func number(_ value: Int64) -> JSONValue { .number(Double(value)) }

    // MARK: Rooms

    /// Creates room `room` (or lets Janus choose, when nil); answers its number.
    @discardableResult
    public func create(room: Int64?, options: AudioBridgeRoomOptions = .init()) async throws -> Int64 {
        var fields: [String: JSONValue] = ["permanent": .bool(options.permanent), "is_private": .bool(options.isPrivate),
                                           "audiolevel_event": .bool(options.audioLevelEvent)]
        if let room { fields["room"] = Self.number(room) }
        if let value = options.description { fields["description"] = .string(value) }
        if let value = options.secret { fields["secret"] = .string(value) }
        if let value = options.pin { fields["pin"] = .string(value) }
        if let value = options.samplingRate { fields["sampling_rate"] = .number(Double(value)) }
        if let value = options.allowed { fields["allowed"] = .array(value.map { .string($0) }) }
        if let value = options.audioLevelExtension { fields["audiolevel_ext"] = .bool(value) }
        if let value = options.audioActivePackets { fields["audio_active_packets"] = .number(Double(value)) }
        if let value = options.audioLevelAverage { fields["audio_level_average"] = .number(Double(value)) }
        let answer = try await send("create", fields)
        guard let created = answer.data["room"]?.int64 else { throw JanusError.malformed("create: no room") }
        return created
    }

    public func edit(room: Int64, secret: String?, description: String? = nil, newSecret: String? = nil, newPin: String? = nil) async throws {
        var fields: [String: JSONValue] = ["room": Self.number(room)]
        if let secret { fields["secret"] = .string(secret) }
        if let description { fields["new_description"] = .string(description) }
        if let newSecret { fields["new_secret"] = .string(newSecret) }
        if let newPin { fields["new_pin"] = .string(newPin) }
        _ = try await send("edit", fields)
    }

    public func destroy(room: Int64, secret: String?, permanent: Bool? = nil) async throws {
        var fields: [String: JSONValue] = ["room": Self.number(room)]
        if let permanent { fields["permanent"] = .bool(permanent) }
        if let secret { fields["secret"] = .string(secret) }
        _ = try await send("destroy", fields)
    }

    public func exists(room: Int64) async throws -> Bool {
        try await send("exists", ["room": Self.number(room)]).data["exists"] == .bool(true)
    }

    /// The public rooms: number, description and how many are in each.
    public func list() async throws -> [(room: Int64, description: String?, participants: Int)] {
        guard case .array(let rooms)? = try await send("list").data["list"] else { return [] }
        return rooms.compactMap { room in
            room["room"]?.int64.map { ($0, room["description"]?.stringValue, Int(room["num_participants"]?.int64 ?? 0)) }
        }
    }

    public func listParticipants(room: Int64) async throws -> [AudioBridgeParticipant] {
        AudioBridgeParticipant.list(try await send("listparticipants", ["room": Self.number(room)]).data["participants"])
    }

    /// Changes who may join: `enable`/`disable` the check, `add`/`remove` tokens.
    public func allowed(room: Int64, secret: String?, action: String, tokens: [String] = []) async throws {
        var fields: [String: JSONValue] = ["room": Self.number(room), "action": .string(action)]
        if let secret { fields["secret"] = .string(secret) }
        if !tokens.isEmpty { fields["allowed"] = .array(tokens.map { .string($0) }) }
        _ = try await send("allowed", fields)
    }

    public func kick(room: Int64, secret: String?, id: Int64) async throws {
        var fields: [String: JSONValue] = ["room": Self.number(room), "id": Self.number(id)]
        if let secret { fields["secret"] = .string(secret) }
        _ = try await send("kick", fields)
    }

    /// Mutes or unmutes another participant (a moderator's request).
    public func setMuted(_ muted: Bool, room: Int64, secret: String?, id: Int64) async throws {
        var fields: [String: JSONValue] = ["room": Self.number(room), "id": Self.number(id)]
        if let secret { fields["secret"] = .string(secret) }
        _ = try await send(muted ? "mute" : "unmute", fields)
    }

    // MARK: Participating

    /// Joins; answers our participant id and who is already there.
    /// - Parameter id: our participant id (Janus picks one when nil).
    public func join(room: Int64, display: String?, token: String? = nil, pin: String? = nil, muted: Bool? = nil, id: Int64? = nil) async throws -> (id: Int64, participants: [AudioBridgeParticipant]) {
        var fields: [String: JSONValue] = ["room": Self.number(room)]
        if let id { fields["id"] = Self.number(id) }
        if let display { fields["display"] = .string(display) }
        if let token { fields["token"] = .string(token) }
        if let pin { fields["pin"] = .string(pin) }
        if let muted { fields["muted"] = .bool(muted) }
        let answer = try await send("join", fields)
        guard let id = answer.data["id"]?.int64 else { throw JanusError.malformed("join: no id") }
        return (id, AudioBridgeParticipant.list(answer.data["participants"]))
    }

    /// Mute, bitrate, expected loss; with an SDP offer, answers Janus's SDP answer.
    @discardableResult
    public func configure(muted: Bool? = nil, bitrate: Int? = nil, expectedLoss: Int? = nil, display: String? = nil, offer: JSEP? = nil) async throws -> JSEP? {
        var fields: [String: JSONValue] = [:]
        if let muted { fields["muted"] = .bool(muted) }
        if let bitrate { fields["bitrate"] = .number(Double(bitrate)) }
        if let expectedLoss { fields["expected_loss"] = .number(Double(expectedLoss)) }
        if let display { fields["display"] = .string(display) }
        return try await send("configure", fields, jsep: offer).jsep
    }

    public func changeRoom(to room: Int64, display: String?, token: String? = nil) async throws {
        var fields: [String: JSONValue] = ["room": Self.number(room)]
        if let display { fields["display"] = .string(display) }
        if let token { fields["token"] = .string(token) }
        _ = try await send("changeroom", fields)
    }

    public func leave() async throws {
        _ = try await send("leave")
    }

    public func hangup() async throws { try await client.hangup(handle) }
    public func detach() async throws { try await client.detach(handle) }
}
