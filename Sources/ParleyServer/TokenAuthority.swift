import Foundation
import JWTKit
import ParleyProtocol

/// Who a valid access token says the caller is.
public struct Identity: Hashable, Sendable {
    public var user: UserID
    public var name: String?
    /// Unix seconds after which the token is no longer valid.
    public var expiresAt: Int64

    public init(user: UserID, name: String?, expiresAt: Int64) {
        self.user = user
        self.name = name
        self.expiresAt = expiresAt
    }
}

/// Why a token was refused. The message is safe to show; it never contains the token.
public struct TokenError: Error, Hashable, Sendable, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}

/// The key that signs and checks access tokens.
public enum TokenKey: Sendable {
    /// HS256 with a shared secret (the default).
    case hs256(secret: String)
    /// ES256: verifies with the public key; mints only when the private key is given too.
    case es256(publicKeyPEM: String, privateKeyPEM: String?)
}

/// Mints and verifies the access tokens (JWT) of protocol v1: `sub`, `exp` (required), `iat`, `name`.
public struct TokenAuthority: Sendable {
    struct Claims: JWTPayload {
        var sub: SubjectClaim
        var exp: ExpirationClaim
        var iat: IssuedAtClaim?
        var name: String?

        // Expiry is checked by `verify(_:now:)` against the injected time, not here.
        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    private let keys: JWTKeyCollection
    private let canSign: Bool

    public init(key: TokenKey) async throws {
        let keys = JWTKeyCollection()
        switch key {
        case .hs256(let secret):
            // HS256 needs a key at least as long as its hash (RFC 7518 §3.2).
            guard secret.utf8.count >= 32 else { throw TokenError(message: "the token secret must be at least 32 bytes") }
            await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
            canSign = true
        case .es256(let publicPEM, let privatePEM):
            if let privatePEM {
                await keys.add(ecdsa: try ES256PrivateKey(pem: privatePEM))
            } else {
                await keys.add(ecdsa: try ES256PublicKey(pem: publicPEM))
            }
            canSign = privatePEM != nil
        }
        self.keys = keys
    }

    /// Mints a token for `user`, valid for `lifetime` from `now` (Unix seconds).
    public func mint(user: UserID, name: String?, lifetime: Duration, now: Date = Date()) async throws -> (token: String, expiresAt: Date) {
        guard canSign else { throw TokenError(message: "this server holds no private key to sign tokens") }
        let expiry = Date(timeIntervalSince1970: (now.timeIntervalSince1970 + Double(lifetime.components.seconds)).rounded(.down))
        let claims = Claims(sub: SubjectClaim(value: user.rawValue), exp: ExpirationClaim(value: expiry),
                            iat: IssuedAtClaim(value: Date(timeIntervalSince1970: now.timeIntervalSince1970.rounded(.down))),
                            name: name)
        return (try await keys.sign(claims), expiry)
    }

    /// Checks the signature, the expiry (against `now`) and the subject of `token`.
    public func verify(_ token: String, now: Date = Date()) async throws(TokenError) -> Identity {
        let claims: Claims
        do {
            claims = try await keys.verify(token, as: Claims.self)
        } catch {
            throw TokenError(message: "the access token is not valid")
        }
        guard let user = UserID(rawValue: claims.sub.value) else {
            throw TokenError(message: "the token's subject is not a valid user id")
        }
        guard claims.exp.value > now else { throw TokenError(message: "the access token has expired") }
        return Identity(user: user, name: claims.name, expiresAt: Int64(claims.exp.value.timeIntervalSince1970))
    }
}
