import HTTPTypes
import Logging
import NIOCore
import NIOPosix
import ParleyWebSocket

/// The Janus WebSocket API (subprotocol `janus-protocol`) on the shared text WebSocket.
public final class JanusWebSocketTransport: JanusTransport {
    public let incoming: AsyncStream<String>
    private let socket: TextWebSocket

    /// Connects; throws when Janus cannot be reached or refuses the upgrade.
    public static func connect(to url: String, maxFrameSize: Int = 1 << 20,
                               eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                               logger: Logger = Logger(label: "parley.janus", factory: { _ in SwiftLogNoOpLogHandler() })) async throws -> JanusWebSocketTransport {
        var headers = HTTPFields()
        headers[.secWebSocketProtocol] = "janus-protocol"
        let socket = try await TextWebSocket.connect(to: url, headers: headers, maxFrameSize: maxFrameSize, eventLoopGroup: eventLoopGroup,
                                                     logger: logger)
        return JanusWebSocketTransport(socket)
    }

    private init(_ socket: TextWebSocket) {
        self.socket = socket
        incoming = socket.events { if case .text(let text) = $0 { text } else { nil } }
    }

    public func send(_ text: String) async throws {
        guard socket.send(text) else { throw JanusError.disconnected }
    }

    /// Closes, waiting at most the socket's close timeout for Janus's answer (a Janus on a path gone
    /// silent never answers).
    public func close() async {
        socket.close()
        await socket.closed()
    }
}
