import Foundation
import HTTPTypes
import Logging
import NIOCore
import NIOWebSocket
import ParleyProtocol
import WSClient
import ParleyServerTesting

/// A real WebSocket client for tests: sends raw text, binary or protocol messages, and reads
/// what the server sends, with timeouts; reports the close code the server sent.
final class WSTestClient: @unchecked Sendable {
    enum Command: Sendable {
        case text(String)
        case binary([UInt8])
        case close
    }

    private let lock = NSLock()
    private var inbox: [String] = []
    private var ended = false
    private var closeFrame: WebSocketCloseFrame?
    private var requests = 0
    private var lastSeq = 0
    private var signalsSeen: Set<CallSignalled> = []
    private let commands: AsyncStream<Command>.Continuation
    private let task: Task<Void, Never>
    let codec = WireCodec()
    private(set) var welcome: Welcome?

    private init(commands: AsyncStream<Command>.Continuation, task: Task<Void, Never>) {
        self.commands = commands
        self.task = task
    }

    /// Connects with `token` in the Authorization header (or the query for browsers), and returns
    /// once the upgrade succeeded; throws when it is refused.
    static func connect(url: String, token: String?, inQuery: Bool = false, subprotocol: String? = nil,
                        maxFrameSize: Int = 1 << 20, webSocketPings: Duration? = nil) async throws -> WSTestClient {
        var headers = HTTPFields()
        var url = url
        if let token {
            if inQuery { url += "?access_token=\(token)" } else { headers[.authorization] = "Bearer \(token)" }
        }
        if let subprotocol { headers[.secWebSocketProtocol] = subprotocol }
        let configuration = WebSocketClientConfiguration(maxFrameSize: maxFrameSize, additionalHeaders: headers,
                                                         autoPing: webSocketPings.map { .enabled(timePeriod: $0) } ?? .disabled)
        let (commandStream, commands) = AsyncStream<Command>.makeStream()
        let (ready, readyContinuation) = AsyncStream<Result<String?, any Error>>.makeStream()
        let box = ClientBox()
        let task = Task {
            do {
                let close = try await WebSocketClient.connect(url: url, configuration: configuration, logger: Logger(label: "test.ws")) { inbound, outbound, context in
                    readyContinuation.yield(.success(nil))
                    await withTaskGroup(of: Void.self) { group in
                        group.addTask {
                            for await command in commandStream {
                                switch command {
                                case .text(let text): try? await outbound.write(.text(text))
                                case .binary(let bytes): try? await outbound.write(.binary(ByteBuffer(bytes: bytes)))
                                case .close:
                                    try? await outbound.close(.normalClosure, reason: nil)
                                    return
                                }
                            }
                        }
                        do {
                            for try await message in inbound.messages(maxSize: 1 << 22) {
                                if case .text(let text) = message { box.client?.append(text) }
                            }
                        } catch {}
                        group.cancelAll()
                    }
                }
                box.client?.finish(close)
            } catch {
                readyContinuation.yield(.failure(error))
                box.client?.finish(nil)
            }
            readyContinuation.finish()
        }
        let client = WSTestClient(commands: commands, task: task)
        box.client = client
        var iterator = ready.makeAsyncIterator()
        switch await iterator.next() {
        case .success?: return client
        case .failure(let error)?: throw error
        case nil: throw TestFailure("the connection ended before it was ready")
        }
    }

    private final class ClientBox: @unchecked Sendable {
        weak var client: WSTestClient?
    }

    private func append(_ text: String) { lock.withLock { inbox.append(text) } }

    private func finish(_ close: WebSocketCloseFrame?) {
        lock.withLock {
            ended = true
            closeFrame = close
        }
    }

    // MARK: Sending

    func sendRaw(_ text: String) { commands.yield(.text(text)) }
    func sendBinary(_ bytes: [UInt8]) { commands.yield(.binary(bytes)) }
    func send(_ message: ClientMessage) { sendRaw(String(decoding: codec.encode(message), as: UTF8.self)) }

    func close() async {
        commands.yield(.close)
        _ = await task.value
    }

