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
}
