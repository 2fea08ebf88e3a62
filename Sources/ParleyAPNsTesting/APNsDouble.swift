import Crypto
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL

/// Apple's push service cannot run here; this stands in for it in tests. It speaks HTTP/2 over TLS
/// only (a certificate made for the run, signed by its own CA in `caFile`), and checks what APNs
/// checks, answering as APNs answers ("Handling notification responses from APNs"):
///
/// - the path `/3/device/<token>` and the token: a token this service does not know is
///   400 `BadDeviceToken` (so a sandbox token sent to production fails as it would at Apple);
///   a token whose app was removed is 410 `Unregistered` with the time it was;
/// - the provider token: an ES256 JWT whose signature verifies with the team's public key, with the
///   right `kid` and `iss` and an `iat` under an hour old (403 `InvalidProviderToken`,
///   `ExpiredProviderToken`, `MissingProviderToken`), renewed on a connection no more often than
///   every 20 minutes (429 `TooManyProviderTokenUpdates`);
/// - `apns-push-type`, `apns-topic` (`.voip` for VoIP pushes, the device's app), `apns-priority`,
///   `apns-expiration`, `apns-id`, and the body: JSON, 5 KiB at most for VoIP, 4 KiB otherwise.
///
/// What passes the checks is delivered (`delivered`, `deliveries`), unless the test scripted
/// another answer for it (`script`): an error status, a slow answer, a dropped connection.
public final class APNsDouble: Sendable {
    /// A request as it arrived, with the double's verdict.
    public struct Request: Sendable {
        public var method: String
        public var path: String
        public var headers: [String: String]
        public var body: Data
        /// Which TCP connection carried it (1 for the first the double accepted).
        public var connection: Int
        /// The status the double answered with, and its reason.
        public var status: Int
        public var reason: String?

        public var deviceToken: String { path.hasPrefix("/3/device/") ? String(path.dropFirst("/3/device/".count)) : "" }
        public var pushType: String? { headers["apns-push-type"] }
        public var topic: String? { headers["apns-topic"] }
        /// The provider token, without `bearer `.
        public var providerToken: String? { headers["authorization"].map { String($0.dropFirst("bearer ".count)) } }
    }

    /// What to do with the next request that passes the checks.
    public enum Answer: Sendable {
        /// Answer `status` with `{"reason": …}` (and `timestamp`, for 410).
        case refuse(status: Int, reason: String, timestamp: Date? = nil)
        /// Wait, then handle the request as usual.
        case delay(Duration)
        /// Close the connection without answering.
        case dropConnection
    }

    public let port: Int
    /// The CA to trust for this double, as a PEM file (`--apns-ca-file`).
    public let caFile: String
    /// Where to send: `https://127.0.0.1:<port>` (`--apns-url`).
    public var url: URL { URL(string: "https://127.0.0.1:\(port)")! }

    private struct Device {
        var topic: String
        /// What the token was issued for: a PushKit token takes `voip` pushes only, an app's
        /// notification token everything else.
        var pushType: String
        var unregisteredAt: Date?
    }

    private struct State {
        var devices: [String: Device] = [:]
        var script: [Answer] = []
        var requests: [Request] = []
        var arrivals = 0
        var connections = 0
        /// Per connection: the provider token in use and when it was issued.
        var providerTokens: [Int: (jwt: String, issuedAt: Int64)] = [:]
        /// Connections whose token the double called expired: they may renew at once.
        var mayRenew: Set<Int> = []
    }

    private let teamID: String
    private let keyID: String
    private let publicKey: P256.Signing.PublicKey
    private let now: @Sendable () -> Date
    private let state = NIOLockedValueBox(State())
    private let channel: any Channel
    private let directory: URL
    private let deliveriesSink: AsyncStream<Request>.Continuation
    /// Every notification delivered, as it is delivered: what the device would receive.
    public let deliveries: AsyncStream<Request>

