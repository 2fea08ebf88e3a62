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

/// Why a transport could not open a signaling connection, as it classifies the failure. The
/// client decides from `code` whether to try again; a transport that cannot tell throws its own
/// error, which counts as `.other`.
public struct SignalingConnectError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: Hashable, Sendable {
        /// Nothing listens at the address (the connection was refused).
        case refused
        /// The host name does not resolve.
        case nameNotFound
        /// The TLS handshake failed (a certificate that does not verify, no common protocol).
        case tls
        /// The server answered the WebSocket upgrade with another HTTP status: `httpStatus`, when
        /// the transport could learn it (401 for a token it does not accept, 503 while shutting down).
        case upgradeRefused
        /// No connection within the connect timeout.
        case timeout
        /// Anything else: the connection reset, no access token to be had, …
        case other
    }

    public var code: Code
    public var httpStatus: Int?
    /// What happened, in words for a log or a person: "connection refused".
    public var message: String

    public init(_ code: Code, httpStatus: Int? = nil, message: String) {
        self.code = code
        self.httpStatus = httpStatus
        self.message = message
    }

    /// Whether trying again in a moment cannot help: nothing listens, the name does not resolve,
    /// TLS fails, or the upgrade was answered 4xx. Timeouts, 5xx (503 while the server shuts down)
    /// and whatever is not classified may pass.
    public var isLasting: Bool {
        switch code {
        case .refused, .nameNotFound, .tls: true
        case .upgradeRefused: httpStatus.map { (400..<500).contains($0) } ?? false
        case .timeout, .other: false
        }
    }

    public var description: String { message }
}
