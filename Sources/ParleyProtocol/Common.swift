/// The other party of a frame: `{"user", "device"}`; `call.incoming` adds `name`.
public struct Party: Hashable, Sendable, Codable {
    public var user: UserID
    public var device: DeviceID
    public var name: String?
    /// The caller's network address, in `call.incoming` from a LAN listener only: on a shared
    /// network the callee sees where a call comes from, not just the name the caller chose.
    public var address: String?

    public init(user: UserID, device: DeviceID, name: String? = nil, address: String? = nil) {
        self.user = user
        self.device = device
        self.name = name
        self.address = address
    }
}

public struct MediaSpec: Hashable, Sendable, Codable {
    public var audio: Bool
    public var video: Bool

    public init(audio: Bool = true, video: Bool = false) {
        self.audio = audio
        self.video = video
    }

    public static let audioOnly = MediaSpec(audio: true, video: false)
}

/// An SDP offer, answer, pranswer or rollback.
public struct SessionDescription: Hashable, Sendable, Codable {
    public var type: String
    public var sdp: String

    public init(type: String, sdp: String) {
        self.type = type
        self.sdp = sdp
    }
}

public struct IceCandidate: Hashable, Sendable, Codable {
    public var candidate: String
    public var sdpMid: String?
    public var sdpMLineIndex: Int?
    public var usernameFragment: String?

    public init(candidate: String, sdpMid: String? = nil, sdpMLineIndex: Int? = nil, usernameFragment: String? = nil) {
        self.candidate = candidate
        self.sdpMid = sdpMid
        self.sdpMLineIndex = sdpMLineIndex
        self.usernameFragment = usernameFragment
    }
}

/// The `candidate` field of a signal: a candidate, or JSON `null` for end of candidates.
public enum CandidateSignal: Hashable, Sendable {
    case candidate(IceCandidate)
    case endOfCandidates
}

/// What `call.signal` and `room.signal` carry: a description, a candidate, or both; in a call, the
/// polite peer's request for an ICE restart (`restartIce: true`, an addition to protocol v1).
public struct SignalPayload: Hashable, Sendable {
    public var description: SessionDescription?
    public var candidate: CandidateSignal?
    /// The polite peer asks the impolite one to restart ICE: only the impolite peer makes restart
    /// offers, so two restarts never collide (webrtcbin cannot roll an offer back).
    public var restartIce: Bool

    public init(description: SessionDescription? = nil, candidate: CandidateSignal? = nil, restartIce: Bool = false) {
        self.description = description
        self.candidate = candidate
        self.restartIce = restartIce
    }

    public var isEmpty: Bool { description == nil && candidate == nil && !restartIce }

    enum CodingKeys: String, CodingKey { case description, candidate, restartIce }

    init(from container: KeyedDecodingContainer<CodingKeys>) throws {
        description = try container.decodeIfPresent(SessionDescription.self, forKey: .description)
        if container.contains(.candidate) {
            if try container.decodeNil(forKey: .candidate) {
                candidate = .endOfCandidates
            } else {
                candidate = .candidate(try container.decode(IceCandidate.self, forKey: .candidate))
            }
        }
        restartIce = try container.decodeIfPresent(Bool.self, forKey: .restartIce) ?? false
    }

    func encode(to container: inout KeyedEncodingContainer<CodingKeys>) throws {
        try container.encodeIfPresent(description, forKey: .description)
        switch candidate {
        case .candidate(let candidate)?: try container.encode(candidate, forKey: .candidate)
        case .endOfCandidates?: try container.encodeNil(forKey: .candidate)
        case nil: break
        }
        // Only when asked: a v1 peer that does not know the field never sees it.
        if restartIce { try container.encode(true, forKey: .restartIce) }
    }
}

public struct IceServer: Hashable, Sendable, Codable {
    public var urls: [String]
    public var username: String?
    public var credential: String?

    public init(urls: [String], username: String? = nil, credential: String? = nil) {
        self.urls = urls
        self.username = username
        self.credential = credential
    }
}

/// Call quality as a client measured it, sent with `call.report` and stored with the call record.
public struct CallQuality: Hashable, Sendable, Codable {
    public var mos: Double?
    public var rttMs: Double?
    public var jitterMs: Double?
    public var lossPct: Double?
    public var bitrateKbps: Double?

    public init(mos: Double? = nil, rttMs: Double? = nil, jitterMs: Double? = nil, lossPct: Double? = nil, bitrateKbps: Double? = nil) {
        self.mos = mos
        self.rttMs = rttMs
        self.jitterMs = jitterMs
        self.lossPct = lossPct
        self.bitrateKbps = bitrateKbps
    }
}

