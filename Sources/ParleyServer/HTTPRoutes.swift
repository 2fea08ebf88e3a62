import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import ParleyProtocol

/// The HTTP endpoints of protocol v1 beside the WebSocket.
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

    static let maxBody = 64 * 1024
    static let maxCallsLimit = 200

    func register(on router: Router<ParleyRequestContext>) {
        router.add(middleware: AddressRateLimitMiddleware(limiter: limiter, trustedProxies: configuration.trustedProxies))
        router.get("/healthz") { _, _ in
            guard await !isShuttingDown() else {
                return Response(status: .serviceUnavailable, headers: [.contentType: "text/plain; charset=utf-8"],
                                body: .init(byteBuffer: ByteBuffer(string: "shutting down\n")))
            }
            return Response(status: .ok, headers: [.contentType: "text/plain; charset=utf-8"], body: .init(byteBuffer: ByteBuffer(string: "ok\n")))
        }
        router.get("/metrics") { request, context in
            // Metrics tell who is busy and how much: loopback scrapers only, unless a token is configured.
            if let expected = configuration.metricsToken {
                let given = WebSocketEndpoint<ContinuousClock>.bearerToken(headers: request.headers, path: nil, allowQuery: false)
                guard let given, Self.constantTimeEqual(given, expected) else { return Self.unauthorized }
            } else if !context.isFromLoopback {
                return Self.error(.forbidden, .forbidden, "metrics are served on loopback only (or with --metrics-token)")
            }
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                            body: .init(byteBuffer: ByteBuffer(string: metrics.exposition())))
        }
        router.post("/v1/dev/tokens") { request, context in try await devToken(request, context: context) }
        router.on("/v1/dev/tokens", method: .options) { request, _ in
            guard configuration.developmentMode else { return Self.error(.notFound, .notFound, "not found") }
            var headers = Self.corsHeaders
            headers[.accessControlAllowMethods] = "POST, OPTIONS"
            headers[.accessControlAllowHeaders] = request.headers[.accessControlRequestHeaders] ?? "content-type"
            headers[.accessControlMaxAge] = "600"
            return Response(status: .noContent, headers: headers)
        }
        router.post("/v1/lan/tokens") { request, context in try await lanToken(request, context: context) }
        // Reached only when the WebSocket upgrade was refused.
        router.get("/v1/signal") { request, _ in
            if await isShuttingDown() { return Self.error(.serviceUnavailable, .unavailable, "the server is shutting down") }
            guard await identity(request, allowQuery: true) != nil else {
                return Self.error(.unauthorized, .unauthorized, "a valid access token is required")
            }
            return Self.error(.upgradeRequired, .badRequest, "this endpoint speaks WebSocket (protocol v1)")
        }
        // A LAN listener serves calls to its user and nothing else: callers choose their own user
        // ids there, so no history, devices or pages are served under them.
        guard configuration.lan == nil else { return }
        BrowserClient.register(on: router, janusURL: configuration.janus?.clientURL)
        router.get("/v1/ice-servers") { request, _ in
            guard let identity = await identity(request) else { return Self.unauthorized }
            return Self.json(IceServersResponse(iceServers: configuration.iceServers.iceServers(for: identity.user),
                                                ttl: configuration.iceServers.ttl))
        }
        router.put("/v1/devices/:device") { request, context in
            guard let identity = await identity(request) else { return Self.unauthorized }
            guard let device = context.parameters.get("device").flatMap(DeviceID.init(rawValue:)) else {
                return Self.error(.badRequest, .badRequest, "a device id is 1-128 characters of A-Z a-z 0-9 . _ : @ -")
            }
            let registration: DeviceRegistration
            switch await Self.decode(DeviceRegistration.self, from: request) {
            case .success(let value): registration = value
            case .failure(let failure): return failure.response
            }
            guard Platform.known.contains(registration.platform) else {
                return Self.error(.badRequest, .badRequest, "platform must be one of ios, android, web, linux")
            }
            for (field, push) in [("voip", registration.voip), ("alerts", registration.alerts)] {
                guard let push else { continue }
                guard !push.token.isEmpty, push.token.count <= 200, push.token.allSatisfy(\.isHexDigit) else {
                    return Self.error(.badRequest, .badRequest, "\(field).token must be the device token in hex")
                }
                guard !push.topic.isEmpty, push.topic.count <= 255 else {
                    return Self.error(.badRequest, .badRequest, "\(field).topic must be the app's bundle id")
                }
            }
            let limit = configuration.limits.devicesPerUser
            do {
                let known = try await store.devices(of: identity.user)
                if known.count >= limit, !known.contains(where: { $0.device == device }) {
                    return Self.error(.conflict, .badRequest, "\(identity.user) has \(known.count) devices, the most one user may register; remove one (DELETE /v1/devices/{device}) first")
                }
            } catch { return Self.error(.internalServerError, .internal, "the devices could not be read") }
            let record = DeviceRecord(user: identity.user, device: device, platform: registration.platform,
                                      voip: registration.voip, alerts: registration.alerts, updatedAt: wallClock())
            do { try await store.upsertDevice(record) } catch { return Self.error(.internalServerError, .internal, "the device could not be stored") }
            return Self.json(record)
        }
        router.delete("/v1/devices/:device") { request, context in
            guard let identity = await identity(request) else { return Self.unauthorized }
            guard let device = context.parameters.get("device").flatMap(DeviceID.init(rawValue:)) else {
                return Self.error(.notFound, .notFound, "no such device")
            }
            do {
                guard try await store.deleteDevice(user: identity.user, device: device) else {
                    return Self.error(.notFound, .notFound, "no such device")
                }
            } catch { return Self.error(.internalServerError, .internal, "the device could not be removed") }
            return Response(status: .noContent)
        }
        router.get("/v1/calls") { request, _ in
            guard let identity = await identity(request) else { return Self.unauthorized }
            var limit = 50
            if let text = request.uri.queryParameters.get("limit") {
                guard let value = Int(text), (1...Self.maxCallsLimit).contains(value) else {
                    return Self.error(.badRequest, .badRequest, "limit must be a whole number from 1 to \(Self.maxCallsLimit)")
                }
                limit = value
            }
            do {
                return Self.json(CallList(calls: try await store.calls(of: identity.user, limit: limit)))
            } catch {
                return Self.error(.internalServerError, .internal, "the call history could not be read")
            }
        }
    }

    private func devToken(_ request: Request, context: ParleyRequestContext) async throws -> Response {
        guard configuration.developmentMode else { return Self.error(.notFound, .notFound, "not found") }
        var response: Response
        switch await Self.decode(DevTokenRequest.self, from: request) {
        case .failure(let failure):
            response = failure.response
        case .success(let body):
            if let name = body.name, name.count > 128 {
                response = Self.error(.badRequest, .badRequest, "name must be at most 128 characters")
            } else {
                let minted = try await tokens.mint(user: body.user, name: body.name, lifetime: configuration.devTokenLifetime)
                response = Self.json(DevTokenResponse(token: minted.token,
                                                      expiresAt: Int64(minted.expiresAt.timeIntervalSince1970 * 1000)))
            }
        }
        for field in Self.corsHeaders { response.headers.append(field) }
        return response
    }

    /// A token for a caller on the local network: any user id but the listener's, with the PIN
    /// when the listener has one. Tries are limited per address, right or wrong.
    private func lanToken(_ request: Request, context: ParleyRequestContext) async throws -> Response {
        guard let lan = configuration.lan, let lanGate else { return Self.error(.notFound, .notFound, "not found") }
        let body: LANTokenRequest
        switch await Self.decode(LANTokenRequest.self, from: request) {
        case .failure(let failure): return failure.response
        case .success(let value): body = value
        }
        if let name = body.name {
            guard name.count <= 128 else { return Self.error(.badRequest, .badRequest, "name must be at most 128 characters") }
            // The listener's user reads it beside the caller's address: nothing may rewrite that line.
            guard !LANGate.hasControlCharacters(name) else {
                return Self.error(.badRequest, .badRequest, "name may not hold control or formatting characters")
            }
        }
        guard body.user != lan.host else {
            return Self.error(.conflict, .badRequest, "\(lan.host) is the user of the device you are calling; call it under another user id")
        }
        if let expected = lan.pin {
            switch lanGate.admit(address: context.remoteAddress?.ipAddress ?? "unknown") {
            case .admitted:
                break
            case .wait(let wait, let everyone):
                let seconds = AddressRateLimiter.retryAfter(wait)
                var response = Self.error(.tooManyRequests, .rateLimited, everyone
                    ? "too many wrong PINs from this network; \(lan.host) takes none for \(seconds) s"
                    : "too many PIN tries from this address; retry in \(seconds) s")
                response.headers[.retryAfter] = "\(seconds)"
                return response
            }
            guard let given = body.pin else { return Self.error(.forbidden, .forbidden, "\(lan.host) asks for a PIN") }
            guard Self.constantTimeEqual(given, expected) else {
                lanGate.failed()
                return Self.error(.forbidden, .forbidden, "wrong PIN")
            }
        }
        // One user id, one caller: a second would take over the first's session and calls.
        guard await !isPresent(body.user) else {
            return Self.error(.conflict, .badRequest, "\(body.user) is already connected here; call under another user id")
        }
        let minted = try await tokens.mint(user: body.user, name: body.name, lifetime: lan.tokenLifetime)
        return Self.json(DevTokenResponse(token: minted.token, expiresAt: Int64(minted.expiresAt.timeIntervalSince1970 * 1000)))
    }

    private func identity(_ request: Request, allowQuery: Bool = false) async -> Identity? {
        guard let token = WebSocketEndpoint<ContinuousClock>.bearerToken(headers: request.headers, path: request.uri.string,
                                                                          allowQuery: allowQuery) else { return nil }
        return try? await tokens.verify(token)
    }

    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let (x, y) = (Array(a.utf8), Array(b.utf8))
        guard x.count == y.count else { return false }
        return zip(x, y).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
    }

    // MARK: Responses

    static let corsHeaders: HTTPFields = [.accessControlAllowOrigin: "*"]

    static var unauthorized: Response { error(.unauthorized, .unauthorized, "a valid access token is required") }

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static func error(_ status: HTTPResponse.Status, _ code: ErrorCode, _ message: String) -> Response {
        json(HTTPErrorBody(code: code, message: message), status: status)
    }

    static func decode<T: Decodable>(_ type: T.Type, from request: Request) async -> Result<T, ResponseFailure> {
        let body: ByteBuffer
        do {
            body = try await request.body.collect(upTo: maxBody)
        } catch {
            return .failure(ResponseFailure(Self.error(.contentTooLarge, .payloadTooLarge, "the body is larger than \(maxBody) bytes")))
        }
        do {
            return .success(try JSONDecoder().decode(T.self, from: Data(body.readableBytesView)))
        } catch {
            let described = WireCodec.describe(error, in: Data(body.readableBytesView))
            return .failure(ResponseFailure(self.error(.badRequest, .badRequest, described.message)))
        }
    }

    struct ResponseFailure: Error {
        var response: Response
        init(_ response: Response) { self.response = response }
    }
}


/// The request context of Parley's routes: Hummingbird's, and where the request came from.
struct ParleyRequestContext: RequestContext, RemoteAddressRequestContext {
    var coreContext: CoreRequestContextStorage
    let remoteAddress: SocketAddress?

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        remoteAddress = source.channel.remoteAddress
    }

    var isFromLoopback: Bool {
        guard let address = remoteAddress?.ipAddress else { return false }
        return address.hasPrefix("127.") || address == "::1" || address.hasPrefix("::ffff:127.")
    }
}
