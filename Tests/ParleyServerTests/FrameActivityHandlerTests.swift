import NIOCore
import NIOEmbedded
import NIOWebSocket
@testable import ParleyServer
import Testing

@Suite("A connection's frames on the wire")
struct FrameActivityHandlerTests {
    /// The hub writes into the channel directly, and swift-websocket may send a close of its own
    /// (answering the client's, or on a protocol error) before the hub hears of it: what the hub
    /// writes after it must not follow it onto the wire (RFC 6455, 5.5.1).
    @Test func nothingFollowsACloseFrame() throws {
        let channel = EmbeddedChannel(handler: FrameActivityHandler(onFrame: {}))
        let before = channel.writeAndFlush(WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(string: "before")))
        let close = channel.writeAndFlush(WebSocketFrame(fin: true, opcode: .connectionClose, data: ByteBuffer()))
        let after = channel.writeAndFlush(WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(string: "after")))
        try before.wait()
        try close.wait()
        #expect(throws: ChannelError.outputClosed) { try after.wait() }
        #expect(try channel.readOutbound(as: WebSocketFrame.self)?.opcode == .text)
        #expect(try channel.readOutbound(as: WebSocketFrame.self)?.opcode == .connectionClose)
        #expect(try channel.readOutbound(as: WebSocketFrame.self) == nil)
    }

    /// Every frame the client sends counts as a heartbeat but pongs, which only answer the server;
    /// all of them go on to the reader.
    @Test func framesTheClientSendsCountAsActivityButPongs() throws {
        final class Count: @unchecked Sendable { var value = 0 }  // the embedded loop is this thread
        let seen = Count()
        let channel = EmbeddedChannel(handler: FrameActivityHandler(onFrame: { seen.value += 1 }))
        for opcode in [WebSocketOpcode.text, .ping, .pong] {
            try channel.writeInbound(WebSocketFrame(fin: true, opcode: opcode, data: ByteBuffer()))
        }
        #expect(seen.value == 2)
        for opcode in [WebSocketOpcode.text, .ping, .pong] {
            #expect(try channel.readInbound(as: WebSocketFrame.self)?.opcode == opcode)
        }
    }

    /// The hub's frames are encoded by Parley itself (`EncodedFrameWriter`), a batch into one
    /// buffer: NIO's own WebSocket decoder must read each back as the final, unmasked text frame
    /// it was, at every length form (7 bits, 16 bits, 64 bits) and either side of each bound, each
    /// length in its shortest form.
    @Test func theHubsFramesReadBackAsTheTextFramesTheyWere() throws {
        let texts = ["", "{}", String(repeating: "a", count: 125), String(repeating: "b", count: 126),
                     "é ☎︎ " + String(repeating: "c", count: 200), String(repeating: "d", count: 65535),
                     String(repeating: "e", count: 65536), String(repeating: "f", count: 70000)]
        let writer = EncodedFrameWriter()
        let channel = EmbeddedChannel(handler: writer)
        writer.write(texts, promise: nil)
        let buffer = try #require(try channel.readOutbound(as: ByteBuffer.self))
        #expect(try channel.readOutbound(as: ByteBuffer.self) == nil)
        // Each length in the fewest bytes that hold it (RFC 6455, 5.2: a longer form is an error).
        #expect(buffer.readableBytes == texts.reduce(0) { sum, text in
            let length = text.utf8.count
            return sum + (length <= 125 ? 2 : length <= 65535 ? 4 : 10) + length
        })

        let reader = EmbeddedChannel(handler: ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: 1 << 20)))
        try reader.writeInbound(buffer)
        for text in texts {
            let frame = try #require(try reader.readInbound(as: WebSocketFrame.self))
            #expect(frame.fin && frame.opcode == .text && frame.maskKey == nil && frame.rsv1 == false)
            #expect(String(buffer: frame.unmaskedData) == text)
        }
        #expect(try reader.readInbound(as: WebSocketFrame.self) == nil)
    }

    /// A close that goes out through the pipeline (swift-websocket's own, or the hub's) shuts the
    /// writer of the hub's frames below it: nothing of the hub's follows it onto the wire.
    @Test func nothingOfTheHubsFollowsACloseThatWentOutAbove() throws {
        let writer = EncodedFrameWriter()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandlers(writer, WebSocketFrameEncoder(), FrameActivityHandler(onFrame: {}, closing: writer))
        let before = channel.eventLoop.makePromise(of: Void.self)
        writer.write(["before"], promise: before)
        try before.futureResult.wait()
        try channel.writeAndFlush(WebSocketFrame(fin: true, opcode: .connectionClose, data: ByteBuffer())).wait()
        let after = channel.eventLoop.makePromise(of: Void.self)
        writer.write(["after"], promise: after)
        #expect(throws: ChannelError.outputClosed) { try after.futureResult.wait() }

        var wire = ByteBuffer()
        while var part = try channel.readOutbound(as: ByteBuffer.self) { wire.writeBuffer(&part) }
        let reader = EmbeddedChannel(handler: ByteToMessageHandler(WebSocketFrameDecoder()))
        try reader.writeInbound(wire)
        #expect(try reader.readInbound(as: WebSocketFrame.self).map { String(buffer: $0.data) } == "before")
        #expect(try reader.readInbound(as: WebSocketFrame.self)?.opcode == .connectionClose)
        #expect(try reader.readInbound(as: WebSocketFrame.self) == nil)
    }
}
