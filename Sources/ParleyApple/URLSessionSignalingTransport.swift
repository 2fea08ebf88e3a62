// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyKit

/// The SDK's `SignalingTransport` over `URLSessionWebSocketTask`: the token in the upgrade's
/// `Authorization` header, text frames in order, a receive re-armed after every message, and the
/// server's close code reported as the NIO transport reports it (nil when the connection just died).
///
/// (On Linux this compiles but cannot connect: the toolchain's libcurl has no WebSocket support. The
/// framing and close codes are tested through `WebSocketTask`, the seam below.)
public final class URLSessionSignalingTransport: SignalingTransport, Sendable {
    private let sockets = URLSessionWebSockets()

    public init() {}

    /// Why a connection could not be opened; `status` is the upgrade's HTTP status if one came
    /// (401: the token; 403: the origin; 503: the server is shutting down).
    public struct Refused: Error, CustomStringConvertible {
        public var status: Int?
        public var underlying: String
        public var description: String { status.map { "the server refused the connection (HTTP \($0))" } ?? underlying }
    }

    /// Lets the session go (it keeps its delegate until then).
    public func invalidate() {
        sockets.invalidate()
    }

    public func connect(to url: URL, token: String) async throws -> any SignalingConnection {
        var request = URLRequest(url: url)
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        request.timeoutInterval = 10
        return URLSessionSignalingConnection(task: try await sockets.open(request))
    }
}

/// WebSocket tasks of one `URLSession`, each handed over once it opened: signaling's and Janus's
/// (on an iPhone both go through URLSession, which brings up cellular and VPN On Demand as BSD
/// sockets do not, TN3151).
final class URLSessionWebSockets: NSObject, URLSessionWebSocketDelegate, @unchecked Sendable {
    private let lock = NSLock()
    private var session: URLSession!
    private var opening: [Int: CheckedContinuation<Void, any Error>] = [:]

    override init() {
        super.init()
        session = URLSession(configuration: .default, delegate: self, delegateQueue: nil)
    }

    func invalidate() {
        session.finishTasksAndInvalidate()
    }

    /// Starts a WebSocket task for `request` and answers it once the upgrade succeeded; throws
    /// `URLSessionSignalingTransport.Refused` with the HTTP status otherwise.
    func open(_ request: URLRequest) async throws -> URLSessionWebSocketTask {
        let task = session.webSocketTask(with: request)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            lock.withLock { opening[task.taskIdentifier] = continuation }
            task.resume()
        }
        return task
    }

    func urlSession(_ session: URLSession, webSocketTask: URLSessionWebSocketTask, didOpenWithProtocol protocol: String?) {
        lock.withLock { opening.removeValue(forKey: webSocketTask.taskIdentifier) }?.resume()
    }

    func urlSession(_ session: URLSession, webSocketTask: URLSessionWebSocketTask,
                    didCloseWith closeCode: URLSessionWebSocketTask.CloseCode, reason: Data?) {
        // The connection reads the close code when its receive fails; nothing to do here.
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let continuation = lock.withLock({ opening.removeValue(forKey: task.taskIdentifier) }) else { return }
        let status = (task.response as? HTTPURLResponse)?.statusCode
        continuation.resume(throwing: URLSessionSignalingTransport.Refused(
            status: status, underlying: error.map { "\($0)" } ?? "the connection closed before it opened"))
    }
}

/// What the connection needs of `URLSessionWebSocketTask` — a seam, so tests can stand in for it.
public protocol WebSocketTask: AnyObject, Sendable {
    func send(_ message: URLSessionWebSocketTask.Message) async throws
    func receive() async throws -> URLSessionWebSocketTask.Message
    func cancel(with closeCode: URLSessionWebSocketTask.CloseCode, reason: Data?)
    /// The close code the server sent, as a number: the protocol's own codes (4001-4010) are not
    /// cases of `CloseCode`.
    var closeCodeNumber: Int { get }
}

extension URLSessionWebSocketTask: WebSocketTask {
    public var closeCodeNumber: Int { closeCode.rawValue }
}

/// One signaling connection over a WebSocket task.
public final class URLSessionSignalingConnection: SignalingConnection, @unchecked Sendable {
    public let events: AsyncStream<TransportEvent>
    private let sink: AsyncStream<TransportEvent>.Continuation
    private let task: any WebSocketTask
    private let outbox: AsyncStream<String>.Continuation
    private let lock = NSLock()
    private var closed = false
    /// The connection's one task: its body reads until the connection ends (`close()` cancels the
    /// WebSocket task, whose receive then fails), its child writes.
    private let running: Task<Void, Never>

    public init(task: any WebSocketTask) {
        self.task = task
        (events, sink) = AsyncStream.makeStream()
        let (frames, outbox) = AsyncStream<String>.makeStream()
        self.outbox = outbox
        let sink = self.sink
        running = Task { [task] in
            await withDiscardingTaskGroup { group in
                // One writer, so frames leave in the order they were queued.
                group.addTask {
                    for await text in frames {
                        do { try await task.send(.string(text)) } catch { break }
                    }
                }
                let code = await Self.receive(from: task, into: sink)
                outbox.finish()
                sink.yield(.closed(code: code))
                sink.finish()
            }
        }
    }

    public func send(_ text: String) { outbox.yield(text) }

    public func close() {
        guard lock.withLock({ () -> Bool in defer { closed = true }; return !closed }) else { return }
        outbox.finish()
        task.cancel(with: .normalClosure, reason: nil)
    }

    /// Every text frame until the connection ends; answers the server's close code.
    private static func receive(from task: any WebSocketTask, into sink: AsyncStream<TransportEvent>.Continuation) async -> UInt16? {
        while true {
            do {
                // Protocol v1 is text only; binary messages are dropped.
                if case .string(let text) = try await task.receive() { sink.yield(.text(text)) }
            } catch {
                return closeCode(task.closeCodeNumber)
            }
        }
    }

    /// The server's close code; 0 (`invalid`) and 1006 (`abnormalClosure`) mean there was none.
    static func closeCode(_ number: Int) -> UInt16? {
        guard number != 0, number != 1006, let code = UInt16(exactly: number) else { return nil }
        return code
    }
}
#endif