    /// Listens on 127.0.0.1 at a free port.
    /// - Parameters:
    ///   - publicKey: the public half of the team's signing key, to verify provider tokens with.
    ///   - now: the double's time, for the age of provider tokens.
    public init(teamID: String, keyID: String, publicKey: P256.Signing.PublicKey,
                now: @escaping @Sendable () -> Date = { Date() }) async throws {
        self.teamID = teamID
        self.keyID = keyID
        self.publicKey = publicKey
        self.now = now
        (deliveries, deliveriesSink) = AsyncStream.makeStream()
        let certificates = try TestCertificates()
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-apns-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let caURL = directory.appendingPathComponent("ca.pem")
        try certificates.caPEM.write(to: caURL, atomically: true, encoding: .utf8)
        caFile = caURL.path

        var tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(try NIOSSLCertificate(bytes: Array(certificates.serverCertificatePEM.utf8), format: .pem))],
            privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(certificates.serverKeyPEM.utf8), format: .pem))
        )
        tls.applicationProtocols = ["h2"]  // APNs speaks HTTP/2 only
        let context = try NIOSSLContext(configuration: tls)
        let box = WeakBox()
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                }.flatMap {
                    let connection = box.double?.accepted() ?? 0
                    return channel.configureHTTP2Pipeline(mode: .server, inboundStreamInitializer: { stream in
                        stream.eventLoop.makeCompletedFuture {
                            try stream.pipeline.syncOperations.addHandlers([
                                HTTP2FramePayloadToHTTP1ServerCodec(),
                                StreamHandler(double: box.double, connection: connection),
                            ])
                        }
                    }).map { _ in }
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        port = channel.localAddress?.port ?? 0
        box.double = self
    }

    /// Stops listening and closes every connection.
    public func stop() async {
        try? await channel.close()
        deliveriesSink.finish()
        try? FileManager.default.removeItem(at: directory)
    }

    // MARK: What the test sets up

    /// A device with the app `topic` (its bundle id) installed, known to this service by `token`:
    /// a PushKit token (`voip`) or the app's notification token (`alert`).
    public func addDevice(token: String, topic: String, pushType: String = "voip") {
        state.withLockedValue { $0.devices[token.lowercased()] = Device(topic: topic, pushType: pushType) }
    }

    /// The app was removed from the device at `date`: APNs answers 410 `Unregistered` from now on.
    public func unregister(token: String, at date: Date) {
        state.withLockedValue { $0.devices[token.lowercased()]?.unregisteredAt = date }
    }

    /// Answers for the next requests that pass the checks, in order.
    public func script(_ answers: Answer...) {
        state.withLockedValue { $0.script += answers }
    }

    // MARK: What the test reads

    /// Every request so far, with its answer.
    public var requests: [Request] { state.withLockedValue { $0.requests } }
    /// The requests answered 200.
    public var delivered: [Request] { requests.filter { $0.status == 200 } }
    /// Requests that arrived, answered or not yet (a scripted delay holds one).
    public var arrivals: Int { state.withLockedValue { $0.arrivals } }
    /// TCP connections accepted so far.
    public var connectionsAccepted: Int { state.withLockedValue { $0.connections } }

    // MARK: Handling

    fileprivate func accepted() -> Int {
        state.withLockedValue { $0.connections += 1; return $0.connections }
    }

    fileprivate enum Verdict {
        case answer(status: Int, reason: String?, timestamp: Date?)
        case drop
    }

    fileprivate func handle(_ request: Request) async -> Verdict {
        var request = request
        state.withLockedValue { $0.arrivals += 1 }
        var verdict = check(request)
        if case .answer(200, _, _) = verdict {
            scripted: while let answer = state.withLockedValue({ $0.script.isEmpty ? nil : $0.script.removeFirst() }) {
                switch answer {
                case .refuse(let status, let reason, let timestamp):
                    verdict = .answer(status: status, reason: reason, timestamp: timestamp)
                    if reason == "ExpiredProviderToken" { _ = state.withLockedValue { $0.mayRenew.insert(request.connection) } }
                    break scripted
                case .delay(let duration):
                    try? await Task.sleep(for: duration)
                case .dropConnection:
                    verdict = .drop
                    break scripted
                }
            }
        }
        switch verdict {
        case .answer(let status, let reason, _):
            request.status = status
            request.reason = reason
        case .drop:
            request.status = 0
            request.reason = "connection dropped"
        }
        state.withLockedValue { $0.requests.append(request) }
        if request.status == 200 { deliveriesSink.yield(request) }
        return verdict
    }

    /// What APNs would answer, before any script.
    private func check(_ request: Request) -> Verdict {
        func refuse(_ status: Int, _ reason: String, _ timestamp: Date? = nil) -> Verdict {
            .answer(status: status, reason: reason, timestamp: timestamp)
        }
        guard request.method == "POST" else { return refuse(405, "MethodNotAllowed") }
        guard request.path.hasPrefix("/3/device/") else { return refuse(404, "BadPath") }
        if let id = request.headers["apns-id"], UUID(uuidString: id) == nil { return refuse(400, "BadMessageId") }
        if let verdict = checkProviderToken(request) { return verdict }
        guard let pushType = request.pushType else { return refuse(400, "InvalidPushType") }
        guard ["alert", "background", "voip", "location", "complication", "fileprovider", "mdm", "liveactivity",
               "pushtotalk"].contains(pushType) else { return refuse(400, "InvalidPushType") }
        guard let topic = request.topic, !topic.isEmpty else { return refuse(400, "MissingTopic") }
        if let priority = request.headers["apns-priority"], !["1", "5", "10"].contains(priority) { return refuse(400, "BadPriority") }
        if let expiration = request.headers["apns-expiration"], Int64(expiration) == nil { return refuse(400, "BadExpirationDate") }
        let token = request.deviceToken.lowercased()
        guard !token.isEmpty, token.count.isMultiple(of: 2), token.allSatisfy(\.isHexDigit),
              let device = state.withLockedValue({ $0.devices[token] }) else { return refuse(400, "BadDeviceToken") }
        if let removed = device.unregisteredAt { return refuse(410, "Unregistered", removed) }
        // A VoIP token takes VoIP pushes only, a notification token no VoIP push.
        guard (pushType == "voip") == (device.pushType == "voip") else { return refuse(400, "DeviceTokenNotForTopic") }
        // A VoIP push's topic is the app's bundle id with `.voip`; any other push's is the bundle id.
        let expectedTopic = pushType == "voip" ? device.topic + ".voip" : device.topic
        guard topic == expectedTopic else {
            return refuse(400, pushType == "voip" && !topic.hasSuffix(".voip") ? "InvalidPushType" : "DeviceTokenNotForTopic")
        }
        guard !request.body.isEmpty else { return refuse(400, "PayloadEmpty") }
        guard request.body.count <= (pushType == "voip" ? 5120 : 4096) else { return refuse(413, "PayloadTooLarge") }
        guard (try? JSONSerialization.jsonObject(with: request.body)) is [String: Any] else { return refuse(400, "BadPayload") }
        return .answer(status: 200, reason: nil, timestamp: nil)
    }

    private func checkProviderToken(_ request: Request) -> Verdict? {
        guard let authorization = request.headers["authorization"], authorization.hasPrefix("bearer ") else {
            return .answer(status: 403, reason: "MissingProviderToken", timestamp: nil)
        }
        let jwt = String(authorization.dropFirst("bearer ".count))
        guard let token = JWT(jwt), token.algorithm == "ES256", token.keyID == keyID, token.issuer == teamID,
              let signature = try? P256.Signing.ECDSASignature(rawRepresentation: token.signature),
              publicKey.isValidSignature(signature, for: Data(token.signingInput.utf8)) else {
            return .answer(status: 403, reason: "InvalidProviderToken", timestamp: nil)
        }
        let seconds = Int64(now().timeIntervalSince1970)
        guard token.issuedAt <= seconds + 60 else { return .answer(status: 403, reason: "InvalidProviderToken", timestamp: nil) }
        guard seconds - token.issuedAt < 3600 else {
            _ = state.withLockedValue { $0.mayRenew.insert(request.connection) }
            return .answer(status: 403, reason: "ExpiredProviderToken", timestamp: nil)
        }
        return state.withLockedValue { state -> Verdict? in
            if let previous = state.providerTokens[request.connection], previous.jwt != jwt {
                let allowed = state.mayRenew.contains(request.connection) || token.issuedAt - previous.issuedAt >= 20 * 60
                guard allowed else { return .answer(status: 429, reason: "TooManyProviderTokenUpdates", timestamp: nil) }
            }
            if state.providerTokens[request.connection]?.jwt != jwt { state.mayRenew.remove(request.connection) }
            state.providerTokens[request.connection] = (jwt, token.issuedAt)
            return nil
        }
    }
}

