import Foundation
import HTTPTypes
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOWebSocket
import ParleyProtocol

/// The WebSocket side of `GET /v1/signal`: authenticates the upgrade, then reads frames (limits,
/// rate, decoding) into the hub and writes the hub's frames out.
struct WebSocketEndpoint<C: Clock>: Sendable where C.Duration == Duration {
    static var path: String { "/v1/signal" }
    static var subprotocol: String { "parley.v1" }
    static var closeHandshakeTimeout: Duration { .seconds(3) }
    /// How long a closing connection waits for a client that reads nothing to take its close frame.
    static var unreadCloseTimeout: Duration { .seconds(30) }

    let hub: SignalingHub<C>
    let tokens: TokenAuthority
    let originPolicy: OriginPolicy
    let metrics: ServerMetrics
    let logger: Logger
    /// Connections whose reader or writer still runs; shutdown waits for them to drain.
    let open: OpenConnections
    let limiter: AddressRateLimiter
    /// With several nodes on direct links, the other nodes' links arrive here (`NodeLinks.path`).
    let cluster: PostgresCluster?
    private let connectionIDs = NIOLockedValueBox<UInt64>(0)

    init(hub: SignalingHub<C>, tokens: TokenAuthority, metrics: ServerMetrics, open: OpenConnections,
         limiter: AddressRateLimiter, cluster: PostgresCluster? = nil, logger: Logger) {
        self.hub = hub
        self.cluster = cluster
        self.limiter = limiter
        self.tokens = tokens
        self.originPolicy = OriginPolicy(configuration: hub.configuration)
        self.metrics = metrics
        self.open = open
        self.logger = logger
    }

    /// The bearer token of a request: `Authorization: Bearer …`, or for browsers `?access_token=…`.
    static func bearerToken(headers: HTTPFields, path: String?, allowQuery: Bool) -> String? {
        if let authorization = headers[.authorization], authorization.lowercased().hasPrefix("bearer ") {
            return String(authorization.dropFirst("bearer ".count)).trimmingCharacters(in: .whitespaces)
        }
        guard allowQuery, let path, let query = URLComponents(string: path)?.queryItems else { return nil }
        return query.first { $0.name == "access_token" }?.value
    }

    /// Decides on an upgrade: 401 for a missing, forged or expired token, 403 for a page whose
    /// origin may not connect, 503 while shutting down (protocol v1: answered before the upgrade).
    func shouldUpgrade(_ request: HTTPRequest, channel: any Channel) async -> ShouldUpgradeResult<WebSocketDataHandler<HTTP1WebSocketUpgradeChannel.Context>> {
        let isLink = cluster != nil && request.path == NodeLinks.path
        guard let path = request.path, isLink || path.split(separator: "?", maxSplits: 1).first == Substring(Self.path) else {
            return await refuse(.notFound, .notFound, "WebSocket is served at \(Self.path) only", on: channel)
        }
        if let peer = channel.remoteAddress?.ipAddress,
           let wait = limiter.admit(AddressRateLimiter.client(peer: peer, forwardedFor: request.headerFields[.xForwardedFor],
                                                              trustedProxies: hub.configuration.trustedProxies)) {
            let seconds = AddressRateLimiter.retryAfter(wait)
            return await refuse(.tooManyRequests, .rateLimited, "too many requests from this address; retry in \(seconds) s",
                                retryAfter: seconds, on: channel)
        }
        if isLink, let cluster { return await linkUpgrade(request, channel: channel, cluster: cluster) }
        if await hub.isShuttingDown {
            return await refuse(.serviceUnavailable, .unavailable, "the server is shutting down; reconnect in a moment", on: channel)
        }
        guard let token = Self.bearerToken(headers: request.headerFields, path: path, allowQuery: true),
              let identity = try? await tokens.verify(token) else {
            return await refuse(.unauthorized, .unauthorized, "a valid access token is required", on: channel)
        }
        guard originPolicy.allows(origin: request.headerFields[.origin], host: request.authority) else {
            return await refuse(.forbidden, .forbidden, "pages from this origin may not connect (see --allowed-origins)", on: channel)
        }
        var headers = HTTPFields()
        let offered = request.headerFields[values: .secWebSocketProtocol]
            .flatMap { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
        if offered.contains(Self.subprotocol) { headers[.secWebSocketProtocol] = Self.subprotocol }
        let id = connectionIDs.withLockedValue { value in
            value += 1
            return value
        }
        return .upgrade(headers) { inbound, outbound, _ in
            await serve(id: id, identity: identity, channel: channel, inbound: inbound, outbound: outbound)
        }
    }

    /// Another node's link: it shows the deployment's key for the pair of nodes and its time
    /// (`NodeLinks`); then its frames are heard as the cluster's messages until it closes or this
    /// node leaves.
    private func linkUpgrade(_ request: HTTPRequest, channel: any Channel,
                             cluster: PostgresCluster) async -> ShouldUpgradeResult<WebSocketDataHandler<HTTP1WebSocketUpgradeChannel.Context>> {
        guard let header = request.headerFields[NodeLinks.nodeHeader],
              let authorization = Self.bearerToken(headers: request.headerFields, path: nil, allowQuery: false),
              let other = cluster.linkingNode(header: header, authorization: authorization) else {
            return await refuse(.unauthorized, .unauthorized, "a node link needs this deployment's key", on: channel)
        }
        return .upgrade([:]) { inbound, _, _ in
            let frames = inbound.messages(maxSize: NodeLinks.frameLimit + 8 * 1024).compactMap { message -> String? in
                if case .text(let text) = message { text } else { nil }
            }
            await cluster.hear(link: channel, from: other, version: request.headerFields[NodeLinks.versionHeader].flatMap { Int($0) },
                               frames: frames)
            // Heard no more (this node leaves): the link closes.
            channel.close(promise: nil)
        }
    }

    /// Answers a refused upgrade with its own status and protocol v1's error body, and closes.
    /// (Hummingbird answers every refused upgrade with a bare 400, which tells a client nothing.)
    private func refuse(_ status: HTTPResponse.Status, _ code: ErrorCode, _ message: String, retryAfter: Int? = nil,
                        on channel: any Channel) async -> ShouldUpgradeResult<WebSocketDataHandler<HTTP1WebSocketUpgradeChannel.Context>> {
        let body = ByteBuffer(bytes: (try? JSONEncoder().encode(HTTPErrorBody(code: code, message: message))) ?? Data())
        var headers = HTTPHeaders()
        if let retryAfter { headers.add(name: "Retry-After", value: "\(retryAfter)") }
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: "\(body.readableBytes)")
        headers.add(name: "Connection", value: "close")
        let head = HTTPResponseHead(version: .http1_1, status: .init(statusCode: status.code), headers: headers)
        try? await channel.writeAndFlush(HTTPServerResponsePart.head(head)).get()
        try? await channel.writeAndFlush(HTTPServerResponsePart.body(.byteBuffer(body))).get()
        try? await channel.writeAndFlush(HTTPServerResponsePart.end(nil)).get()
        // Hummingbird then finds the channel closed and logs it as an error: `RefusedUpgradeLogHandler`
        // keeps that from being a log line per request an attacker sends.
        try? await channel.close().get()
        return .dontUpgrade
    }

