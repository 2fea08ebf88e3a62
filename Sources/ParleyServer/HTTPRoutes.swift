import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdAuth
import NIOCore
import ParleyProtocol

/// The HTTP endpoints of protocol v1 beside the WebSocket.
///
/// Handlers return typed values and throw `APIError`, which answers with protocol v1's error body.
/// The routes that act for a user sit behind `TokenAuthenticator`, which puts the bearer token's
/// identity in the request context, and `RequireIdentity`, which refuses a request without one.
struct HTTPRoutes: Sendable {
    let configuration: ServerConfiguration
    let store: any SignalingStore
    let tokens: TokenAuthority
    let metrics: ServerMetrics
    let wallClock: @Sendable () -> Int64
    /// Whether the server is shutting down: new sessions are refused with 503.
    let isShuttingDown: @Sendable () async -> Bool
    let limiter: AddressRateLimiter
    /// Whether a device of this user is connected or held for resume.
    let isPresent: @Sendable (UserID) async -> Bool
    /// A LAN listener's PIN tries and who may take a token.
    let lanGate: LANGate?
    /// Waits (a moment at most) until the call changes made so far are in the store, so a history
    /// read right after a call shows how it ended.
    let recordsWritten: @Sendable () async -> Void

    static let maxBody = ParleyRequestContext.maxBody
    static let maxCallsLimit = 200

    func register(on router: Router<ParleyRequestContext>) {
        router.add(middleware: AddressRateLimitMiddleware(limiter: limiter, trustedProxies: configuration.trustedProxies))
        router.add(middleware: NotFoundInProtocolWords())
        router.get("/healthz", use: health)
        router.get("/metrics", use: metricsExposition)
        if configuration.developmentMode {
            router.group("/v1/dev/tokens")
                .add(middleware: CORSMiddleware(allowOrigin: .all, allowHeaders: [.contentType],
                                                allowMethods: [.post, .options], maxAge: .seconds(600)))
                .post(use: devToken)
                .on("", method: .options) { _, _ in HTTPResponse.Status.noContent } // a preflight without Origin
        }
        if configuration.lan != nil {
            router.post("/v1/lan/tokens", use: lanToken)
        }
        // Reached only when the WebSocket upgrade was refused.
        router.group("/v1/signal")
            .add(middleware: TokenAuthenticator(tokens: tokens, allowQuery: true))
            .get(use: signalWithoutUpgrade)
        // A LAN listener serves calls to its user and nothing else: callers choose their own user
        // ids there, so no history, devices or pages are served under them.
        guard configuration.lan == nil else { return }
        BrowserClient.register(on: router, janusURL: configuration.janus?.clientURL)
        router.group("/v1")
            .add(middleware: TokenAuthenticator(tokens: tokens))
            .add(middleware: RequireIdentity())
            .get("ice-servers", use: iceServers)
            .put("devices/:device", use: registerDevice)
            .delete("devices/:device", use: removeDevice)
            .get("calls", use: callHistory)
    }

    // MARK: Routes

    @Sendable func health(_ request: Request, context: ParleyRequestContext) async -> TextResponse {
        await isShuttingDown() ? TextResponse("shutting down\n", status: .serviceUnavailable) : TextResponse("ok\n")
    }

    /// Metrics tell who is busy and how much: loopback scrapers only, unless a token is configured.
    @Sendable func metricsExposition(_ request: Request, context: ParleyRequestContext) throws -> TextResponse {
        if let expected = configuration.metricsToken {
            let given = WebSocketEndpoint<ContinuousClock>.bearerToken(headers: request.headers, path: nil, allowQuery: false)
            guard let given, Self.constantTimeEqual(given, expected) else { throw APIError.unauthorized }
        } else if !context.isFromLoopback {
            throw APIError(.forbidden, .forbidden, "metrics are served on loopback only (or with --metrics-token)")
        }
        return TextResponse(metrics.exposition(), contentType: "text/plain; version=0.0.4; charset=utf-8")
    }

    @Sendable func signalWithoutUpgrade(_ request: Request, context: ParleyRequestContext) async throws -> Response {
        if await isShuttingDown() { throw APIError(.serviceUnavailable, .unavailable, "the server is shutting down") }
        guard context.identity != nil else { throw APIError.unauthorized }
        throw APIError(.upgradeRequired, .badRequest, "this endpoint speaks WebSocket (protocol v1)")
    }

    @Sendable func devToken(_ request: Request, context: ParleyRequestContext) async throws -> DevTokenResponse {
        let body = try await request.decode(as: DevTokenRequest.self, context: context)
        if let name = body.name, name.count > 128 { throw APIError(.badRequest, .badRequest, "name must be at most 128 characters") }
        let minted = try await tokens.mint(user: body.user, name: body.name, lifetime: configuration.devTokenLifetime)
        return DevTokenResponse(token: minted.token, expiresAt: Int64(minted.expiresAt.timeIntervalSince1970 * 1000))
    }

