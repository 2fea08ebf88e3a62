import Foundation
import HTTPTypes
import Logging
import NIOCore
import NIOPosix
import WSClient

/// The Janus WebSocket API (subprotocol `janus-protocol`) on swift-websocket.
public final class JanusWebSocketTransport: JanusTransport {
    public let incoming: AsyncStream<String>
    private let outbound: AsyncStream<String?>.Continuation
    private let task: Task<Void, Never>

    /// Connects; throws when Janus cannot be reached or refuses the upgrade.
    public static func connect(to url: String, maxFrameSize: Int = 1 << 20,
                               eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                               logger: Logger = Logger(label: "parley.janus", factory: { _ in SwiftLogNoOpLogHandler() })) async throws -> JanusWebSocketTransport {
        var headers = HTTPFields()
        headers[.secWebSocketProtocol] = "janus-protocol"
        let configuration = WebSocketClientConfiguration(maxFrameSize: maxFrameSize, additionalHeaders: headers)
        let (outbound, outboundSink) = AsyncStream<String?>.makeStream()
        let (incoming, incomingSink) = AsyncStream<String>.makeStream()
        let (ready, readySink) = AsyncStream<(any Error)?>.makeStream()
        let client = WebSocketClient(url: url, configuration: configuration, eventLoopGroup: eventLoopGroup, logger: logger) { inbound, writer, _ in
            readySink.yield(nil)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await text in outbound {
                        guard let text else {
                            try await writer.close(.normalClosure, reason: nil)
                            return
                        }
                        try await writer.write(.text(text))
                    }
                }
                for try await message in inbound.messages(maxSize: maxFrameSize) {
                    if case .text(let text) = message { incomingSink.yield(text) }
                }
                group.cancelAll()
            }
        }
        let task = Task {
            do { _ = try await client.run() } catch { readySink.yield(error) }
            incomingSink.finish()
            readySink.finish()
            outboundSink.finish()
        }
        var iterator = ready.makeAsyncIterator()
        switch await withTaskCancellationHandler(operation: { await iterator.next() }, onCancel: { task.cancel() }) {
        case .some(nil):
            return JanusWebSocketTransport(incoming: incoming, outbound: outboundSink, task: task)
        case .some(.some(let error)):
            throw error
        case .none:
            throw JanusError.disconnected
        }
    }

    private init(incoming: AsyncStream<String>, outbound: AsyncStream<String?>.Continuation, task: Task<Void, Never>) {
        self.incoming = incoming
        self.outbound = outbound
        self.task = task
    }

    public func send(_ text: String) async throws {
        if case .terminated = outbound.yield(text) { throw JanusError.disconnected }
    }

    public func close() async {
        outbound.yield(nil)
        outbound.finish()
        await task.value
    }
}
