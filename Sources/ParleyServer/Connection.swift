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
    /// A frame re-sent on resume, from the session's resume buffer.
    func replay(_ text: String)
    /// No more frames will be written.
    func finish()
}

extension ConnectionSink {
    public func replay(_ text: String) { write(.text(text)) }
}

extension AsyncStream.Continuation: ConnectionSink where Element == OutboundFrame {
    public func write(_ frame: OutboundFrame) { yield(frame) }
}

/// A connection's outbound frames on their way to the writer, bounded in bytes: a client that
/// reads slower than the server writes would otherwise hold an ever-growing queue. Past the bound,
/// the queued text frames are dropped and the writer closes with 4010 (they are all in the session's
/// resume buffer, so the client loses nothing when it resumes). Frames replayed on resume are not
/// counted: they are the resume buffer's own strings, already bounded by it.
final class BoundedOutbound: ConnectionSink {
    enum Queued: Sendable {
        case text(String, counted: Bool)
        case close(CloseCode, reason: String)
    }

    let frames: AsyncStream<Queued>
    private let continuation: AsyncStream<Queued>.Continuation
    private let limit: Int
    private let onOverflow: @Sendable () -> Void
    private let state = NIOLockedValueBox((queuedBytes: 0, overflowed: false))

    init(limit: Int, onOverflow: @escaping @Sendable () -> Void) {
        self.limit = limit
        self.onOverflow = onOverflow
        (frames, continuation) = AsyncStream.makeStream()
    }

    func write(_ frame: OutboundFrame) {
        switch frame {
        case .close(let code, let reason):
            continuation.yield(.close(code, reason: reason))
        case .text(let text):
            let overflowsNow: Bool? = state.withLockedValue { state in
                guard !state.overflowed else { return nil }
                state.queuedBytes += text.utf8.count
                state.overflowed = state.queuedBytes > limit
                return state.overflowed
            }
            switch overflowsNow {
            case nil: return
            case false?: continuation.yield(.text(text, counted: true))
            case true?:
                continuation.yield(.close(.tooSlow, reason: "the client reads too slowly; resume"))
                continuation.finish()
                onOverflow()
            }
        }
    }

    func replay(_ text: String) {
        continuation.yield(.text(text, counted: false))
    }

    func finish() { continuation.finish() }

    /// Whether the queue overflowed: the writer skips the text frames still queued and closes.
    var overflowed: Bool { state.withLockedValue { $0.overflowed } }

    /// The writer wrote a counted text frame of `size` bytes.
    func written(_ size: Int) {
        state.withLockedValue { $0.queuedBytes -= size }
    }
}

/// The hub's handle on one transport connection (a WebSocket, or an in-memory pipe in tests).
public final class Connection: Sendable {
    public let id: UInt64
    public let identity: Identity
    /// The peer's IP address, when the transport has one.
    public let address: String?
    let outbound: any ConnectionSink
    /// When the peer last sent anything, data or control frame, on the hub's timeline.
    let lastActivity: NIOLockedValueBox<Duration>

    public init(id: UInt64, identity: Identity, outbound: any ConnectionSink, now: Duration, address: String? = nil) {
        self.id = id
        self.identity = identity
        self.address = address
        self.outbound = outbound
        self.lastActivity = NIOLockedValueBox(now)
    }

    /// Records that the peer sent something (any frame, WebSocket pings included).
    public func touch(now: Duration) {
        lastActivity.withLockedValue { $0 = now }
    }
}