    /// A token for a caller on the local network: any user id but the listener's, with the PIN
    /// when the listener has one. Tries are limited per address, right or wrong.
    @Sendable func lanToken(_ request: Request, context: ParleyRequestContext) async throws -> DevTokenResponse {
        guard let lan = configuration.lan, let lanGate else { throw APIError.notFound }
        let body = try await request.decode(as: LANTokenRequest.self, context: context)
        if let name = body.name {
            guard name.count <= 128 else { throw APIError(.badRequest, .badRequest, "name must be at most 128 characters") }
            // The listener's user reads it beside the caller's address: nothing may rewrite that line.
            guard !LANGate.hasControlCharacters(name) else {
                throw APIError(.badRequest, .badRequest, "name may not hold control or formatting characters")
            }
        }
        guard body.user != lan.host else {
            throw APIError(.conflict, .badRequest, "\(lan.host) is the user of the device you are calling; call it under another user id")
        }
        if let expected = lan.pin {
            if case .wait(let wait, let everyone) = lanGate.admit(address: context.remoteAddress?.ipAddress ?? "unknown") {
                let seconds = AddressRateLimiter.retryAfter(wait)
                throw APIError(.tooManyRequests, .rateLimited, everyone
                    ? "too many wrong PINs from this network; \(lan.host) takes none for \(seconds) s"
                    : "too many PIN tries from this address; retry in \(seconds) s", headers: [.retryAfter: "\(seconds)"])
            }
            guard let given = body.pin else { throw APIError(.forbidden, .forbidden, "\(lan.host) asks for a PIN") }
            guard Self.constantTimeEqual(given, expected) else {
                lanGate.failed()
                throw APIError(.forbidden, .forbidden, "wrong PIN")
            }
        }
        // One user id, one caller: a second would take over the first's session and calls.
        guard await !isPresent(body.user) else {
            throw APIError(.conflict, .badRequest, "\(body.user) is already connected here; call under another user id")
        }
        let minted = try await tokens.mint(user: body.user, name: body.name, lifetime: lan.tokenLifetime)
        return DevTokenResponse(token: minted.token, expiresAt: Int64(minted.expiresAt.timeIntervalSince1970 * 1000))
    }

    @Sendable func iceServers(_ request: Request, context: ParleyRequestContext) throws -> IceServersResponse {
        let identity = try context.requireIdentity()
        return IceServersResponse(iceServers: configuration.iceServers.iceServers(for: identity.user), ttl: configuration.iceServers.ttl)
    }

    @Sendable func registerDevice(_ request: Request, context: ParleyRequestContext) async throws -> DeviceRecord {
        let identity = try context.requireIdentity()
        guard let device = context.parameters.get("device").flatMap(DeviceID.init(rawValue:)) else {
            throw APIError(.badRequest, .badRequest, "a device id is 1-128 characters of A-Z a-z 0-9 . _ : @ -")
        }
        let registration = try await request.decode(as: DeviceRegistration.self, context: context)
        guard Platform.known.contains(registration.platform) else {
            throw APIError(.badRequest, .badRequest, "platform must be one of ios, android, web, linux")
        }
        for (field, push) in [("voip", registration.voip), ("alerts", registration.alerts)] {
            guard let push else { continue }
            guard !push.token.isEmpty, push.token.count <= 200, push.token.allSatisfy(\.isHexDigit) else {
                throw APIError(.badRequest, .badRequest, "\(field).token must be the device token in hex")
            }
            // The topic goes in an HTTP/2 header to APNs, and in the store.
            guard Self.isBundleID(push.topic) else {
                throw APIError(.badRequest, .badRequest, "\(field).topic must be the app's bundle id (A-Z a-z 0-9 - .)")
            }
        }
        let limit = configuration.limits.devicesPerUser
        let known = try await Self.storing("the devices could not be read") { try await store.devices(of: identity.user) }
        if known.count >= limit, !known.contains(where: { $0.device == device }) {
            throw APIError(.conflict, .badRequest, "\(identity.user) has \(known.count) devices, the most one user may register; remove one (DELETE /v1/devices/{device}) first")
        }
        let record = DeviceRecord(user: identity.user, device: device, platform: registration.platform,
                                  voip: registration.voip, alerts: registration.alerts, updatedAt: wallClock())
        try await Self.storing("the device could not be stored") { try await store.upsertDevice(record) }
        return record
    }

    /// Apple's rule for a bundle id: letters A–Z and a–z, digits, hyphens and periods (and at most
    /// 255 bytes here).
    static func isBundleID(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.count <= 255 && text.utf8.allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "."): true
            default: false
            }
        }
    }

    @Sendable func removeDevice(_ request: Request, context: ParleyRequestContext) async throws -> HTTPResponse.Status {
        let identity = try context.requireIdentity()
        guard let device = context.parameters.get("device").flatMap(DeviceID.init(rawValue:)),
              try await Self.storing("the device could not be removed", { try await store.deleteDevice(user: identity.user, device: device) })
        else { throw APIError(.notFound, .notFound, "no such device") }
        return .noContent
    }

    @Sendable func callHistory(_ request: Request, context: ParleyRequestContext) async throws -> CallList {
        let identity = try context.requireIdentity()
        var limit = 50
        if let text = request.uri.queryParameters.get("limit") {
            guard let value = Int(text), (1...Self.maxCallsLimit).contains(value) else {
                throw APIError(.badRequest, .badRequest, "limit must be a whole number from 1 to \(Self.maxCallsLimit)")
            }
            limit = value
        }
        await recordsWritten()
        return CallList(calls: try await Self.storing("the call history could not be read") {
            try await store.calls(of: identity.user, limit: limit)
        })
    }

    /// Runs a store operation; its failure answers 500 with what could not be done.
    private static func storing<T>(_ failure: String, _ operation: () async throws -> T) async throws -> T {
        do { return try await operation() } catch { throw APIError(.internalServerError, .internal, failure) }
    }

    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let (x, y) = (Array(a.utf8), Array(b.utf8))
        guard x.count == y.count else { return false }
        return zip(x, y).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
    }
}