    private func serve(id: UInt64, identity: Identity, channel: any Channel,
                       inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter) async {
        open.opened()
        defer { open.closed() }
        let limits = hub.configuration.limits
        let inboundEnded = NIOLockedValueBox(false)
        let frames: NIOLoopBound<EncodedFrameWriter>
        do {
            frames = try await Self.installFrameWriter(on: channel)
        } catch {
            // The connection closed before it could be served.
            logger.debug("websocket closed before it was served", metadata: ["connection.id": "\(id)", "error": "\(error)"])
            return
        }
        let outboundQueue = ChannelOutbound(channel: channel, frames: frames, limit: limits.outboundBufferBytes) { [logger, metrics] in
            logger.notice("closing a connection that reads too slowly", metadata: ["connection.id": "\(id)"])
            metrics.slowConnections.increment()
        } closeHandshake: { [open] code, reason in
            // The one task a connection gets besides its reader, and only while it closes; shutdown
            // waits for it as for the reader.
            open.opened()
            Task {
                defer { open.closed() }
                // A client that stopped reading holds the close frame behind what it did not read;
                // one that reads again gets it. One that never does must not hold the connection,
                // or a graceful shutdown, forever.
                let timeUp = channel.eventLoop.scheduleTask(in: TimeAmount(Self.unreadCloseTimeout)) { channel.close(promise: nil) }
                defer { timeUp.cancel() }
                try? await outbound.close(.init(codeNumber: Int(code.rawValue)), reason: reason)
                // Nor one that does not answer the close.
                let deadline = ContinuousClock.now + Self.closeHandshakeTimeout
                while !inboundEnded.withLockedValue({ $0 }), channel.isActive, ContinuousClock.now < deadline {
                    try? await Task.sleep(for: .milliseconds(20))
                }
                try? await channel.close()
            }
        }
        let connection = Connection(id: id, identity: identity, outbound: outboundQueue, now: hub.now(),
                                    address: channel.remoteAddress?.ipAddress)
        await Self.observeActivity(on: channel, closing: frames) { [hub] in connection.touch(now: hub.now()) }
        await hub.connect(connection)

        var limiter = RateLimiter(rate: limits.framesPerSecond, burst: limits.burst, maxRefused: limits.maxRefused,
                                  refusedWindow: limits.refusedWindow, now: hub.now())
        let codec = WireCodec()
        // Once the server closed the connection, what the client still sends is read and dropped
        // until it answers the close: a socket closed with unread data is reset, and the client
        // would lose the close code and the frames before it.
        var closing = false
        do {
            reading: for try await message in inbound.messages(maxSize: limits.maxFrameSize) {
                guard !closing else { continue reading }
                let now = hub.now()
                connection.touch(now: now)
                guard case .text(let text) = message else {
                    await hub.close(id, code: .unsupportedData, reason: "binary frames are not part of protocol v1")
                    closing = true
                    continue reading
                }
                switch limiter.admit(now: now) {
                case .allow:
                    break
                case .refuse:
                    let requestID = codec.requestID(in: text)
                    await hub.refuse(id, requestID: requestID, code: .rateLimited, message: "too many frames; slow down")
                    continue reading
                case .close:
                    await hub.close(id, code: .rateLimited, reason: "too many frames")
                    closing = true
                    continue reading
                }
                do throws(ProtocolError) {
                    let decoded = try codec.decodeClientMessage(text)
                    await hub.receive(id, decoded, text: text)
                } catch {
                    await hub.refuse(id, requestID: error.requestID, code: error.errorCode, message: error.message)
                }
            }
        } catch {
            logger.debug("websocket read ended", metadata: ["connection.id": "\(id)", "error": "\(error)"])
        }
        inboundEnded.withLockedValue { $0 = true }
        await hub.disconnected(id)
    }

