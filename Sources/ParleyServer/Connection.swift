import NIOConcurrencyHelpers
import NIOCore
import NIOWebSocket
import ParleyProtocol

/// What the hub asks a connection's writer to do.
public enum OutboundFrame: Sendable, Equatable {
    case text(String)
    case close(CloseCode, reason: String)
}

/// Where the hub writes a connection's frames: the WebSocket endpoint writes them into the
/// connection's channel (`ChannelOutbound`); the hub's tests and fuzzers record them.
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

/// A connection's outbound frames, written straight into its channel (NIO hops to the channel's
/// event loop): no task per connection waits for them, which is most of what an idle connection
/// costs (a task keeps its stack slab for as long as it lives). Bounded in bytes: a client that
/// reads slower than the server writes would otherwise hold an ever-growing queue. Past the bound,
/// nothing more is written and the connection closes with 4010 (every frame is in the session's
/// resume buffer, so the client loses nothing when it resumes). Frames replayed on resume are not
/// counted: they are the resume buffer's own strings, already bounded by it.
///
/// Frames go out as they are, unmasked and unextended: a server masks nothing, and Parley
/// negotiates no WebSocket extension. The close goes through `closeHandshake`, which owns the
/// WebSocket's close handshake.
///
/// Frames written while the channel's event loop is busy wait for its next turn and go out
/// together, with one flush (one `writev`): a busy relay writes many frames to one connection
/// between two turns, and a flush per frame was a fifth of its time.
final class ChannelOutbound: ConnectionSink {
    private let channel: any Channel
    private let limit: Int
    private let onOverflow: @Sendable () -> Void
    private let closeHandshake: @Sendable (CloseCode, String) -> Void
    private struct State {
        var queuedBytes = 0
        var closing = false
        /// Frames for the event loop's next turn, with the bytes each counts (0: a replayed frame).
        var pending: [(text: String, counted: Int)] = []
    }
    private let state = NIOLockedValueBox(State())

    init(channel: any Channel, limit: Int, onOverflow: @escaping @Sendable () -> Void,
         closeHandshake: @escaping @Sendable (CloseCode, String) -> Void) {
        self.channel = channel
        self.limit = limit
        self.onOverflow = onOverflow
        self.closeHandshake = closeHandshake
    }

    func write(_ frame: OutboundFrame) {
        switch frame {
        case .close(let code, let reason):
            guard state.withLockedValue({ state in
                defer { state.closing = true }
                return !state.closing
            }) else { return }
            closeHandshake(code, reason)
        case .text(let text):
            let size = text.utf8.count
            let overflows: Bool? = state.withLockedValue { state in
                guard !state.closing else { return nil }
                state.queuedBytes += size
                state.closing = state.queuedBytes > limit
                return state.closing
            }
            switch overflows {
            case nil: return
            case false?: send(text, counted: size)
            case true?:
                onOverflow()
                closeHandshake(.tooSlow, "the client reads too slowly; resume")
            }
        }
    }

    func replay(_ text: String) {
        guard !state.withLockedValue({ $0.closing }) else { return }
        send(text, counted: 0)
    }

    func finish() { state.withLockedValue { $0.closing = true } }

    private func send(_ text: String, counted size: Int) {
        let first = state.withLockedValue { state in
            state.pending.append((text, size))
            return state.pending.count == 1
        }
        if first { channel.eventLoop.execute { self.writePending() } }
    }

    /// On the event loop: every frame gathered since its last turn, in order, and one flush.
    private func writePending() {
        let frames = state.withLockedValue { state in
            defer { state.pending = [] }
            return state.pending
        }
        guard let last = frames.last else { return }
        var counted = 0
        for (text, size) in frames.dropLast() {
            channel.write(WebSocketFrame(fin: true, opcode: .text, data: channel.allocator.buffer(string: text)), promise: nil)
            counted += size
        }
        counted += last.counted
        // Writes complete in order: the last one's completion says the bytes of all have left.
        let written = channel.eventLoop.makePromise(of: Void.self)
        channel.write(WebSocketFrame(fin: true, opcode: .text, data: channel.allocator.buffer(string: last.text)), promise: written)
        channel.flush()
        guard counted > 0 else { return }
        written.futureResult.whenComplete { [state, counted] _ in state.withLockedValue { $0.queuedBytes -= counted } }
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
