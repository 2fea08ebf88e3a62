// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyJanus

/// The Janus WebSocket API (subprotocol `janus-protocol`) over `URLSessionWebSocketTask`: how a voice
/// room reaches Janus on an iPhone. URLSession brings up cellular and VPN On Demand where SwiftNIO's
/// BSD sockets do not (TN3151), as it does for signaling.
///
/// (On Linux this compiles but cannot connect: the toolchain's libcurl has no WebSocket support. The
/// framing is tested through `WebSocketTask`.)
public final class URLSessionJanusTransport: JanusTransport, Sendable {
    public let incoming: AsyncStream<String>
    private let sink: AsyncStream<String>.Continuation
    private let task: any WebSocketTask
    /// Reads every frame in order until the connection closes; `close()` ends it and waits for it.
    private let reader: Task<Void, Never>

    /// Connects to Janus at `url` (`ws://` or `wss://`); throws when it cannot be reached or refuses
    /// the upgrade.
    public static func connect(to url: String) async throws -> URLSessionJanusTransport {
        guard let address = URL(string: url) else { throw URLError(.badURL) }
        var request = URLRequest(url: address)
        request.setValue("janus-protocol", forHTTPHeaderField: "Sec-WebSocket-Protocol")
        request.timeoutInterval = 10
        let sockets = URLSessionWebSockets()
        defer { sockets.invalidate() }  // the session ends once its one task does
        return URLSessionJanusTransport(task: try await sockets.open(request))
    }

    public init(task: any WebSocketTask) {
        self.task = task
        (incoming, sink) = AsyncStream.makeStream()
        let sink = self.sink
        // Every frame in order, until the connection closes (Janus speaks text only). The loop ends
        // with the WebSocket task: `close()` cancels it, and a cancelled task's receive fails.
        reader = Task {
            while let message = try? await task.receive() {
                if case .string(let text) = message { sink.yield(text) }
            }
            sink.finish()
        }
    }

    public func send(_ text: String) async throws {
        do {
            try await task.send(.string(text))
        } catch {
            throw JanusError.disconnected
        }
    }

    public func close() async {
        task.cancel(with: .normalClosure, reason: nil)
        await reader.value
    }
}
#endif
