import ParleyProtocol

/// The body of the VoIP push for `call.incoming` (protocol v1, "Devices and push").
public struct VoIPPushPayload: Hashable, Sendable, Codable {
    public struct Body: Hashable, Sendable, Codable {
        public struct From: Hashable, Sendable, Codable {
            public var user: UserID
            public var name: String?
        }

        public var call: CallID
        public var from: From
        public var media: MediaSpec
        public var expiresAt: Int64
    }

    public var parley: Body
}

/// One VoIP push to send: to whom, and the APNs headers protocol v1 prescribes.
public struct VoIPPush: Hashable, Sendable {
    public var user: UserID
    public var device: DeviceID
    public var registration: VoIPRegistration
    public var payload: VoIPPushPayload

    /// `apns-topic`: the app's bundle id with `.voip`.
    public var topic: String { registration.topic + ".voip" }
    /// `apns-expiration`, Unix seconds: the invite's expiry.
    public var expiration: Int64 { payload.parley.expiresAt / 1000 }
    public let pushType = "voip"
    public let priority = 10
}

public enum VoIPPushOutcome: Sendable, Equatable {
    case delivered
    /// APNs answered 410, `BadDeviceToken` or `Unregistered`: the token must be forgotten.
    case tokenInvalid
    case failed(String)
}

/// Sends VoIP pushes (APNs in production). The server forgets tokens that come back `tokenInvalid`.
public protocol VoIPPushSender: Sendable {
    func send(_ push: VoIPPush) async -> VoIPPushOutcome
}
