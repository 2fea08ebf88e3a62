// Bodies of the HTTP endpoints under /v1.

public struct VoIPRegistration: Hashable, Sendable, Codable {
    public enum Environment: String, Hashable, Sendable, Codable {
        case sandbox
        case production
    }

    /// The PushKit device token, hex.
    public var token: String
    /// The app's bundle id; pushes go to `<topic>.voip`.
    public var topic: String
    public var environment: Environment

    public init(token: String, topic: String, environment: Environment) {
        self.token = token
        self.topic = topic
        self.environment = environment
    }
}

/// `PUT /v1/devices/{device}`.
public struct DeviceRegistration: Hashable, Sendable, Codable {
    public var platform: Platform
    /// The PushKit token: VoIP pushes that ring the device.
    public var voip: VoIPRegistration?
    /// The app's notification token (`registerForRemoteNotifications`): alerts such as a missed
    /// call. A VoIP token cannot take them. Same fields; pushes go to `topic` itself.
    public var alerts: VoIPRegistration?

    public init(platform: Platform, voip: VoIPRegistration? = nil, alerts: VoIPRegistration? = nil) {
        self.platform = platform
        self.voip = voip
        self.alerts = alerts
    }
}

/// A registered device, as `PUT /v1/devices/{device}` answers it.
public struct DeviceRecord: Hashable, Sendable, Codable {
    public var user: UserID
    public var device: DeviceID
    public var platform: Platform
    public var voip: VoIPRegistration?
    public var alerts: VoIPRegistration?
    /// Unix milliseconds.
    public var updatedAt: Int64

    public init(user: UserID, device: DeviceID, platform: Platform, voip: VoIPRegistration?, alerts: VoIPRegistration? = nil,
                updatedAt: Int64) {
        self.user = user
        self.device = device
        self.platform = platform
        self.voip = voip
        self.alerts = alerts
        self.updatedAt = updatedAt
    }
}

/// One entry of `GET /v1/calls`.
public struct CallRecord: Hashable, Sendable, Codable {
    public var call: CallID
    public var caller: UserID
    public var callee: UserID
    public var callerDevice: DeviceID
    public var calleeDevice: DeviceID?
    public var media: MediaSpec
    /// Unix milliseconds.
    public var createdAt: Int64
    public var answeredAt: Int64?
    public var endedAt: Int64?
    public var reason: EndReason?
    /// Seconds from answer to end; absent if never answered.
    public var duration: Double?
    public var quality: CallQuality?
    /// The stretches of the call that were recorded, with whose consent; absent when none was.
    public var recordings: [RecordingRecord]?

    public init(call: CallID, caller: UserID, callee: UserID, callerDevice: DeviceID, calleeDevice: DeviceID? = nil,
                media: MediaSpec, createdAt: Int64, answeredAt: Int64? = nil, endedAt: Int64? = nil,
                reason: EndReason? = nil, duration: Double? = nil, quality: CallQuality? = nil,
                recordings: [RecordingRecord]? = nil) {
        self.call = call
        self.caller = caller
        self.callee = callee
        self.callerDevice = callerDevice
        self.calleeDevice = calleeDevice
        self.media = media
        self.createdAt = createdAt
        self.answeredAt = answeredAt
        self.endedAt = endedAt
        self.reason = reason
        self.duration = duration
        self.quality = quality
        self.recordings = recordings
    }
}

public struct CallList: Hashable, Sendable, Codable {
    public var calls: [CallRecord]
    public init(calls: [CallRecord]) { self.calls = calls }
}

public struct IceServersResponse: Hashable, Sendable, Codable {
    public var iceServers: [IceServer]
    /// Seconds the TURN credentials stay valid.
    public var ttl: Int

    public init(iceServers: [IceServer], ttl: Int) {
        self.iceServers = iceServers
        self.ttl = ttl
    }
}

/// `POST /v1/dev/tokens` (development mode only).
public struct DevTokenRequest: Hashable, Sendable, Codable {
    public var user: UserID
    public var name: String?

    public init(user: UserID, name: String? = nil) {
        self.user = user
        self.name = name
    }
}

/// `POST /v1/lan/tokens`: a caller asks a LAN listener (`parley listen --lan`) for a token, under the
/// user id and display name it chooses, with the listener's PIN when it advertises one.
public struct LANTokenRequest: Hashable, Sendable, Codable {
    public var user: UserID
    public var name: String?
    public var pin: String?

    public init(user: UserID, name: String? = nil, pin: String? = nil) {
        self.user = user
        self.name = name
        self.pin = pin
    }
}

public struct DevTokenResponse: Hashable, Sendable, Codable {
    public var token: String
    /// Unix milliseconds.
    public var expiresAt: Int64

    public init(token: String, expiresAt: Int64) {
        self.token = token
        self.expiresAt = expiresAt
    }
}

/// The body of an HTTP error: `{"error": {"code", "message"}}`.
public struct HTTPErrorBody: Hashable, Sendable, Codable {
    public struct Detail: Hashable, Sendable, Codable {
        public var code: ErrorCode
        public var message: String
    }

    public var error: Detail

    public init(code: ErrorCode, message: String) {
        self.error = Detail(code: code, message: message)
    }
}
