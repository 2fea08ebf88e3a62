import Foundation

// Frames the server sends. `welcome` carries no `seq`; every later frame does (see `ServerFrame`).

public struct Welcome: Hashable, Sendable, Codable {
    public var re: String
    public var session: String
    public var user: UserID
    public var device: DeviceID
    public var resumed: Bool
    /// Seconds between client heartbeats; a connection silent for 3 × this is closed with 4002.
    public var heartbeat: Int
    public var iceServers: [IceServer]

    public init(re: String, session: String, user: UserID, device: DeviceID, resumed: Bool, heartbeat: Int, iceServers: [IceServer]) {
        self.re = re
        self.session = session
        self.user = user
        self.device = device
        self.resumed = resumed
        self.heartbeat = heartbeat
        self.iceServers = iceServers
    }
}

/// The answer to a request. Result fields sit beside `re` in the same object.
public struct Ack: Hashable, Sendable {
    public var re: String
    public var result: AckResult

    public init(re: String, result: AckResult = .done) {
        self.re = re
        self.result = result
    }

    /// The result decoded as `type`: the request an ack answers says which type its fields are.
    /// A typed result of that type is returned as it is; fields read off the wire are decoded.
    public func decodeResult<T: Decodable>(_ type: T.Type) throws -> T {
        try result.decoded(as: T.self)
    }
}

/// What an ack says beside `re`. The server builds each result as its type and encodes it once;
/// a client reads the fields, and learns their type from the request they answer
/// (`Ack.decodeResult`).
public enum AckResult: Sendable {
    /// Done, and nothing more to say (most requests).
    case done
    case callInvite(CallInviteResult)
    case callState(CallStateResult)
    case recording(RecordingStepResult)
    case roomJoin(RoomJoinResult)
    case roomLeave(RoomLeaveResult)
    /// Fields as read off the wire (or from another node), not yet given a type.
    case fields([String: JSONValue])

    /// The typed result, if there is one.
    var value: (any Encodable & Sendable)? {
        switch self {
        case .done, .fields: nil
        case .callInvite(let result): result
        case .callState(let result): result
        case .recording(let result): result
        case .roomJoin(let result): result
        case .roomLeave(let result): result
        }
    }
}

extension AckResult {
    /// The result as `T`: as it is when it has that type, or read from its fields (a result off
    /// the wire, or from another node).
    public func decoded<T: Decodable>(as type: T.Type) throws -> T {
        if let value = value as? T { return value }
        return try JSONDecoder().decode(T.self, from: JSONEncoder().encode(self))
    }
}

/// Two results are equal when they put the same fields on the wire, typed or not.
extension AckResult: Hashable {
    /// The fields this result puts beside `re`.
    public var fields: [String: JSONValue] {
        switch self {
        case .done: [:]
        case .fields(let fields): fields
        default: (try? JSONDecoder().decode([String: JSONValue].self, from: JSONEncoder().encode(self))) ?? [:]
        }
    }

    public static func == (lhs: AckResult, rhs: AckResult) -> Bool { lhs.fields == rhs.fields }
    public func hash(into hasher: inout Hasher) { hasher.combine(fields) }
}

/// An ack's result is a JSON object of fields, which sit beside `re` in the ack (its encoder's own
/// keyed container is shared). Read back, it is `.fields` (`.done` when there are none).
extension AckResult: Codable {
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: AnyKey.self)
        var fields: [String: JSONValue] = [:]
        for key in container.allKeys where !Ack.frameKeys.contains(key.stringValue) {
            fields[key.stringValue] = try container.decode(JSONValue.self, forKey: key)
        }
        self = fields.isEmpty ? .done : .fields(fields)
    }

    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .done:
            _ = encoder.container(keyedBy: AnyKey.self)
        case .fields(let fields):
            var container = encoder.container(keyedBy: AnyKey.self)
            for (key, value) in fields.sorted(by: { $0.key < $1.key }) {
                try container.encode(value, forKey: AnyKey(stringValue: key))
            }
        default:
            try value?.encode(to: encoder)
        }
    }
}

