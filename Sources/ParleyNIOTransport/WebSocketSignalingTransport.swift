import Foundation
import HTTPTypes
import Logging
import NIOCore
import NIOPosix
import ParleyKit
import ParleyWebSocket
import WSClient

/// The SDK's signaling transport on Linux (and macOS without Apple frameworks): a WebSocket from
/// swift-websocket on SwiftNIO, offering the `parley.v1` subprotocol. A connection that cannot be
/// opened throws a `SignalingConnectError` saying why: refused, a name that does not resolve, TLS,
/// the upgrade's HTTP status, or a timeout.
public struct WebSocketSignalingTransport: SignalingTransport {
    public var maxFrameSize: Int
    /// How long a close waits for the server's answering close frame before it drops the connection.
    public var closeTimeout: Duration
    private let eventLoopGroup: any EventLoopGroup
    private let logger: Logger

    public init(maxFrameSize: Int = 64 * 1024, closeTimeout: Duration = .seconds(2), eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                logger: Logger = Logger(label: "parley.websocket", factory: { _ in SwiftLogNoOpLogHandler() })) {
        self.maxFrameSize = maxFrameSize
        self.closeTimeout = closeTimeout
        self.eventLoopGroup = eventLoopGroup
        self.logger = logger
    }

    public func connect(to url: URL, token: String) async throws -> any SignalingConnection {
        var headers = HTTPFields()
        headers[.authorization] = "Bearer \(token)"
        headers[.secWebSocketProtocol] = "parley.v1"
        do {
            // A close waits `closeTimeout` for the server's answering close, then drops the
            // connection: on a path gone silent (what the heartbeat gives up on) none ever comes.
            let socket = try await TextWebSocket.connect(to: url.absoluteString, headers: headers, maxFrameSize: maxFrameSize,
                                                         closeTimeout: closeTimeout, eventLoopGroup: eventLoopGroup, logger: logger)
            return Connection(socket)
        } catch is CancellationError {
            throw SignalingConnectError(.timeout, message: "no connection to \(url.host ?? url.absoluteString) in time")
        } catch {
            throw await classify(error, url: url, token: token)
        }
    }

    /// What went wrong, in the terms the client decides on.
    private func classify(_ error: any Error, url: URL, token: String) async -> SignalingConnectError {
        let host = url.host ?? url.absoluteString
        if let error = error as? NIOConnectionError {
            if error.connectionErrors.isEmpty, error.dnsAError != nil || error.dnsAAAAError != nil {
                return SignalingConnectError(.nameNotFound, message: "the name \(host) does not resolve")
            }
            let causes = error.connectionErrors.map(\.error)
            if !causes.isEmpty, causes.allSatisfy(Self.isRefusal) {
                return SignalingConnectError(.refused, message: "connection refused")
            }
            if causes.contains(where: Self.isTimeout) {
                return SignalingConnectError(.timeout, message: "no connection to \(host) in time")
            }
            return SignalingConnectError(.other, message: "\(error)")
        }
        if Self.isRefusal(error) { return SignalingConnectError(.refused, message: "connection refused") }
        if Self.isTimeout(error) { return SignalingConnectError(.timeout, message: "no connection to \(host) in time") }
        if error is SocketAddressError.UnknownHost {
            return SignalingConnectError(.nameNotFound, message: "the name \(host) does not resolve")
        }
        // NIOSSL's errors, named by their module: this target does not depend on NIOSSL itself.
        if String(reflecting: type(of: error)).hasPrefix("NIOSSL.") {
            return SignalingConnectError(.tls, message: "the TLS handshake with \(host) failed (\(error))")
        }
        if let error = error as? WebSocketClientError, error == .webSocketUpgradeFailed {
            let status = await upgradeStatus(url: url, token: token)
            return SignalingConnectError(.upgradeRefused, httpStatus: status,
                                         message: "the server refused the WebSocket upgrade\(status.map { " (HTTP \($0))" } ?? "")")
        }
        return SignalingConnectError(.other, message: "\(error)")
    }

    private static func isRefusal(_ error: any Error) -> Bool {
        (error as? IOError)?.errnoCode == ECONNREFUSED
    }

    private static func isTimeout(_ error: any Error) -> Bool {
        if case .connectTimeout? = error as? ChannelError { true } else { false }
    }

    /// The status the server answers the signaling URL with, asked again as a plain HTTP/1.1 GET:
    /// swift-websocket says only that the upgrade failed, not how the server answered. `ws:` only
    /// (this target has no TLS of its own); nil when it cannot be learnt within 3 s.
    private func upgradeStatus(url: URL, token: String) async -> Int? {
        guard url.scheme == "ws", let host = url.host else { return nil }
        let port = url.port ?? 80
        let target = (url.path.isEmpty ? "/" : url.path) + (url.query.map { "?\($0)" } ?? "")
        let authority = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        let request = "GET \(target) HTTP/1.1\r\nHost: \(authority)\r\nAuthorization: Bearer \(token)\r\nConnection: close\r\n\r\n"
        let group = eventLoopGroup
        return await withTaskGroup(of: Int?.self) { tasks in
            tasks.addTask {
                do {
                    let channel = try await ClientBootstrap(group: group).connectTimeout(.seconds(3)).connect(host: host, port: port) { channel in
                        channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
                    }
                    return try await channel.executeThenClose { inbound, outbound in
                        try await outbound.write(ByteBuffer(string: request))
                        var head = ByteBuffer()
                        for try await var chunk in inbound {
                            head.writeBuffer(&chunk)
                            // "HTTP/1.1 401 Unauthorized\r\n": the status is the second word of the first line.
                            let text = String(buffer: head)
                            guard let end = text.range(of: "\r\n") else { continue }
                            let words = text[..<end.lowerBound].split(separator: " ")
                            return words.count >= 2 ? Int(words[1]) : nil
                        }
                        return nil
                    }
                } catch {
                    return nil
                }
            }
            tasks.addTask {
                try? await Task.sleep(for: .seconds(3))
                return nil
            }
            let first = await tasks.next() ?? nil
            tasks.cancelAll()
            return first
        }
    }

    /// A signaling connection: the shared text WebSocket, its events in the SDK's terms.
    final class Connection: SignalingConnection {
        let events: AsyncStream<TransportEvent>
        private let socket: TextWebSocket

        init(_ socket: TextWebSocket) {
            self.socket = socket
            events = socket.events { event in
                switch event {
                case .text(let text): .text(text)
                case .closed(let code): .closed(code: code)
                }
            }
        }

        func send(_ text: String) { socket.send(text) }

        func close() { socket.close() }
    }
}