    func nextID() -> String {
        lock.withLock {
            requests += 1
            return "q\(requests)"
        }
    }

    // MARK: Receiving

    /// The next frame the server sent, or nil if none came within `timeout`.
    func next(timeout: Duration = .seconds(5)) async throws -> ServerFrame? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let text: String? = lock.withLock { inbox.isEmpty ? nil : inbox.removeFirst() }
            if let text {
                let frame = try codec.decodeServerFrame(text)
                try lock.withLock { try checkDeliveredOnce(frame) }
                return frame
            }
            if lock.withLock({ ended && inbox.isEmpty }) { return nil }
            try await Task.sleep(for: .milliseconds(2))
        }
        return nil
    }

    /// Every frame comes once on a connection: its `seq` is above the last one's, and a relayed
    /// call signal (whose description or candidate is unique) is not relayed again. A frame again
    /// is a duplicate delivery, as a fault between nodes would make: `expect`, which reads past the
    /// frames it is not waiting for, would otherwise never show it.
    /// (Called under the lock.)
    private func checkDeliveredOnce(_ frame: ServerFrame) throws {
        if let seq = frame.seq {
            guard seq > lastSeq else { throw TestFailure("frame \(seq) (\(frame.message.type)) came after frame \(lastSeq): delivered again") }
            lastSeq = seq
        }
        if case .callSignal(let signal) = frame.message {
            guard signalsSeen.insert(signal).inserted else { throw TestFailure("the same call.signal came twice: \(signal)") }
        }
    }

    /// Reads frames until one matches; the others are dropped (each checked to come only once).
    func expect<T>(timeout: Duration = .seconds(5), line: Int = #line, _ match: (ServerFrame) -> T?) async throws -> T {
        let deadline = ContinuousClock.now + timeout
        var skipped: [String] = []
        while let frame = try await next(timeout: deadline - ContinuousClock.now) {
            if let value = match(frame) { return value }
            skipped.append(frame.message.type)
        }
        throw TestFailure("the expected frame did not come (line \(line); skipped \(skipped); closed: \(isClosed))")
    }

    /// Sends a request and waits for its answer.
    func request(line: Int = #line, _ make: (String) -> ClientMessage) async throws -> Result<Ack, ErrorMessage> {
        let id = nextID()
        send(make(id))
        return try await answer(to: id, line: line)
    }

    func answer(to id: String, line: Int = #line) async throws -> Result<Ack, ErrorMessage> {
        try await expect(line: line) { frame in
            switch frame.message {
            case .ack(let ack) where ack.re == id: .success(ack)
            case .error(let error) where error.re == id: .failure(error)
            default: nil
            }
        }
    }

    func hello(device: DeviceID, resume: ResumeRequest? = nil) async throws -> Welcome {
        send(.hello(Hello(id: "hello", device: device, client: ClientInfo(name: "parley-tests", version: "0", platform: .linux),
                          resume: resume)))
        let welcome = try await expect { frame -> Welcome? in
            if case .welcome(let welcome) = frame.message { return welcome }
            return nil
        }
        self.welcome = welcome
        return welcome
    }

    /// Waits for the connection to end; answers the close code the server sent.
    func closeCode(timeout: Duration = .seconds(10)) async -> UInt16? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let result: UInt16? = lock.withLock({ ended ? closeFrame.map { UInt16(webSocketErrorCode: $0.closeCode) } : nil }) {
                return result
            }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return nil
    }

    var isClosed: Bool { lock.withLock { ended } }
}

extension UInt16 {
    init(webSocketErrorCode code: WebSocketErrorCode) {
        var buffer = ByteBuffer()
        buffer.write(webSocketErrorCode: code)
        self = buffer.readInteger(as: UInt16.self) ?? 0
    }
}

extension LiveServer {
    /// Connects a device over a real WebSocket and completes hello.
    func device(_ user: UserID, _ device: DeviceID, name: String? = nil) async throws -> WSTestClient {
        let client = try await WSTestClient.connect(url: signalURL, token: token(user, name: name))
        _ = try await client.hello(device: device)
        return client
    }
}