extension Ack: Codable {
    /// The keys of the frame around an ack's result.
    static let frameKeys: Set<String> = ["re", "type", "seq"]

    enum CodingKeys: String, CodingKey { case re }

    public init(from decoder: any Decoder) throws {
        re = try decoder.container(keyedBy: CodingKeys.self).decode(String.self, forKey: .re)
        result = try AckResult(from: decoder)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(re, forKey: .re)
        try result.encode(to: encoder)
    }
}

/// A JSON object's key, whatever its name.
struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

public struct ErrorMessage: Hashable, Sendable, Codable, Error {
    public var re: String?
    public var code: ErrorCode
    public var message: String

    public init(re: String? = nil, code: ErrorCode, message: String) {
        self.re = re
        self.code = code
        self.message = message
    }
}

public struct CallIncoming: Hashable, Sendable, Codable {
    public var call: CallID
    public var from: Party
    public var media: MediaSpec
    public var metadata: JSONValue?
    /// Unix milliseconds when the invite stops ringing.
    public var expiresAt: Int64

    public init(call: CallID, from: Party, media: MediaSpec, metadata: JSONValue? = nil, expiresAt: Int64) {
        self.call = call
        self.from = from
        self.media = media
        self.metadata = metadata
        self.expiresAt = expiresAt
    }
}

public struct CallRinging: Hashable, Sendable, Codable {
    public var call: CallID
    /// The callee device that rings (absent from older servers).
    public var device: DeviceID?
    /// That device takes an offer while it rings (it sent `call.ringing {early: true}`).
    public var early: Bool?

    public init(call: CallID, device: DeviceID? = nil, early: Bool? = nil) {
        self.call = call
        self.device = device
        self.early = early
    }
}

public struct CallAccepted: Hashable, Sendable, Codable {
    public var call: CallID
    /// The callee device that accepted.
    public var device: DeviceID

    public init(call: CallID, device: DeviceID) {
        self.call = call
        self.device = device
    }
}

public struct CallEnded: Hashable, Sendable, Codable {
    public var call: CallID
    public var reason: EndReason
    public var detail: String?
    /// Unix milliseconds.
    public var endedAt: Int64
    /// Seconds from answer to end; absent if the call was never answered.
    public var duration: Double?

    public init(call: CallID, reason: EndReason, detail: String? = nil, endedAt: Int64, duration: Double? = nil) {
        self.call = call
        self.reason = reason
        self.detail = detail
        self.endedAt = endedAt
        self.duration = duration
    }
}

public struct CallSignalled: Hashable, Sendable, Codable {
    public var call: CallID
    public var from: Party
    public var signal: SignalPayload

    public init(call: CallID, from: Party, signal: SignalPayload) {
        self.call = call
        self.from = from
        self.signal = signal
    }

    enum CodingKeys: String, CodingKey { case call, from }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        call = try container.decode(CallID.self, forKey: .call)
        from = try container.decode(Party.self, forKey: .from)
        signal = try SignalPayload(from: decoder.container(keyedBy: SignalPayload.CodingKeys.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(call, forKey: .call)
        try container.encode(from, forKey: .from)
        var signalContainer = encoder.container(keyedBy: SignalPayload.CodingKeys.self)
        try signal.encode(to: &signalContainer)
    }
}

public struct CallUpdated: Hashable, Sendable, Codable {
    public var call: CallID
    public var from: Party
    public var muted: Bool?
    public var held: Bool?
    public var video: Bool?
    public var recording: RecordingStep?

    public init(call: CallID, from: Party, muted: Bool? = nil, held: Bool? = nil, video: Bool? = nil,
                recording: RecordingStep? = nil) {
        self.call = call
        self.from = from
        self.muted = muted
        self.held = held
        self.video = video
        self.recording = recording
    }
}

public struct RoomParticipant: Hashable, Sendable, Codable {
    public var user: UserID
    public var device: DeviceID
    public var display: String?

