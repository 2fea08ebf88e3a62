// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyKit
import ParleyProtocol

/// Calling a device that listens on the local network (`parley listen --lan`), found with
/// `BonjourDiscovery`: it hands out its own tokens, with its PIN when it asks for one. Give a
/// `ParleyPhone` the listener's `url` as its server and this as its token source:
///
/// ```swift
/// let configuration = ParleyPhone.Configuration(server: listener.url, device: device, topic: topic,
///                                               pushEnvironment: .sandbox) {
///     try await LANToken.fetch(from: listener, user: "alice", name: "Alice", pin: pin)
/// }
/// ```
public enum LANToken {
    public struct Refused: Error, CustomStringConvertible {
        /// 403 for a missing or wrong PIN, 409 for a user id that is the listener's own, 429 after
        /// too many tries (wait `retryAfter` seconds).
        public var status: Int
        public var message: String
        public var retryAfter: Int?
        public var description: String { message }
    }

    /// A token for `user` from the listener; throws `Refused` with the listener's own words when it
    /// says no, or URLSession's error when it cannot be reached.
    public static func fetch(from listener: LANListener, user: UserID, name: String?, pin: String?,
                             session: URLSession = .shared) async throws -> String {
        var request = URLRequest(url: listener.url.appendingPathComponent("v1/lan/tokens"))
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = try JSONEncoder().encode(LANTokenRequest(user: user, name: name, pin: pin))
        request.timeoutInterval = 5
        let (data, response) = try await session.dataCancellably(for: request)
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard status == 200 else {
            let message = (try? JSONDecoder().decode(HTTPErrorBody.self, from: data))?.error.message ?? "HTTP \(status)"
            let retryAfter = (response as? HTTPURLResponse)?.value(forHTTPHeaderField: "Retry-After").flatMap { Int($0) }
            throw Refused(status: status, message: "\(listener.name ?? listener.user.rawValue) refused: \(message)", retryAfter: retryAfter)
        }
        return try JSONDecoder().decode(DevTokenResponse.self, from: data).token
    }
}
#endif
