import Crypto
import Foundation
import ParleyProtocol

/// STUN and TURN servers handed to clients, with TURN credentials in the TURN REST scheme that
/// coturn implements (`use-auth-secret`): username `"<expiry unix seconds>:<user>"`, password
/// `base64(HMAC-SHA1(shared secret, username))`.
public struct IceServerProvider: Sendable {
    public var stunURLs: [String]
    public var turnURLs: [String]
    public var turnSecret: String?
    /// Seconds the TURN credentials stay valid.
    public var ttl: Int

    public init(stunURLs: [String] = [], turnURLs: [String] = [], turnSecret: String? = nil, ttl: Int = 86_400) {
        self.stunURLs = stunURLs
        self.turnURLs = turnURLs
        self.turnSecret = turnSecret
        self.ttl = ttl
    }

    /// The servers for `user`, with credentials valid from `now` for `ttl` seconds. Lists only what
    /// is configured: `[]` with neither STUN nor TURN.
    public func iceServers(for user: UserID, now: Date = Date()) -> [IceServer] {
        var servers: [IceServer] = []
        if !stunURLs.isEmpty { servers.append(IceServer(urls: stunURLs)) }
        if !turnURLs.isEmpty, let turnSecret {
            let username = "\(Int64(now.timeIntervalSince1970) + Int64(ttl)):\(user.rawValue)"
            servers.append(IceServer(urls: turnURLs, username: username,
                                     credential: Self.credential(secret: turnSecret, username: username)))
        }
        return servers
    }

    public static func credential(secret: String, username: String) -> String {
        let mac = HMAC<Insecure.SHA1>.authenticationCode(for: Data(username.utf8), using: SymmetricKey(data: Data(secret.utf8)))
        return Data(mac).base64EncodedString()
    }
}