    public init(user: UserID, device: DeviceID, display: String? = nil) {
        self.user = user
        self.device = device
        self.display = display
    }
}

public struct RoomParticipantJoined: Hashable, Sendable, Codable {
    public var room: RoomID
    public var user: UserID
    public var device: DeviceID
    public var display: String?

    public init(room: RoomID, participant: RoomParticipant) {
        self.room = room
        self.user = participant.user
        self.device = participant.device
        self.display = participant.display
    }
}

public struct RoomParticipantLeft: Hashable, Sendable, Codable {
    public var room: RoomID
    public var user: UserID
    public var device: DeviceID

    public init(room: RoomID, user: UserID, device: DeviceID) {
        self.room = room
        self.user = user
        self.device = device
    }
}

public struct RoomSignalled: Hashable, Sendable, Codable {
    public var room: RoomID
    public var from: Party
    public var signal: SignalPayload

    public init(room: RoomID, from: Party, signal: SignalPayload) {
        self.room = room
        self.from = from
        self.signal = signal
    }

    enum CodingKeys: String, CodingKey { case room, from }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        room = try container.decode(RoomID.self, forKey: .room)
        from = try container.decode(Party.self, forKey: .from)
        signal = try SignalPayload(from: decoder.container(keyedBy: SignalPayload.CodingKeys.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(room, forKey: .room)
        try container.encode(from, forKey: .from)
        var signalContainer = encoder.container(keyedBy: SignalPayload.CodingKeys.self)
        try signal.encode(to: &signalContainer)
    }
}

/// How a room carries audio.
public struct RoomMedia: Hashable, Sendable, Codable {
    public struct Janus: Hashable, Sendable, Codable {
        public var url: String
        public var room: Int64
        public var token: String
        /// The participant id to `join` with (Parley's addition): the server kicks the device by it.
        public var participant: Int64?

        public init(url: String, room: Int64, token: String, participant: Int64? = nil) {
            self.url = url
            self.room = room
            self.token = token
            self.participant = participant
        }
    }

    public var mode: String
    public var janus: Janus?

    public init(mode: String, janus: Janus? = nil) {
        self.mode = mode
        self.janus = janus
    }

    public static let mesh = RoomMedia(mode: "mesh")
    public static func audioBridge(_ janus: Janus) -> RoomMedia { RoomMedia(mode: "audiobridge", janus: janus) }
}

/// The result fields of the ack to `room.join`.
public struct RoomJoinResult: Hashable, Sendable, Codable {
    public var room: RoomID
    /// The devices already in the room, not the joiner.
    public var participants: [RoomParticipant]
    public var media: RoomMedia

    public init(room: RoomID, participants: [RoomParticipant], media: RoomMedia) {
        self.room = room
        self.participants = participants
        self.media = media
    }
}

/// The result fields of the ack to `call.state`.
public struct CallStateResult: Hashable, Sendable, Codable {
    public var call: CallID
    public var state: CallPhase
    public var reason: EndReason?
    /// Where recording with consent stands, for a call in progress.
    public var recording: RecordingState?

    public init(call: CallID, state: CallPhase, reason: EndReason? = nil, recording: RecordingState? = nil) {
        self.call = call
        self.state = state
        self.reason = reason
        self.recording = recording
    }
}

/// The result fields of the ack to `room.leave`: `revocationPending` when Janus could not be
/// reached to remove the device's token (the server keeps trying); absent once it is removed.
public struct RoomLeaveResult: Hashable, Sendable, Codable {
    public var revocationPending: Bool?

    public init(revocationPending: Bool? = nil) { self.revocationPending = revocationPending }
}

/// The result fields of the ack to `call.invite` (an extension of protocol v1: clients may ignore them).
public struct CallInviteResult: Hashable, Sendable, Codable {
    public var call: CallID
    /// How many of the callee's devices hold a live or resumable session and were rung.
    public var devices: Int
    /// How many of the callee's devices were sent a VoIP push.
    public var pushed: Int
    public var expiresAt: Int64

