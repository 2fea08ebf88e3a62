import NIOConcurrencyHelpers
import ParleyProtocol

/// What the hub asks a connection's writer to do.
public enum OutboundFrame: Sendable, Equatable {
    case text(String)
    case close(CloseCode, reason: String)
}

/// The hub's handle on one transport connection (a WebSocket, or an in-memory pipe in tests).
public final class Connection: Sendable {
    public let id: UInt64
    public let identity: Identity
    let outbound: AsyncStream<OutboundFrame>.Continuation
    /// When the peer last sent anything, data or control frame, on the hub's timeline.
    let lastActivity: NIOLockedValueBox<Duration>

    public init(id: UInt64, identity: Identity, outbound: AsyncStream<OutboundFrame>.Continuation, now: Duration) {
        self.id = id
        self.identity = identity
        self.outbound = outbound
        self.lastActivity = NIOLockedValueBox(now)
    }

    /// Records that the peer sent something (any frame, WebSocket pings included).
    public func touch(now: Duration) {
        lastActivity.withLockedValue { $0 = now }
    }
}