/// The parts of a provider token the double checks, decoded without trusting anything.
private struct JWT {
    var algorithm: String
    var keyID: String
    var issuer: String
    var issuedAt: Int64
    var signingInput: String
    var signature: Data

    init?(_ text: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerData = Self.decode(parts[0]), let claimsData = Self.decode(parts[1]),
              let signature = Self.decode(parts[2]),
              let header = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
              let claims = try? JSONSerialization.jsonObject(with: claimsData) as? [String: Any],
              let algorithm = header["alg"] as? String, let keyID = header["kid"] as? String,
              let issuer = claims["iss"] as? String, let issuedAt = (claims["iat"] as? NSNumber)?.int64Value else { return nil }
        self.algorithm = algorithm
        self.keyID = keyID
        self.issuer = issuer
        self.issuedAt = issuedAt
        self.signingInput = parts[0] + "." + parts[1]
        self.signature = signature
    }

    private static func decode(_ part: Substring) -> Data? {
        var base64 = part.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard !base64.contains("=") else { return nil }  // JWS uses base64url without padding
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }
}

/// Lets the child channels reach the double, which exists only once the socket is bound.
private final class WeakBox: @unchecked Sendable {
    private let lock = NIOLock()
    private weak var _double: APNsDouble?
    var double: APNsDouble? {
        get { lock.withLock { _double } }
        set { lock.withLock { _double = newValue } }
    }
}

