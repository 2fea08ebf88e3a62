import Foundation
import ParleyKit
import ParleyProtocol

/// A signaling transport with no network: each `connect` hands the test a `ScriptedConnection` on
/// which it plays the server (reads the client's frames, sends frames, closes with a code).
public final class InMemorySignalingTransport: SignalingTransport, @unchecked Sendable {
    public let connections: AsyncStream<ScriptedConnection>
    private let sink: AsyncStream<ScriptedConnection>.Continuation
    private let lock = NSLock()
    private var refusals = 0
    public private(set) var tokensSeen: [String] = []

    public init() { (connections, sink) = AsyncStream.makeStream() }

    /// The next `count` connection attempts fail, as a refused upgrade would.
    public func refuseNext(_ count: Int) { lock.withLock { refusals += count } }

    public struct Refused: Error {}

    public func connect(to url: URL, token: String) async throws -> any SignalingConnection {
        try lock.withLock {
            tokensSeen.append(token)
            if refusals > 0 {
                refusals -= 1
                throw Refused()
            }
        }
        let connection = ScriptedConnection()
        sink.yield(connection)
        return connection
    }
}

/// Both ends of one in-memory connection: the client's (`SignalingConnection`) and the test's.
public final class ScriptedConnection: SignalingConnection, @unchecked Sendable {
    public let events: AsyncStream<TransportEvent>
    private let sink: AsyncStream<TransportEvent>.Continuation
    /// What the client sent, decoded.
    public let sent: AsyncStream<ClientMessage>
    private let sentSink: AsyncStream<ClientMessage>.Continuation
    private let lock = NSLock()
    private var closed = false

    /// Whether either side has closed it.
    public var isClosed: Bool { lock.withLock { closed } }

    init() {
        (events, sink) = AsyncStream.makeStream()
        (sent, sentSink) = AsyncStream.makeStream()
    }

    public func send(_ text: String) {
        if let message = try? WireCodec().decodeClientMessage(text) { sentSink.yield(message) }
    }

    public func close() { serverClose(code: nil) }

    /// Plays the server: sends a frame to the client.
    public func serverSend(_ frame: ServerFrame) {
        sink.yield(.text(String(decoding: WireCodec().encode(frame), as: UTF8.self)))
    }

    /// Plays the server: closes the connection with `code`.
    public func serverClose(code: UInt16?) {
        let first = lock.withLock {
            defer { closed = true }
            return !closed
        }
        guard first else { return }
        sink.yield(.closed(code: code))
        sink.finish()
        sentSink.finish()
    }
}
