import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOSSL

/// An APNs provider: sends notifications to Apple's push service with token authentication, over
/// one long-lived HTTP/2 connection per host (async-http-client multiplexes requests on it), and
/// acts on APNs' answers the way Apple documents them:
///
/// - 200: delivered.
/// - 400 `BadDeviceToken`, 410: the token is rejected (the caller forgets it).
/// - 403 `ExpiredProviderToken` / `InvalidProviderToken`: a new provider token, and one more try.
/// - 429 and 5xx, or no answer at all: tried again with backoff until the notification expires.
/// - Anything else: failed, with APNs' reason.
///
/// ```swift
/// let apns = try APNsClient(configuration: .init(key: key), logger: logger)
/// let result = await apns.send(notification)
/// try await apns.shutdown()
/// ```
public actor APNsClient {
    public struct Configuration: Sendable {
        /// Apple's hosts (port 443).
        public static let production = URL(string: "https://api.push.apple.com")!
        public static let sandbox = URL(string: "https://api.sandbox.push.apple.com")!

        public var key: APNsSigningKey
        /// Where each environment's notifications go: Apple's two hosts, unless one endpoint
        /// (a test double, a proxy) takes both.
        public var endpoints: [APNsEnvironment: URL] = [.production: production, .sandbox: sandbox]
        /// A PEM file with one more root to trust for the endpoints (a test double's own CA).
        public var extraRootCertificateFile: String?
        /// How long a provider token is used (APNs: at least 20 minutes, at most 60).
        public var tokenLifetime: Duration = .seconds(40 * 60)
        /// How long one request may take, answer included.
        public var requestTimeout: Duration = .seconds(10)
        /// The first wait before trying again after 429, 5xx or no answer; it doubles up to `maximumBackoff`.
        public var initialBackoff: Duration = .milliseconds(500)
        public var maximumBackoff: Duration = .seconds(30)

        public init(key: APNsSigningKey) { self.key = key }

        /// Refuses what cannot work, before anything runs: an endpoint that is not https, a CA file
        /// without a certificate.
        public func validate() throws(APNsConfigurationError) {
            for url in endpoints.values where url.scheme != "https" || url.host == nil {
                throw APNsConfigurationError("the APNs endpoint must be an https URL, not \(url.absoluteString)")
            }
            _ = try extraRoots()
        }

        func extraRoots() throws(APNsConfigurationError) -> [NIOSSLCertificate]? {
            guard let file = extraRootCertificateFile else { return nil }
            let roots: [NIOSSLCertificate]
            do {
                roots = try NIOSSLCertificate.fromPEMFile(file)
            } catch {
                throw APNsConfigurationError("cannot read a PEM certificate from the APNs CA file \(file)")
            }
            guard !roots.isEmpty else { throw APNsConfigurationError("no certificate in the APNs CA file \(file)") }
            return roots
        }

        /// Sends both environments to `url` (`--apns-url`).
        public mutating func useEndpoint(_ url: URL) {
            endpoints = [.production: url, .sandbox: url]
        }
    }

    public nonisolated let configuration: Configuration
    private let http: HTTPClient
    private let logger: Logger
    private let observe: @Sendable (APNsExchange) -> Void
    private let wallClock: @Sendable () -> Date
    private var tokens: ProviderTokenCache

    /// - Parameters:
    ///   - observe: told of every request and its answer (for metrics).
    ///   - wallClock: the time for provider tokens and expirations.
    public init(configuration: Configuration, logger: Logger, observe: @escaping @Sendable (APNsExchange) -> Void = { _ in },
                wallClock: @escaping @Sendable () -> Date = { Date() }) throws(APNsConfigurationError) {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let roots = try configuration.extraRoots() { tls.additionalTrustRoots = [.certificates(roots)] }
        var http = HTTPClient.Configuration(tlsConfiguration: tls)
        http.httpVersion = .automatic  // HTTP/2 by ALPN, which APNs requires
        // APNs asks providers to keep their connections open rather than open one per push.
        http.connectionPool = .init(idleTimeout: .hours(1))
        // A connection that cannot be made is this client's to retry (`send`: with backoff, until the
        // notification expires, and not at all for an untrusted certificate). Left on, the HTTP
        // client would try again by itself until its connect timeout (10 s), and an untrusted
        // certificate would be reported only then.
        http.connectionPool.retryConnectionEstablishment = false
        self.http = HTTPClient(eventLoopGroupProvider: .singleton, configuration: http)
        self.configuration = configuration
        self.logger = logger
        self.observe = observe
        self.wallClock = wallClock
        self.tokens = ProviderTokenCache(key: configuration.key, lifetime: TimeInterval(configuration.tokenLifetime.components.seconds))
    }

    /// Closes the connections. Call it once, when no send is running.
    public func shutdown() async throws {
        try await http.shutdown()
    }

    /// Sends `notification`, trying again while APNs' answer allows and the notification has not
    /// expired. Returns what became of it; never throws (a cancelled task gets `failed`).
    public func send(_ notification: APNsNotification) async -> APNsResult {
        guard notification.payload.count <= notification.maximumPayloadSize else {
            return .failed(status: nil, reason: APNsReason.payloadTooLarge, apnsID: nil)
        }
        guard let endpoint = configuration.endpoints[notification.environment] else {
            return .failed(status: nil, reason: "no APNs endpoint for \(notification.environment.rawValue)", apnsID: nil)
        }
        var renewedToken = false
        var backoff = configuration.initialBackoff
        while true {
            let token = tokens.current(now: wallClock())
            let answer = await post(notification, to: endpoint, token: token)
            let retryReason: String
            switch answer {
            case .answered(let status, let reason, let apnsID, let timestamp):
                switch (status, reason) {
                case (200, _):
                    return .delivered(apnsID: apnsID ?? notification.id.uuidString)
                case (400, APNsReason.badDeviceToken), (410, _):
                    return .tokenRejected(reason: reason ?? "Unregistered", since: timestamp)
                case (403, APNsReason.expiredProviderToken), (403, APNsReason.invalidProviderToken):
                    guard !renewedToken else { return .failed(status: status, reason: reason ?? "", apnsID: apnsID) }
                    renewedToken = true
                    _ = tokens.renew(after: token, now: wallClock())
                    logger.notice("APNs refused the provider token; made a new one", metadata: ["apns.reason": "\(reason ?? "")"])
                    continue
                case (429, APNsReason.tooManyProviderTokenUpdates):
                    // Waiting with the same token does not help, and a new one now would be refused too.
                    return .failed(status: status, reason: reason ?? "", apnsID: apnsID)
                case (429, _), (500..., _):
                    retryReason = "\(status) \(reason ?? "")"
                default:
                    return .failed(status: status, reason: reason ?? "status \(status)", apnsID: apnsID)
                }
            case .noAnswer(let error, retryable: false):
                return .failed(status: nil, reason: error, apnsID: nil)
            case .noAnswer(let error, retryable: true):
                retryReason = error
            }
            // Try again, but never past the notification's expiry: a late VoIP push rings for a call that is over.
            let half = max(1, Int64(Self.seconds(backoff) * 500))
            let wait = Duration.milliseconds(half + Int64.random(in: 0...half))
            let deadline = Date(timeIntervalSince1970: TimeInterval(notification.expiration))
            guard wallClock().addingTimeInterval(Self.seconds(wait)) < deadline else {
                return .failed(status: nil, reason: "gave up before the notification expired; last: \(retryReason)", apnsID: nil)
            }
            logger.debug("APNs asked to try again", metadata: ["apns.id": "\(notification.id)", "apns.reason": "\(retryReason)"])
            do {
                try await Task.sleep(for: wait)
            } catch {
                return .failed(status: nil, reason: "cancelled; last: \(retryReason)", apnsID: nil)
            }
            backoff = min(backoff * 2, configuration.maximumBackoff)
        }
    }

    private enum Answer {
        case answered(status: Int, reason: String?, apnsID: String?, timestamp: Date?)
        /// Not retryable: the endpoint's certificate is not trusted, which waiting does not mend.
        case noAnswer(String, retryable: Bool)
    }

    private func post(_ notification: APNsNotification, to endpoint: URL, token: ProviderToken) async -> Answer {
        var request = HTTPClientRequest(url: endpoint.absoluteString + "/3/device/" + notification.deviceToken)
        request.method = .POST
        request.headers.add(name: "authorization", value: "bearer \(token.jwt)")
        request.headers.add(name: "apns-push-type", value: notification.pushType.rawValue)
        request.headers.add(name: "apns-topic", value: notification.topic)
        request.headers.add(name: "apns-priority", value: String(notification.priority))
        request.headers.add(name: "apns-expiration", value: String(notification.expiration))
        request.headers.add(name: "apns-id", value: notification.id.uuidString)
        request.headers.add(name: "content-type", value: "application/json")
        request.body = .bytes(ByteBuffer(bytes: notification.payload))
        let started = ContinuousClock.now
        do {
            let response = try await http.execute(request, timeout: .nanoseconds(Int64(Self.seconds(configuration.requestTimeout) * 1e9)))
            let body = try await response.body.collect(upTo: 64 * 1024)
            let error = try? JSONDecoder().decode(ErrorBody.self, from: Data(body.readableBytesView))
            let status = Int(response.status.code)
            let apnsID = response.headers.first(name: "apns-id")
            observe(APNsExchange(pushType: notification.pushType, status: status, reason: error?.reason, duration: .now - started))
            let timestamp = error?.timestamp.map { Date(timeIntervalSince1970: TimeInterval($0) / 1000) }
            if status != 200 {
                logger.info("APNs refused a notification", metadata: [
                    "apns.id": "\(apnsID ?? notification.id.uuidString)", "apns.status": "\(status)", "apns.reason": "\(error?.reason ?? "")",
                ])
            }
            return .answered(status: status, reason: error?.reason, apnsID: apnsID, timestamp: timestamp)
        } catch {
            observe(APNsExchange(pushType: notification.pushType, status: nil, reason: nil, duration: .now - started))
            let tls = error is NIOSSLError || error is BoringSSLError
            logger.info("no answer from APNs", metadata: ["apns.id": "\(notification.id)", "error": "\(error)"])
            return .noAnswer(tls ? "TLS with \(endpoint.host ?? "APNs") failed: \(error)" : String(describing: error), retryable: !tls)
        }
    }

    private struct ErrorBody: Decodable {
        var reason: String
        /// For 410: when APNs last knew the token valid, in Unix milliseconds.
        var timestamp: Int64?
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}
