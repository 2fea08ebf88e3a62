import NIOConcurrencyHelpers
import ParleyProtocol

/// What the hub asks a connection's writer to do.
public enum OutboundFrame: Sendable, Equatable {
    case text(String)
    case close(CloseCode, reason: String)
}

/// Where the hub writes a connection's frames. The WebSocket endpoint uses an `AsyncStream`'s
/// continuation; tests record frames synchronously.
public protocol ConnectionSink: Sendable {
    func write(_ frame: OutboundFrame)
    /// No more frames will be written.
    func finish()
}

extension AsyncStream.Continuation: ConnectionSink where Element == OutboundFrame {
    public func write(_ frame: OutboundFrame) { yield(frame) }
}

/// The hub's handle on one transport connection (a WebSocket, or an in-memory pipe in tests).
public final class Connection: Sendable {
    public let id: UInt64
    public let identity: Identity
    let outbound: any ConnectionSink
    /// When the peer last sent anything, data or control frame, on the hub's timeline.
    let lastActivity: NIOLockedValueBox<Duration>

    public init(id: UInt64, identity: Identity, outbound: any ConnectionSink, now: Duration) {
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
