import Foundation
import ParleyProtocol

/// The body of the VoIP push for `call.incoming` (protocol v1, "Devices and push").
public struct VoIPPushPayload: Hashable, Sendable, Codable {
    public struct Body: Hashable, Sendable, Codable {
        public struct From: Hashable, Sendable, Codable {
            public var user: UserID
            public var name: String?

            public init(user: UserID, name: String?) {
                self.user = user
                self.name = name
            }
        }

        public var call: CallID
        public var from: From
        public var media: MediaSpec
        public var expiresAt: Int64

        public init(call: CallID, from: From, media: MediaSpec, expiresAt: Int64) {
            self.call = call
            self.from = from
            self.media = media
            self.expiresAt = expiresAt
        }
    }

    public var parley: Body

    public init(parley: Body) { self.parley = parley }
}

/// The body of the alert that tells a user of a call their push-woken device missed: shown by
/// iOS itself (`aps.alert`), with the call for the app (`parley.missedCall`).
public struct MissedCallAlert: Hashable, Sendable, Codable {
    public struct APS: Hashable, Sendable, Codable {
        public struct Alert: Hashable, Sendable, Codable {
            public var title: String
            public var body: String
        }

        public var alert: Alert
        public var sound: String
        /// Groups a caller's missed calls in Notification Center.
        public var threadID: String

        enum CodingKeys: String, CodingKey {
            case alert, sound
            case threadID = "thread-id"
        }
    }

    public struct Body: Hashable, Sendable, Codable {
        public struct MissedCall: Hashable, Sendable, Codable {
            public var call: CallID
            public var from: VoIPPushPayload.Body.From
            public var at: Int64
        }

        public var missedCall: MissedCall
    }

    public var aps: APS
    public var parley: Body

    init(call: CallID, from: VoIPPushPayload.Body.From, at: Int64) {
        aps = APS(alert: .init(title: "Missed call", body: from.name.map { "\($0) (\(from.user))" } ?? from.user.rawValue),
                  sound: "default", threadID: "missed-calls-\(from.user)")
        parley = Body(missedCall: .init(call: call, from: from, at: at))
    }
}

/// One push to one device: what it says, and the APNs headers protocol v1 prescribes.
public struct Push: Hashable, Sendable {
    public enum Content: Hashable, Sendable {
        /// A VoIP push: wakes the app, which reports the call to CallKit.
        case incomingCall(VoIPPushPayload)
        /// An ordinary alert: the call a woken device did not answer is over. Never a VoIP push.
        case missedCall(MissedCallAlert)
    }

    public var user: UserID
    public var device: DeviceID
    /// The token it goes to: the device's VoIP token for a call, its alert token for an alert.
    public var registration: VoIPRegistration
    public var content: Content

    public init(user: UserID, device: DeviceID, registration: VoIPRegistration, content: Content) {
        self.user = user
        self.device = device
        self.registration = registration
        self.content = content
    }

    public var call: CallID {
        switch content {
        case .incomingCall(let payload): payload.parley.call
        case .missedCall(let alert): alert.parley.missedCall.call
        }
    }

    public var isVoIP: Bool { if case .incomingCall = content { true } else { false } }
    /// `apns-push-type`.
    public var pushType: String { isVoIP ? "voip" : "alert" }
    /// `apns-topic`: the app's bundle id, with `.voip` for a VoIP push.
    public var topic: String { isVoIP ? registration.topic + ".voip" : registration.topic }
    public var priority: Int { 10 }
    /// `apns-expiration`, Unix seconds: the invite's expiry for a VoIP push (a late one would ring
    /// for a call that is over); a day for a missed call.
    public var expiration: Int64 {
        switch content {
        case .incomingCall(let payload): payload.parley.expiresAt / 1000
        case .missedCall(let alert): alert.parley.missedCall.at / 1000 + 86400
        }
    }

    /// The JSON body.
    public func body() -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        switch content {
        case .incomingCall(let payload): return (try? encoder.encode(payload)) ?? Data()
        case .missedCall(let alert): return (try? encoder.encode(alert)) ?? Data()
        }
    }
}

public enum PushOutcome: Sendable, Equatable {
    /// APNs took it; the id it reported.
    case delivered(id: String)
    /// APNs says the token is no good (400 `BadDeviceToken`, 410): the server forgets it, unless the
    /// device registered again after `since` (APNs' time of the 410, Unix milliseconds).
    case tokenInvalid(reason: String, since: Int64?)
    case failed(String)
}

/// Sends pushes (APNs in production: `APNsPushSender`). The server forgets tokens that come back `tokenInvalid`.
public protocol PushSender: Sendable {
    func send(_ push: Push) async -> PushOutcome
}
