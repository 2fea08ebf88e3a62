import HTTPTypes
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOWebSocket
import WSClient

/// A client WebSocket (RFC 6455) that carries text, on swift-websocket: the one connection type of
/// Parley's Janus client, the SDK's signaling transport on Linux and the benchmark, so that close
/// codes, cancellation and a peer gone silent are handled in one place.
///
/// - `events`: text frames as they arrive (binary ones are dropped), ending with exactly one
///   `.closed(code:)`: the peer's close code, or nil when the connection ended without one.
/// - `send(_:)`: queues a frame; frames leave in the order they were queued, one write at a time
///   (a slow peer holds the queue, not the caller).
/// - `close()`: sends a close frame and waits at most `closeTimeout` for the peer's answer, then
///   drops the connection: a peer on a path that went silent never answers. `closed()` waits for
///   the end. The peer closing first ends `events` the same way.
/// - Cancelling `connect` abandons the attempt.
public final class TextWebSocket: Sendable {
    public enum Event: Hashable, Sendable {
        case text(String)
        case closed(code: UInt16?)
    }

    public let events: AsyncStream<Event>
    private let outbound: AsyncStream<String?>.Continuation
    private let task: Task<Void, Never>
    private let ended: NIOLockedValueBox<Bool>

    /// Opens a connection to `url` (`ws:`; `wss:` with the TLS swift-websocket brings), with
    /// `headers` on the upgrade request (a subprotocol, a bearer token). Throws swift-websocket's
    /// or NIO's error when it cannot: the caller decides what each means (refused, not found, …).
    /// `autoPing`: a ping that often, and the connection closed when the peer's pong has not come
    /// by the next (for a peer that sends nothing, so that a dead path is noticed at all).
    public static func connect(to url: String, headers: HTTPFields = [:], maxFrameSize: Int, closeTimeout: Duration = .seconds(2),
                               autoPing: Duration? = nil,
                               eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                               logger: Logger = Logger(label: "parley.websocket", factory: { _ in SwiftLogNoOpLogHandler() }))
        async throws -> TextWebSocket {
        let configuration = WebSocketClientConfiguration(maxFrameSize: maxFrameSize, additionalHeaders: headers, closeTimeout: closeTimeout,
                                                         autoPing: autoPing.map { .enabled(timePeriod: $0) } ?? .disabled)
        let ended = NIOLockedValueBox(false)
        let (outbound, outboundSink) = AsyncStream<String?>.makeStream()
        let (events, eventSink) = AsyncStream<Event>.makeStream()
        let (ready, readySink) = AsyncStream<(any Error)?>.makeStream()
        let client = WebSocketClient(url: url, configuration: configuration, eventLoopGroup: eventLoopGroup, logger: logger) { inbound, writer, _ in
            readySink.yield(nil)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    for try await message in inbound.messages(maxSize: maxFrameSize) {
                        if case .text(let text) = message { eventSink.yield(.text(text)) }
                    }
                    // The peer closed: nothing more goes out.
                    outboundSink.finish()
                }
                // Until `close()` (nil) or the peer's close: leaving the handler makes swift-websocket
                // send the close frame and wait `closeTimeout` for the peer's.
                for await item in outbound {
                    guard let text = item else { break }
                    try await writer.write(.text(text))
                }
                group.cancelAll()
            }
        }
        // The connection's one task, from the upgrade to the end of the close: `closed()` awaits it.
        let task = Task {
            var code: UInt16?
            do {
                if let close = try await client.run() { code = UInt16(closeCode: close.closeCode) }
            } catch {
                readySink.yield(error)
            }
            ended.withLockedValue { $0 = true }
            eventSink.yield(.closed(code: code))
            eventSink.finish()
            readySink.finish()
            outboundSink.finish()
        }
        var iterator = ready.makeAsyncIterator()
        switch await withTaskCancellationHandler(operation: { await iterator.next() }, onCancel: { task.cancel() }) {
        case .some(nil):
            return TextWebSocket(events: events, outbound: outboundSink, task: task, ended: ended)
        case .some(.some(let error)):
            throw error
        case .none:
            throw WebSocketClientError.webSocketUpgradeFailed
        }
    }

    private init(events: AsyncStream<Event>, outbound: AsyncStream<String?>.Continuation, task: Task<Void, Never>,
                 ended: NIOLockedValueBox<Bool>) {
        self.events = events
        self.outbound = outbound
        self.task = task
        self.ended = ended
    }

    /// Whether the connection is down (`events` has its `.closed`, or is about to).
    public var isClosed: Bool { ended.withLockedValue { $0 } }

    /// `events` as another type (a transport's own event, or only the texts): `transform` answers
    /// nil to drop one. It reads `events`, which has one reader: use one or the other.
    public func events<Mapped: Sendable>(_ transform: @escaping @Sendable (Event) -> Mapped?) -> AsyncStream<Mapped> {
        let reader = Reader(events)
        return AsyncStream {
            while let event = await reader.next() {
                if let mapped = transform(event) { return mapped }
            }
            return nil
        }
    }

    /// The iterator of `events`, read by one consumer at a time (AsyncStream's own rule).
    private final class Reader: @unchecked Sendable {
        private var iterator: AsyncStream<Event>.Iterator
        init(_ events: AsyncStream<Event>) { iterator = events.makeAsyncIterator() }
        func next() async -> Event? { await iterator.next() }
    }

    /// Queues a text frame; false once the connection is closing or closed.
    @discardableResult
    public func send(_ text: String) -> Bool {
        if case .enqueued = outbound.yield(text) { true } else { false }
    }

    /// Starts the close (once; later calls do nothing); `events` then ends within `closeTimeout`.
    public func close() {
        outbound.yield(nil)
        outbound.finish()
    }

    /// Returns once the connection is down: closed by either side, or failed.
    public func closed() async {
        await task.value
    }
}

extension UInt16 {
    /// The number of a WebSocket close code (RFC 6455 §7.4).
    init(closeCode: WebSocketErrorCode) {
        var buffer = ByteBuffer()
        buffer.write(webSocketErrorCode: closeCode)
        self = buffer.readInteger(as: UInt16.self) ?? 1005
    }
}