    public init(call: CallID, devices: Int, pushed: Int, expiresAt: Int64) {
        self.call = call
        self.devices = devices
        self.pushed = pushed
        self.expiresAt = expiresAt
    }
}

/// Every frame the server can send.
public enum ServerMessage: Hashable, Sendable {
    case welcome(Welcome)
    case ack(Ack)
    case error(ErrorMessage)
    case callIncoming(CallIncoming)
    case callRinging(CallRinging)
    case callAccepted(CallAccepted)
    case callEnded(CallEnded)
    case callSignal(CallSignalled)
    case callUpdated(CallUpdated)
    case roomParticipantJoined(RoomParticipantJoined)
    case roomParticipantLeft(RoomParticipantLeft)
    case roomSignal(RoomSignalled)

    public var type: String {
        switch self {
        case .welcome: "welcome"
        case .ack: "ack"
        case .error: "error"
        case .callIncoming: "call.incoming"
        case .callRinging: "call.ringing"
        case .callAccepted: "call.accepted"
        case .callEnded: "call.ended"
        case .callSignal: "call.signal"
        case .callUpdated: "call.updated"
        case .roomParticipantJoined: "room.participant.joined"
        case .roomParticipantLeft: "room.participant.left"
        case .roomSignal: "room.signal"
        }
    }

    fileprivate func encodeBody(to encoder: any Encoder) throws {
        switch self {
        case .welcome(let m): try m.encode(to: encoder)
        case .ack(let m): try m.encode(to: encoder)
        case .error(let m): try m.encode(to: encoder)
        case .callIncoming(let m): try m.encode(to: encoder)
        case .callRinging(let m): try m.encode(to: encoder)
        case .callAccepted(let m): try m.encode(to: encoder)
        case .callEnded(let m): try m.encode(to: encoder)
        case .callSignal(let m): try m.encode(to: encoder)
        case .callUpdated(let m): try m.encode(to: encoder)
        case .roomParticipantJoined(let m): try m.encode(to: encoder)
        case .roomParticipantLeft(let m): try m.encode(to: encoder)
        case .roomSignal(let m): try m.encode(to: encoder)
        }
    }

    fileprivate init(type: String, from decoder: any Decoder) throws {
        switch type {
        case "welcome": self = .welcome(try Welcome(from: decoder))
        case "ack": self = .ack(try Ack(from: decoder))
        case "error": self = .error(try ErrorMessage(from: decoder))
        case "call.incoming": self = .callIncoming(try CallIncoming(from: decoder))
        case "call.ringing": self = .callRinging(try CallRinging(from: decoder))
        case "call.accepted": self = .callAccepted(try CallAccepted(from: decoder))
        case "call.ended": self = .callEnded(try CallEnded(from: decoder))
        case "call.signal": self = .callSignal(try CallSignalled(from: decoder))
        case "call.updated": self = .callUpdated(try CallUpdated(from: decoder))
        case "room.participant.joined": self = .roomParticipantJoined(try RoomParticipantJoined(from: decoder))
        case "room.participant.left": self = .roomParticipantLeft(try RoomParticipantLeft(from: decoder))
        case "room.signal": self = .roomSignal(try RoomSignalled(from: decoder))
        default: throw UnknownMessageType(type: type)
        }
    }
}

/// One server frame on the wire: a message and, for every frame after `welcome`, its `seq`.
public struct ServerFrame: Hashable, Sendable, Codable {
    public var seq: Int?
    public var message: ServerMessage

    public init(seq: Int?, message: ServerMessage) {
        self.seq = seq
        self.message = message
    }

    enum CodingKeys: String, CodingKey { case type, seq }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        seq = try container.decodeIfPresent(Int.self, forKey: .seq)
        message = try ServerMessage(type: container.decode(String.self, forKey: .type), from: decoder)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(message.type, forKey: .type)
        try container.encodeIfPresent(seq, forKey: .seq)
        try message.encodeBody(to: encoder)
    }
}