    /// Installs the writer of the hub's frames right before NIO's WebSocket frame encoder (on the
    /// socket's side of it).
    private static func installFrameWriter(on channel: any Channel) async throws -> NIOLoopBound<EncodedFrameWriter> {
        try await channel.eventLoop.submit {
            let encoder = try channel.pipeline.syncOperations.handler(type: WebSocketFrameEncoder.self)
            let writer = EncodedFrameWriter()
            try channel.pipeline.syncOperations.addHandler(writer, position: .before(encoder))
            return NIOLoopBound(writer, eventLoop: channel.eventLoop)
        }.get()
    }

    /// Installs a handler right after the WebSocket frame decoder that notes every inbound frame,
    /// WebSocket pings included, so they count as heartbeats, and shuts `closing` once a close frame
    /// goes out.
    private static func observeActivity(on channel: any Channel, closing frames: NIOLoopBound<EncodedFrameWriter>,
                                        _ onFrame: @escaping @Sendable () -> Void) async {
        try? await channel.eventLoop.submit {
            let decoder = try channel.pipeline.syncOperations.handler(type: ByteToMessageHandler<WebSocketFrameDecoder>.self)
            try channel.pipeline.syncOperations.addHandler(FrameActivityHandler(onFrame: onFrame, closing: frames.value),
                                                           position: .after(decoder))
        }.get()
    }
}

/// Sits right after the WebSocket frame decoder. Inbound, it notes every frame the client sends.
/// Outbound, it lets nothing follow a close frame (RFC 6455, 5.5.1): the hub writes below it
/// (`EncodedFrameWriter`), and until it learns of a close that swift-websocket sent on its own
/// (answering the client's, or a protocol error) its frames would go out after it. Once a close
/// passes here, that writer is shut too.
final class FrameActivityHandler: ChannelDuplexHandler {
    typealias InboundIn = WebSocketFrame
    typealias InboundOut = WebSocketFrame
    typealias OutboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    let onFrame: @Sendable () -> Void
    /// The hub's writer, shut with this handler. Touched on the channel's event loop only: the
    /// handler is made and added there.
    private let closing: EncodedFrameWriter?
    private var closeSent = false

    init(onFrame: @escaping @Sendable () -> Void, closing: EncodedFrameWriter? = nil) {
        self.onFrame = onFrame
        self.closing = closing
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Pongs only answer the server; the heartbeat is what the client sends of its own accord.
        if unwrapInboundIn(data).opcode != .pong { onFrame() }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard !closeSent else {
            promise?.fail(ChannelError.outputClosed)
            return
        }
        if unwrapOutboundIn(data).opcode == .connectionClose {
            closeSent = true
            closing?.closeSent = true
        }
        context.write(data, promise: promise)
    }
}

/// Counts the WebSocket connections still being served, so a graceful shutdown can wait until every
/// client got its last frames and its close.
final class OpenConnections: Sendable {
    private let count = NIOLockedValueBox(0)

    func opened() { count.withLockedValue { $0 += 1 } }
    func closed() { count.withLockedValue { $0 -= 1 } }
    var current: Int { count.withLockedValue { $0 } }

    /// Waits until no connection is open, or `limit` has passed.
    func drained(within limit: Duration) async {
        let deadline = ContinuousClock.now + limit
        while current > 0, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
    }
}

/// Hummingbird logs "Error handling upgrade result" when the channel of a refused upgrade is closed
/// before it can wrap it — which `WebSocketEndpoint.refuse` does after its answer, on purpose. That
/// one message, with that one error, goes to debug; everything else passes through unchanged.
struct RefusedUpgradeLogHandler: LogHandler {
    var wrapped: any LogHandler

    var logLevel: Logger.Level {
        get { wrapped.logLevel }
        set { wrapped.logLevel = newValue }
    }

    var metadata: Logger.Metadata {
        get { wrapped.metadata }
        set { wrapped.metadata = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { wrapped[metadataKey: key] }
        set { wrapped[metadataKey: key] = newValue }
    }

    func log(event: LogEvent) {
        var event = event
        if event.level == .error, event.message.description == "Error handling upgrade result",
           event.metadata?["error.type"]?.description.contains("Inappropriate operation for state") == true {
            guard wrapped.logLevel <= .debug else { return }
            event.level = .debug
        }
        wrapped.log(event: event)
    }
}