/// Client platforms, as in `hello.client.platform` and `PUT /v1/devices`.
public struct Platform: RawRepresentable, Hashable, Sendable, Codable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let ios = Platform(rawValue: "ios")
    public static let android = Platform(rawValue: "android")
    public static let web = Platform(rawValue: "web")
    public static let linux = Platform(rawValue: "linux")
    public static let known: Set<Platform> = [.ios, .android, .web, .linux]
}

/// Why a call ended, as carried by `call.ended.reason` and call records.
public struct EndReason: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }

    public static let hangup = EndReason(rawValue: "hangup")
    public static let cancelled = EndReason(rawValue: "cancelled")
    public static let declined = EndReason(rawValue: "declined")
    public static let busy = EndReason(rawValue: "busy")
    public static let answeredElsewhere = EndReason(rawValue: "answered-elsewhere")
    public static let declinedElsewhere = EndReason(rawValue: "declined-elsewhere")
    public static let noAnswer = EndReason(rawValue: "no-answer")
    public static let connectionLost = EndReason(rawValue: "connection-lost")
    /// The server stopped while the call was ringing or active (an extension of protocol v1).
    public static let serverShutdown = EndReason(rawValue: "server-shutdown")
    /// A client ends a call with this when, after a new session, the server answers `call.state`
    /// with `call_not_found`: the server lost the call (protocol v1, "Restarts and several nodes").
    public static let serverLostCall = EndReason(rawValue: "server-lost-call")
}

/// The server's view of a call: `ringing → active → ended` or `ringing → ended`.
public enum CallPhase: String, Hashable, Sendable, Codable {
    case ringing
    case active
    case ended
}

/// Protocol error codes. Codes are for programs; messages are for humans.
public struct ErrorCode: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }

    public static let badRequest = ErrorCode(rawValue: "bad_request")
    public static let unauthorized = ErrorCode(rawValue: "unauthorized")
    public static let forbidden = ErrorCode(rawValue: "forbidden")
    public static let notFound = ErrorCode(rawValue: "not_found")
    public static let rateLimited = ErrorCode(rawValue: "rate_limited")
    public static let payloadTooLarge = ErrorCode(rawValue: "payload_too_large")
    public static let callNotFound = ErrorCode(rawValue: "call_not_found")
    public static let callAlreadyAnswered = ErrorCode(rawValue: "call_already_answered")
    public static let callNotConnected = ErrorCode(rawValue: "call_not_connected")
    public static let callEnded = ErrorCode(rawValue: "call_ended")
    public static let notInRoom = ErrorCode(rawValue: "not_in_room")
    public static let roomFull = ErrorCode(rawValue: "room_full")
    public static let unavailable = ErrorCode(rawValue: "unavailable")
    public static let unsupported = ErrorCode(rawValue: "unsupported")
    public static let `internal` = ErrorCode(rawValue: "internal")
    /// A recording step that does not fit the call's recording state (consent to nothing asked,
    /// a second request, consent to one's own request).
    public static let recordingState = ErrorCode(rawValue: "recording_state")

    public static let all: [ErrorCode] = [
        .badRequest, .unauthorized, .forbidden, .notFound, .rateLimited, .payloadTooLarge, .callNotFound,
        .callAlreadyAnswered, .callNotConnected, .callEnded, .notInRoom, .roomFull, .unavailable, .unsupported, .internal,
        .recordingState,
    ]
}

/// WebSocket close codes of protocol v1.
public enum CloseCode: UInt16, Sendable, CaseIterable {
    case normal = 1000
    case goingAway = 1001
    case unsupportedData = 1003
    case policy = 1008
    case tooBig = 1009
    case helloTimeout = 4001
    case heartbeatTimeout = 4002
    case tokenInvalid = 4003
    case rateLimited = 4008
    case replaced = 4009
    /// The client read too slowly: its frames filled the server's outbound buffer. Reconnect and
    /// resume: the frames it missed are in the session's resume buffer.
    case tooSlow = 4010

    /// Whether a client should reconnect and resume its session after this close.
    public var shouldResume: Bool {
        switch self {
        case .goingAway, .heartbeatTimeout, .tokenInvalid, .tooSlow: return true
        case .normal, .unsupportedData, .policy, .tooBig, .helloTimeout, .rateLimited, .replaced: return false
        }
    }
}
