// Frames a client sends. Every request carries `id` (1–64 characters, unique within the session).

public struct ClientInfo: Hashable, Sendable, Codable {
    public var name: String?
    public var version: String?
    public var platform: Platform?

    public init(name: String? = nil, version: String? = nil, platform: Platform? = nil) {
        self.name = name
        self.version = version
        self.platform = platform
    }
}

public struct ResumeRequest: Hashable, Sendable, Codable {
    public var session: String
    public var lastSeq: Int

    public init(session: String, lastSeq: Int) {
        self.session = session
        self.lastSeq = lastSeq
    }
}

public struct Hello: Hashable, Sendable, Codable {
    public var id: String
    public var device: DeviceID
    public var client: ClientInfo?
    public var resume: ResumeRequest?

    public init(id: String, device: DeviceID, client: ClientInfo? = nil, resume: ResumeRequest? = nil) {
        self.id = id
        self.device = device
        self.client = client
        self.resume = resume
    }
}

public struct Ping: Hashable, Sendable, Codable {
    public var id: String
    public init(id: String) { self.id = id }
}

/// `{"type": "ack", "seq": N}` from a client: server frames up to N arrived.
public struct SeqAck: Hashable, Sendable, Codable {
    public var seq: Int
    public init(seq: Int) { self.seq = seq }
}

public struct CallInvite: Hashable, Sendable, Codable {
    public var id: String
    public var call: CallID
    public var to: UserID
    public var media: MediaSpec
    public var metadata: JSONValue?

    public init(id: String, call: CallID, to: UserID, media: MediaSpec = .audioOnly, metadata: JSONValue? = nil) {
        self.id = id
        self.call = call
        self.to = to
        self.media = media
        self.metadata = metadata
    }
}

/// `call.ringing`: a callee device rings. `early: true` says it takes the caller's offer while it
/// rings (connect while ringing, protocol.md): the caller may then set the media path up with it
/// before anyone answers, sending and playing nothing until the answer.
public struct CallRingingRequest: Hashable, Sendable, Codable {
    public var id: String
    public var call: CallID
    public var early: Bool?

    public init(id: String, call: CallID, early: Bool? = nil) {
        self.id = id
        self.call = call
        self.early = early
    }
}

/// `call.accept`, `call.state`: a request about one call with no other fields.
public struct CallRequest: Hashable, Sendable, Codable {
    public var id: String
    public var call: CallID

    public init(id: String, call: CallID) {
        self.id = id
        self.call = call
    }
}

public struct CallDecline: Hashable, Sendable, Codable {
    public var id: String
    public var call: CallID
    /// `declined` (the default) or `busy`.
    public var reason: EndReason?

    public init(id: String, call: CallID, reason: EndReason? = nil) {
        self.id = id
        self.call = call
        self.reason = reason
    }
}

public struct CallHangup: Hashable, Sendable, Codable {
    public var id: String
    public var call: CallID
    /// Free text that travels to the other parties as `detail`.
    public var reason: String?

    public init(id: String, call: CallID, reason: String? = nil) {
        self.id = id
        self.call = call
        self.reason = reason
    }
}

public struct CallSignal: Hashable, Sendable, Codable {
    public var id: String
    public var call: CallID
    public var signal: SignalPayload
    /// The callee device a caller's signal is for while the call rings (one that rang with
    /// `early: true`); after the answer, absent or the device that answered.
    public var device: DeviceID?

    public init(id: String, call: CallID, signal: SignalPayload, device: DeviceID? = nil) {
        self.id = id
        self.call = call
        self.signal = signal
        self.device = device
    }

    enum CodingKeys: String, CodingKey { case id, call, device }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(String.self, forKey: .id)
        call = try container.decode(CallID.self, forKey: .call)
        device = try container.decodeIfPresent(DeviceID.self, forKey: .device)
        signal = try SignalPayload(from: decoder.container(keyedBy: SignalPayload.CodingKeys.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(call, forKey: .call)
        try container.encodeIfPresent(device, forKey: .device)
        var signalContainer = encoder.container(keyedBy: SignalPayload.CodingKeys.self)
        try signal.encode(to: &signalContainer)
    }
}

public struct CallUpdate: Hashable, Sendable, Codable {
    public var id: String
    public var call: CallID
    public var muted: Bool?
    public var held: Bool?
    public var video: Bool?
    /// A step of recording with consent; sent on its own, without the other fields.
    public var recording: RecordingStep?

    public init(id: String, call: CallID, muted: Bool? = nil, held: Bool? = nil, video: Bool? = nil,
                recording: RecordingStep? = nil) {
        self.id = id
        self.call = call
        self.muted = muted
        self.held = held
        self.video = video
        self.recording = recording
    }
}

public struct CallReport: Hashable, Sendable, Codable {
    public var id: String
    public var call: CallID
    public var quality: CallQuality

    public init(id: String, call: CallID, quality: CallQuality) {
        self.id = id
        self.call = call
        self.quality = quality
    }
}

public struct RoomJoin: Hashable, Sendable, Codable {
    public var id: String
    public var room: RoomID
    public var display: String?
    /// In an AudioBridge room: the Janus participant this device already is there (the
    /// `participant` of an earlier ack). The server keeps that admission when it can, instead of
    /// making a new one and kicking this one; the ack says which it did.
    public var participant: Int64?

    public init(id: String, room: RoomID, display: String? = nil, participant: Int64? = nil) {
        self.id = id
        self.room = room
        self.display = display
        self.participant = participant
    }
}

public struct RoomLeave: Hashable, Sendable, Codable {
    public var id: String
    public var room: RoomID

