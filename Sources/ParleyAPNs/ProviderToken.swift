import Crypto
import Foundation

/// Why an APNs configuration cannot be used, in words for the operator.
public struct APNsConfigurationError: Error, CustomStringConvertible, Equatable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The team's token signing key: the `.p8` file from Apple's developer account (Certificates,
/// Identifiers & Profiles › Keys, with "Apple Push Notifications service" enabled), its key id,
/// and the team id. The key itself is never logged nor printed.
public struct APNsSigningKey: Sendable, CustomStringConvertible {
    /// The 10-character id Apple shows beside the key.
    public let keyID: String
    /// The 10-character id of the developer team.
    public let teamID: String
    let key: P256.Signing.PrivateKey

    /// - Parameter pem: the `.p8` file's text (`-----BEGIN PRIVATE KEY-----`, a P-256 key in PKCS #8).
    public init(pem: String, keyID: String, teamID: String) throws(APNsConfigurationError) {
        guard Self.isAppleID(keyID) else {
            throw APNsConfigurationError("the APNs key id must be the 10 letters and digits Apple shows beside the key, not \"\(keyID)\"")
        }
        guard Self.isAppleID(teamID) else {
            throw APNsConfigurationError("the APNs team id must be the 10 letters and digits of the developer team, not \"\(teamID)\"")
        }
        do {
            key = try P256.Signing.PrivateKey(pemRepresentation: pem)
        } catch {
            throw APNsConfigurationError("the APNs key is not a P-256 private key in PEM (the .p8 file Apple gives for token authentication)")
        }
        self.keyID = keyID
        self.teamID = teamID
    }

    /// Reads the `.p8` file once.
    public init(file: String, keyID: String, teamID: String) throws(APNsConfigurationError) {
        let pem: String
        do {
            pem = try String(contentsOfFile: file, encoding: .utf8)
        } catch {
            throw APNsConfigurationError("cannot read the APNs key file \(file): \((error as NSError).localizedDescription)")
        }
        try self.init(pem: pem, keyID: keyID, teamID: teamID)
    }

    public var description: String { "APNs key \(keyID) of team \(teamID)" }

    private static func isAppleID(_ id: String) -> Bool {
        id.utf8.count == 10 && id.unicodeScalars.allSatisfy { ("A"..."Z").contains($0) || ("0"..."9").contains($0) }
    }
}

/// A provider authentication token: the JWT APNs takes in `authorization: bearer …`.
public struct ProviderToken: Sendable, Hashable {
    public let jwt: String
    public let issuedAt: Date

    /// An ES256 JWT with `kid` in the header and `iss`, `iat` in the claims, as Apple documents
    /// ("Establishing a token-based connection to APNs").
    public init(key: APNsSigningKey, issuedAt: Date) {
        let iat = Int64(issuedAt.timeIntervalSince1970)
        let header = #"{"alg":"ES256","kid":"\#(key.keyID)"}"#
        let claims = #"{"iss":"\#(key.teamID)","iat":\#(iat)}"#
        let signingInput = Self.base64URL(Data(header.utf8)) + "." + Self.base64URL(Data(claims.utf8))
        // `rawRepresentation` is r ‖ s, 64 bytes: the JWS form of an ES256 signature (RFC 7518 §3.4).
        let signature = (try? key.key.signature(for: Data(signingInput.utf8)))?.rawRepresentation ?? Data()
        jwt = signingInput + "." + Self.base64URL(signature)
        self.issuedAt = Date(timeIntervalSince1970: TimeInterval(iat))
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}

/// When to make a new provider token. APNs refuses a token older than an hour
/// (`ExpiredProviderToken`) and one renewed more often than every 20 minutes
/// (`TooManyProviderTokenUpdates`): a token is kept `lifetime` (40 minutes), and renewed early
/// only when APNs calls it expired — once for all the requests that saw it refused.
struct ProviderTokenCache {
    let key: APNsSigningKey
    let lifetime: TimeInterval
    private(set) var token: ProviderToken?

    init(key: APNsSigningKey, lifetime: TimeInterval = 40 * 60) {
        self.key = key
        self.lifetime = lifetime
    }

    mutating func current(now: Date) -> ProviderToken {
        if let token, now.timeIntervalSince(token.issuedAt) < lifetime, now >= token.issuedAt { return token }
        let fresh = ProviderToken(key: key, issuedAt: now)
        token = fresh
        return fresh
    }

    /// APNs refused `rejected` as expired: a new token, unless another request renewed it already.
    mutating func renew(after rejected: ProviderToken, now: Date) -> ProviderToken {
        if let token, token != rejected { return token }
        let fresh = ProviderToken(key: key, issuedAt: now)
        token = fresh
        return fresh
    }
}