extension DevTokenResponse: ResponseEncodable {}
extension IceServersResponse: ResponseEncodable {}
extension DeviceRecord: ResponseEncodable {}
extension CallList: ResponseEncodable {}

// MARK: Context, authentication, errors

/// The request context of Parley's routes: Hummingbird's, where the request came from, and who
/// it is from once `TokenAuthenticator` has read its token.
struct ParleyRequestContext: AuthRequestContext, RemoteAddressRequestContext {
    /// The largest request body read; a larger one is refused with 413.
    static let maxBody = 64 * 1024

    var coreContext: CoreRequestContextStorage
    var identity: Identity?
    let remoteAddress: SocketAddress?

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        remoteAddress = source.channel.remoteAddress
    }

    var maxUploadSize: Int { Self.maxBody }
    var requestDecoder: ProtocolBodyDecoder { ProtocolBodyDecoder() }
    var responseEncoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    var isFromLoopback: Bool {
        guard let address = remoteAddress?.ipAddress else { return false }
        return address.hasPrefix("127.") || address == "::1" || address.hasPrefix("::ffff:127.")
    }
}

/// Puts the identity of a valid bearer token (the `Authorization` header, or `access_token` in the
/// query where `allowQuery`) in the request context; a request without one goes on without it.
struct TokenAuthenticator: AuthenticatorMiddleware {
    typealias Context = ParleyRequestContext
    let tokens: TokenAuthority
    var allowQuery = false

    func authenticate(request: Request, context: Context) async throws -> Identity? {
        guard let token = WebSocketEndpoint<ContinuousClock>.bearerToken(headers: request.headers, path: request.uri.string,
                                                                          allowQuery: allowQuery) else { return nil }
        return try? await tokens.verify(token)
    }
}

/// Refuses with 401, in protocol v1's words, a request that no authenticator gave an identity.
struct RequireIdentity<Context: AuthRequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard context.identity != nil else { throw APIError.unauthorized }
        return try await next(request, context)
    }
}

/// Answers a request no route takes (or a route this server does not serve, such as development
/// tokens in production) with protocol v1's 404, as every other refusal: Hummingbird's own is empty.
struct NotFoundInProtocolWords<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        do {
            return try await next(request, context)
        } catch let error as HTTPError where error.status == .notFound {
            throw APIError.notFound
        }
    }
}

/// An HTTP error of protocol v1: a status and the body `{"error": {"code", "message"}}`.
struct APIError: HTTPResponseError {
    let status: HTTPResponse.Status
    let code: ErrorCode
    let message: String
    var headers: HTTPFields = [:]

    init(_ status: HTTPResponse.Status, _ code: ErrorCode, _ message: String, headers: HTTPFields = [:]) {
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
    }

    static let unauthorized = APIError(.unauthorized, .unauthorized, "a valid access token is required")
    static let notFound = APIError(.notFound, .notFound, "not found")

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var response = try context.responseEncoder.encode(HTTPErrorBody(code: code, message: message), from: request, context: context)
        response.status = status
        response.headers.append(contentsOf: headers)
        return response
    }
}

/// Reads a JSON request body as the WebSocket reads a frame: at most the context's upload size
/// (413 beyond it), and a 400 that says which field is wrong and why.
struct ProtocolBodyDecoder: RequestDecoder {
    func decode<T: Decodable>(_ type: T.Type, from request: Request, context: some RequestContext) async throws -> T {
        let body: ByteBuffer
        do {
            body = try await request.body.collect(upTo: context.maxUploadSize)
        } catch is NIOTooManyBytesError {
            throw APIError(.contentTooLarge, .payloadTooLarge, "the body is larger than \(context.maxUploadSize) bytes")
        }
        let data = Data(body.readableBytesView)
        do {
            return try JSONDecoder().decode(T.self, from: data)
        } catch {
            throw APIError(.badRequest, .badRequest, WireCodec.describe(error, in: data).message)
        }
    }
}

/// A text body as a typed response.
struct TextResponse: ResponseGenerator {
    var text: String
    var status: HTTPResponse.Status
    var contentType: String

    init(_ text: String, status: HTTPResponse.Status = .ok, contentType: String = "text/plain; charset=utf-8") {
        self.text = text
        self.status = status
        self.contentType = contentType
    }

    func response(from request: Request, context: some RequestContext) -> Response {
        Response(status: status, headers: [.contentType: contentType], body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}