    public init(id: String, room: RoomID) {
        self.id = id
        self.room = room
    }
}

public struct RoomSignal: Hashable, Sendable, Codable {
    public var id: String
    public var room: RoomID
    public var to: DeviceID
    public var signal: SignalPayload

    public init(id: String, room: RoomID, to: DeviceID, signal: SignalPayload) {
        self.id = id
        self.room = room
        self.to = to
        self.signal = signal
    }

    enum CodingKeys: String, CodingKey { case id, room, to }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(String.self, forKey: .id)
        room = try container.decode(RoomID.self, forKey: .room)
        to = try container.decode(DeviceID.self, forKey: .to)
        signal = try SignalPayload(from: decoder.container(keyedBy: SignalPayload.CodingKeys.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(room, forKey: .room)
        try container.encode(to, forKey: .to)
        var signalContainer = encoder.container(keyedBy: SignalPayload.CodingKeys.self)
        try signal.encode(to: &signalContainer)
    }
}

/// Every frame a client can send.
public enum ClientMessage: Hashable, Sendable {
    case hello(Hello)
    case ping(Ping)
    case ack(SeqAck)
    case callInvite(CallInvite)
    case callRinging(CallRingingRequest)
    case callAccept(CallRequest)
    case callDecline(CallDecline)
    case callSignal(CallSignal)
    case callUpdate(CallUpdate)
    case callHangup(CallHangup)
    case callReport(CallReport)
    case callState(CallRequest)
    case roomJoin(RoomJoin)
    case roomLeave(RoomLeave)
    case roomSignal(RoomSignal)

    public var type: String {
        switch self {
        case .hello: "hello"
        case .ping: "ping"
        case .ack: "ack"
        case .callInvite: "call.invite"
        case .callRinging: "call.ringing"
        case .callAccept: "call.accept"
        case .callDecline: "call.decline"
        case .callSignal: "call.signal"
        case .callUpdate: "call.update"
        case .callHangup: "call.hangup"
        case .callReport: "call.report"
        case .callState: "call.state"
        case .roomJoin: "room.join"
        case .roomLeave: "room.leave"
        case .roomSignal: "room.signal"
        }
    }

    /// The request id, for every frame but the client's `ack`.
    public var requestID: String? {
        switch self {
        case .hello(let m): m.id
        case .ping(let m): m.id
        case .ack: nil
        case .callInvite(let m): m.id
        case .callRinging(let m): m.id
        case .callAccept(let m), .callState(let m): m.id
        case .callDecline(let m): m.id
        case .callSignal(let m): m.id
        case .callUpdate(let m): m.id
        case .callHangup(let m): m.id
        case .callReport(let m): m.id
        case .roomJoin(let m): m.id
        case .roomLeave(let m): m.id
        case .roomSignal(let m): m.id
        }
    }

    /// The call a frame names, if any.
    public var callID: CallID? {
        switch self {
        case .callInvite(let m): m.call
        case .callRinging(let m): m.call
        case .callAccept(let m), .callState(let m): m.call
        case .callDecline(let m): m.call
        case .callSignal(let m): m.call
        case .callUpdate(let m): m.call
        case .callHangup(let m): m.call
        case .callReport(let m): m.call
        default: nil
        }
    }
}

extension ClientMessage: Codable {
    enum TypeKey: String, CodingKey { case type }

    public init(from decoder: any Decoder) throws {
        let type = try decoder.container(keyedBy: TypeKey.self).decode(String.self, forKey: .type)
        switch type {
        case "hello": self = .hello(try Hello(from: decoder))
        case "ping": self = .ping(try Ping(from: decoder))
        case "ack": self = .ack(try SeqAck(from: decoder))
        case "call.invite": self = .callInvite(try CallInvite(from: decoder))
        case "call.ringing": self = .callRinging(try CallRingingRequest(from: decoder))
        case "call.accept": self = .callAccept(try CallRequest(from: decoder))
        case "call.decline": self = .callDecline(try CallDecline(from: decoder))
        case "call.signal": self = .callSignal(try CallSignal(from: decoder))
        case "call.update": self = .callUpdate(try CallUpdate(from: decoder))
        case "call.hangup": self = .callHangup(try CallHangup(from: decoder))
        case "call.report": self = .callReport(try CallReport(from: decoder))
        case "call.state": self = .callState(try CallRequest(from: decoder))
        case "room.join": self = .roomJoin(try RoomJoin(from: decoder))
        case "room.leave": self = .roomLeave(try RoomLeave(from: decoder))
        case "room.signal": self = .roomSignal(try RoomSignal(from: decoder))
        default: throw UnknownMessageType(type: type)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: TypeKey.self)
        try container.encode(type, forKey: .type)
        switch self {
        case .hello(let m): try m.encode(to: encoder)
        case .ping(let m): try m.encode(to: encoder)
        case .ack(let m): try m.encode(to: encoder)
        case .callInvite(let m): try m.encode(to: encoder)
        case .callRinging(let m): try m.encode(to: encoder)
        case .callAccept(let m), .callState(let m): try m.encode(to: encoder)
        case .callDecline(let m): try m.encode(to: encoder)
        case .callSignal(let m): try m.encode(to: encoder)
        case .callUpdate(let m): try m.encode(to: encoder)
        case .callHangup(let m): try m.encode(to: encoder)
        case .callReport(let m): try m.encode(to: encoder)
        case .roomJoin(let m): try m.encode(to: encoder)
        case .roomLeave(let m): try m.encode(to: encoder)
        case .roomSignal(let m): try m.encode(to: encoder)
        }
    }
}

struct UnknownMessageType: Error {
    var type: String
}
