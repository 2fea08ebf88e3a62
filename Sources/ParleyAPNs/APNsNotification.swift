import Foundation

/// Which of Apple's two push services a device token belongs to. A token from a development
/// build is known only to the sandbox, one from the App Store or TestFlight only to production.
public enum APNsEnvironment: String, Sendable, Hashable, CaseIterable {
    case production, sandbox
}

/// One notification for one device, with the headers APNs reads ("Sending notification requests to APNs").
public struct APNsNotification: Sendable, Hashable {
    public enum PushType: String, Sendable, Hashable {
        /// Wakes the app through PushKit; the app must report a call to CallKit.
        case voip
        /// Shown to the user by the system.
        case alert
    }

    /// The device token, in hex.
    public var deviceToken: String
    public var environment: APNsEnvironment
    public var pushType: PushType
    /// `apns-topic`: the bundle id, with `.voip` for VoIP pushes.
    public var topic: String
    /// `apns-priority`: 10 sends at once.
    public var priority: Int
    /// `apns-expiration`: Unix seconds after which APNs stops trying (0: one attempt only).
    public var expiration: Int64
    /// `apns-id`: APNs echoes it and reports it in its logs.
    public var id: UUID
    /// The JSON body.
    public var payload: Data

    /// APNs refuses larger bodies (`PayloadTooLarge`): 5 KiB for VoIP pushes, 4 KiB for the others.
    public var maximumPayloadSize: Int { pushType == .voip ? 5120 : 4096 }

    public init(deviceToken: String, environment: APNsEnvironment, pushType: PushType, topic: String, priority: Int = 10,
                expiration: Int64, id: UUID = UUID(), payload: Data) {
        self.deviceToken = deviceToken
        self.environment = environment
        self.pushType = pushType
        self.topic = topic
        self.priority = priority
        self.expiration = expiration
        self.id = id
        self.payload = payload
    }
}

/// What became of a notification, after the retries APNs' answer allows.
public enum APNsResult: Sendable, Hashable {
    /// APNs accepted it (200); `apnsID` is the id it reported.
    case delivered(apnsID: String)
    /// The token is no good: 400 `BadDeviceToken`, or 410 (`Unregistered`, `ExpiredToken`) with the
    /// time APNs last knew it valid. A token registered again after that time is still good.
    case tokenRejected(reason: String, since: Date?)
    /// Anything else: the status (nil when no answer came), APNs' reason, and the id if it sent one.
    case failed(status: Int?, reason: String, apnsID: String?)
}

/// One request to APNs and its answer, for metrics.
public struct APNsExchange: Sendable {
    public var pushType: APNsNotification.PushType
    /// nil when the request got no answer (connection refused, dropped, timed out).
    public var status: Int?
    public var reason: String?
    public var duration: Duration
}

/// The reasons APNs gives in the body of an error answer (`{"reason": "…"}`).
public enum APNsReason {
    public static let badDeviceToken = "BadDeviceToken"
    public static let unregistered = "Unregistered"
    public static let expiredToken = "ExpiredToken"
    public static let expiredProviderToken = "ExpiredProviderToken"
    public static let invalidProviderToken = "InvalidProviderToken"
    public static let missingProviderToken = "MissingProviderToken"
    public static let tooManyProviderTokenUpdates = "TooManyProviderTokenUpdates"
    public static let tooManyRequests = "TooManyRequests"
    public static let payloadTooLarge = "PayloadTooLarge"
}