/// One HTTP/2 stream: a request in, an answer out.
private final class StreamHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let double: APNsDouble?
    private let connection: Int
    private var head: HTTPRequestHead?
    private var body = Data()

    init(double: APNsDouble?, connection: Int) {
        self.double = double
        self.connection = connection
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
        case .body(let buffer):
            body.append(contentsOf: buffer.readableBytesView)
        case .end:
            guard let head, let double else { return }
            var headers: [String: String] = [:]
            for (name, value) in head.headers { headers[name.lowercased()] = value }
            let request = APNsDouble.Request(method: head.method.rawValue, path: head.uri, headers: headers, body: body,
                                             connection: connection, status: 0, reason: nil)
            let channel = context.channel
            let version = head.version
            // A NIO handler cannot await: the answer is made on a task and written on the channel's loop.
            Task {
                switch await double.handle(request) {
                case .drop:
                    channel.parent?.close(promise: nil)
                case .answer(let status, let reason, let timestamp):
                    var responseHeaders = HTTPHeaders()
                    responseHeaders.add(name: "apns-id", value: request.headers["apns-id"] ?? UUID().uuidString)
                    var body = ByteBuffer()
                    if let reason {
                        responseHeaders.add(name: "content-type", value: "application/json")
                        let stamp = timestamp.map { #","timestamp":\#(Int64($0.timeIntervalSince1970 * 1000))"# } ?? ""
                        body = ByteBuffer(string: #"{"reason":"\#(reason)"\#(stamp)}"#)
                    }
                    responseHeaders.add(name: "content-length", value: String(body.readableBytes))
                    let responseHead = HTTPResponseHead(version: version, status: HTTPResponseStatus(statusCode: status), headers: responseHeaders)
                    channel.write(HTTPServerResponsePart.head(responseHead), promise: nil)
                    if body.readableBytes > 0 { channel.write(HTTPServerResponsePart.body(.byteBuffer(body)), promise: nil) }
                    channel.writeAndFlush(HTTPServerResponsePart.end(nil), promise: nil)
                }
            }
        }
    }
}

/// A developer team for tests: a signing key written as a `.p8` file, with its ids, and doubles
/// that trust it. The file is the test's to remove (`removeKeyFile`), in a `defer`, so that a test
/// that fails does not leave a private key in the temporary directory.
public struct APNsTestTeam: Sendable {
    public let keyID = "ABC123DEFG"
    public let teamID = "DEF123GHIJ"
    public let privateKey: P256.Signing.PrivateKey
    /// The key as Apple hands it out: PKCS #8 in PEM.
    public let keyFile: String

    public init() throws {
        privateKey = P256.Signing.PrivateKey()
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("AuthKey_\(keyID)-\(UUID().uuidString).p8")
        try privateKey.pemRepresentation.write(to: file, atomically: true, encoding: .utf8)
        keyFile = file.path
    }

    /// An APNs double that verifies this team's provider tokens.
    public func makeDouble(now: @escaping @Sendable () -> Date = { Date() }) async throws -> APNsDouble {
        try await APNsDouble(teamID: teamID, keyID: keyID, publicKey: privateKey.publicKey, now: now)
    }

    public func removeKeyFile() {
        try? FileManager.default.removeItem(atPath: keyFile)
    }
}
