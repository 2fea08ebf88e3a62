import Foundation
import HTTPTypes
import Logging
import NIOCore
import NIOPosix
import NIOWebSocket
import ParleyKit
import WSClient

/// The SDK's signaling transport on Linux (and macOS without Apple frameworks): a WebSocket from
/// swift-websocket on SwiftNIO, offering the `parley.v1` subprotocol.
public struct WebSocketSignalingTransport: SignalingTransport {
    public var maxFrameSize: Int
    private let eventLoopGroup: any EventLoopGroup
    private let logger: Logger

    public init(maxFrameSize: Int = 64 * 1024, eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                logger: Logger = Logger(label: "parley.websocket", factory: { _ in SwiftLogNoOpLogHandler() })) {
        self.maxFrameSize = maxFrameSize
        self.eventLoopGroup = eventLoopGroup
        self.logger = logger
    }

    public func connect(to url: URL, token: String) async throws -> any SignalingConnection {
        var headers = HTTPFields()
        headers[.authorization] = "Bearer \(token)"
        headers[.secWebSocketProtocol] = "parley.v1"
        let configuration = WebSocketClientConfiguration(maxFrameSize: maxFrameSize, additionalHeaders: headers)
        let (outbound, outboundSink) = AsyncStream<Outbound>.makeStream()
        let (events, eventSink) = AsyncStream<TransportEvent>.makeStream()
        let (ready, readySink) = AsyncStream<(any Error)?>.makeStream()
        let maxFrameSize = self.maxFrameSize
        let client = WebSocketClient(url: url.absoluteString, configuration: configuration, eventLoopGroup: eventLoopGroup,
                                     logger: logger) { inbound, writer, _ in
            readySink.yield(nil)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await item in outbound {
                        switch item {
                        case .text(let text): try await writer.write(.text(text))
                        case .close:
                            try await writer.close(.normalClosure, reason: nil)
                            return
                        }
                    }
                }
                for try await message in inbound.messages(maxSize: maxFrameSize) {
                    if case .text(let text) = message { eventSink.yield(.text(text)) }
                }
                group.cancelAll()
            }
        }
        let task = Task {
            var code: UInt16?
            do {
                if let close = try await client.run() { code = UInt16(closeCode: close.closeCode) }
            } catch {
                readySink.yield(error)
            }
            eventSink.yield(.closed(code: code))
            eventSink.finish()
            readySink.finish()
            outboundSink.finish()
        }
        var iterator = ready.makeAsyncIterator()
        // Cancelled while connecting (a connect timeout): drop the attempt.
        let outcome = await withTaskCancellationHandler { await iterator.next() } onCancel: { task.cancel() }
        switch outcome {
        case .some(nil):
            return Connection(events: events, outbound: outboundSink, task: task)
        case .some(.some(let error)):
            throw error
        case .none:
            throw WebSocketClientError.webSocketUpgradeFailed
        }
    }

    enum Outbound: Sendable {
        case text(String)
        case close
    }

    final class Connection: SignalingConnection {
        let events: AsyncStream<TransportEvent>
        private let outbound: AsyncStream<Outbound>.Continuation
        private let task: Task<Void, Never>

        init(events: AsyncStream<TransportEvent>, outbound: AsyncStream<Outbound>.Continuation, task: Task<Void, Never>) {
            self.events = events
            self.outbound = outbound
            self.task = task
        }

        func send(_ text: String) { outbound.yield(.text(text)) }

        func close() {
            outbound.yield(.close)
            outbound.finish()
        }
    }
}

extension UInt16 {
    init(closeCode: WebSocketErrorCode) {
        var buffer = ByteBuffer()
        buffer.write(webSocketErrorCode: closeCode)
        self = buffer.readInteger(as: UInt16.self) ?? 1005
    }
}
