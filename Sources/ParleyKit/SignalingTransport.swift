import Foundation

/// What a signaling connection reports.
public enum TransportEvent: Hashable, Sendable {
    /// A text frame from the server.
    case text(String)
    /// The connection ended; `code` is the WebSocket close code the server sent, if any.
    case closed(code: UInt16?)
}

/// An open signaling connection (a WebSocket in production).
public protocol SignalingConnection: Sendable {
    /// Frames as they arrive, ending with exactly one `.closed`.
    var events: AsyncStream<TransportEvent> { get }
    /// Queues a text frame; frames go out in the order they were queued.
    func send(_ text: String)
    /// Closes the connection; `events` then ends.
    func close()
}

/// Opens signaling connections: NIO's WebSocket client on Linux, URLSessionWebSocketTask on Apple.
public protocol SignalingTransport: Sendable {
    /// Opens a connection authenticated with `token`; throws when the server refuses it.
    func connect(to url: URL, token: String) async throws -> any SignalingConnection
}
