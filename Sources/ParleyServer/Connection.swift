import NIOConcurrencyHelpers
import NIOCore
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
/// between two turns, and a flush per frame was a fifth of its time. They are encoded together too,
/// into one buffer (`EncodedFrameWriter`), where NIO's WebSocket encoder made two a frame.
final class ChannelOutbound: ConnectionSink {
    private let channel: any Channel
    private let frames: NIOLoopBound<EncodedFrameWriter>
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

    /// - Parameter frames: the connection's writer of encoded frames, installed in its pipeline.
    init(channel: any Channel, frames: NIOLoopBound<EncodedFrameWriter>, limit: Int, onOverflow: @escaping @Sendable () -> Void,
         closeHandshake: @escaping @Sendable (CloseCode, String) -> Void) {
        self.channel = channel
        self.frames = frames
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

    /// On the event loop: every frame gathered since its last turn, in order, in one buffer, and one flush.
    private func writePending() {
        let pending = state.withLockedValue { state in
            defer { state.pending = [] }
            return state.pending
        }
        guard !pending.isEmpty else { return }
        let counted = pending.reduce(0) { $0 + $1.counted }
        // Counted bytes leave the bound once written (or once the write failed).
        let written = counted > 0 ? channel.eventLoop.makePromise(of: Void.self) : nil
        frames.value.write(pending.lazy.map(\.text), promise: written)
        written?.futureResult.whenComplete { [state] _ in state.withLockedValue { $0.queuedBytes -= counted } }
    }
}

/// Writes the hub's frames of a connection (`ChannelOutbound`), encoded as WebSocket text frames
/// into one buffer a batch, straight to the socket's side of the pipeline: it sits between NIO's
/// WebSocket frame encoder and the socket (or TLS). Frames go out unmasked and unextended: a server
/// masks nothing, and Parley negotiates no WebSocket extension.
///
/// Nothing follows a close frame (RFC 6455, 5.5.1): `FrameActivityHandler` sees every close that
/// goes out, the hub's and swift-websocket's own, and shuts this writer (`closeSent`).
final class EncodedFrameWriter: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Touched on the channel's event loop only, as everything here.
    private var context: ChannelHandlerContext?
    /// A close frame went out: what comes after it is not written.
    var closeSent = false

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    /// Writes the texts as one buffer of text frames, and flushes.
    func write(_ texts: some Collection<String>, promise: EventLoopPromise<Void>?) {
        guard let context, !closeSent else {
            promise?.fail(ChannelError.outputClosed)
            return
        }
        var buffer = context.channel.allocator.buffer(capacity: texts.reduce(0) { $0 + 10 + $1.utf8.count })
        for text in texts { Self.appendTextFrame(text, to: &buffer) }
        context.writeAndFlush(wrapOutboundOut(buffer), promise: promise)
    }

    /// A final, unmasked text frame (RFC 6455, 5.2): FIN and the opcode, the length in 7 bits or
    /// 126 and 16 bits or 127 and 64 bits, then the payload.
    static func appendTextFrame(_ text: String, to buffer: inout ByteBuffer) {
        let length = text.utf8.count
        buffer.writeInteger(UInt8(0x81))
        if length < 126 {
            buffer.writeInteger(UInt8(length))
        } else if length <= Int(UInt16.max) {
            buffer.writeInteger(UInt8(126))
            buffer.writeInteger(UInt16(length))
        } else {
            buffer.writeInteger(UInt8(127))
            buffer.writeInteger(UInt64(length))
        }
        buffer.writeString(text)
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
