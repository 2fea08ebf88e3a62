import Foundation
@testable import ParleyProtocol
import Testing

/// The client frames read by hand against `JSONDecoder`: the same value or the same error on every
/// frame, and read by hand (not left to `JSONDecoder`) on the frames clients write.
@Suite struct FrameReaderTests {
    let codec = WireCodec()

    /// Both readings of the bytes, as results.
    func readings(_ text: String) -> (byHand: Result<ClientMessage, ProtocolError>, byFoundation: Result<ClientMessage, ProtocolError>) {
        let data = Data(text.utf8)
        return (Result { () throws(ProtocolError) in try codec.decodeClientMessage(text) },
                Result { () throws(ProtocolError) in try codec.decodeClientMessage(data, byHand: false) })
    }

    func byHand(_ text: String) -> ClientMessage? {
        text.utf8.withContiguousStorageIfAvailable(FrameReader.read) ?? nil
    }

    static let call = CallID("6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21")

    /// The hot frames as clients write them, with every optional field in and out.
    static var written: [ClientMessage] {
        var messages: [ClientMessage] = [.ack(SeqAck(seq: 0)), .ack(SeqAck(seq: Int.max)), .ping(Ping(id: "p"))]
        for text in FrameWriterTests.awkward where !text.isEmpty {
            let id = String(text.prefix(WireCodec.maxRequestIDLength))
            messages += [
                .callRinging(CallRingingRequest(id: id, call: call)),
                .callRinging(CallRingingRequest(id: id, call: call, early: true)),
                .callRinging(CallRingingRequest(id: id, call: call, early: false)),
                .callAccept(CallRequest(id: id, call: call)),
                .callHangup(CallHangup(id: "h", call: call)),
                .callHangup(CallHangup(id: "h", call: call, reason: text)),
                .callSignal(CallSignal(id: "s", call: call, signal: SignalPayload(restartIce: true))),
                .callSignal(CallSignal(id: "s", call: call, signal: SignalPayload(candidate: .endOfCandidates), device: "b-1:x")),
                .callSignal(CallSignal(id: "s", call: call, signal: SignalPayload(description: SessionDescription(type: "offer", sdp: text)))),
                .callSignal(CallSignal(id: id, call: call, signal: SignalPayload(
                    description: SessionDescription(type: text, sdp: "v=0\r\n" + text),
                    candidate: .candidate(IceCandidate(candidate: text, sdpMid: text, sdpMLineIndex: 0, usernameFragment: text)),
                    restartIce: true))),
                .callSignal(CallSignal(id: "s", call: call, signal: SignalPayload(candidate: .candidate(IceCandidate(candidate: text))))),
            ]
        }
        return messages
    }

    @Test func theFramesClientsWriteAreReadByHandAsTheDecoderReadsThem() throws {
        for message in Self.written {
            let text = String(decoding: codec.encode(message), as: UTF8.self)
            #expect(byHand(text) == message, "read by hand: \(text)")
            let (hand, foundation) = readings(text)
            #expect(hand == foundation)
            #expect(hand == .success(message))
        }
    }

    @Test func whatJSONAllowsIsReadAsTheDecoderReadsIt() {
        let call = Self.call.rawValue
        let upper = call.uppercased()
        let frames: [(text: String, byHand: Bool)] = [
            // Whitespace, key order, escapes everywhere, nulls for absent fields, an uppercase id.
            (" \r\n\t{ \"call\" : \"\(upper)\" , \"id\":\"a\\u0062\\/\\\"\\\\\\b\\f\\n\\r\\t\", \"type\":\"call.accept\" }\n ", true),
            (#"{"\u0074ype":"ping","id":"\ud83d\ude00 \u00e9 \u0000 \u2028"}"#, true),
            (#"{"type":"call.signal","id":"s","call":"\#(call)","device":null,"restartIce":null,"description":null,"candidate":null}"#, true),
            (#"{"type":"call.signal","id":"s","call":"\#(call)","candidate":{"candidate":"c","sdpMid":null,"sdpMLineIndex":-0,"usernameFragment":null}}"#, true),
            (#"{"type":"call.signal","id":"s","call":"\#(call)","candidate":{"candidate":"c","sdpMLineIndex":-12}}"#, true),
            (#"{"type":"call.ringing","id":"r","call":"\#(call)","early":null}"#, true),
            (#"{"type":"ack","seq":9223372036854775807}"#, true),
            (#"{"type":"ack","seq":-1}"#, true),
            (#"{"type":"call.hangup","id":"h","call":"\#(call)","reason":"é 日本 😀"}"#, true),
            // Left to the decoder: fields it does not know, a key twice, other numbers and types.
            (#"{"type":"ping","id":"p","extra":[1,2]}"#, false),
            (#"{"type":"ping","id":"p","id":"q"}"#, false),
            (#"{"type":"ack","seq":1.0}"#, false),
            (#"{"type":"ack","seq":1e2}"#, false),
            (#"{"type":"ack","seq":01}"#, false),
            (#"{"type":"ack","seq":9223372036854775808}"#, false),
            (#"{"type":"ack","seq":"1"}"#, false),
            (#"{"type":"call.signal","id":"s","call":"\#(call)","candidate":{"candidate":"c","sdpMLineIndex":1.5}}"#, false),
            (#"{"type":"call.signal","id":"s","call":"\#(call)","description":{"type":"offer"}}"#, false),
            (#"{"type":"call.signal","id":"s","call":"\#(call)","description":{"type":"offer","sdp":"v","x":1}}"#, false),
            (#"{"type":"call.signal","id":"s","call":"\#(call)","candidate":{"candidate":{"deeper":{}}}}"#, false),
            (#"{"type":"call.signal","id":"s","call":"\#(call)","device":"no spaces"}"#, false),
            (#"{"type":"call.signal","id":"s","call":"not-a-uuid","restartIce":true}"#, false),
            (#"{"type":"call.ringing","id":"r","call":"\#(call)","early":"yes"}"#, false),
            (#"{"type":"hello","id":"h","device":"d"}"#, false),
            // Mistakes: the decoder's error, as before.
            (#"{"type":"ping","id":"\ud83d"}"#, false),
            (#"{"type":"ping","id":"\udc00x"}"#, false),
            (#"{"type":"ping","id":"\x"}"#, false),
            ("{\"type\":\"ping\",\"id\":\"tab\there\"}", false),
            (#"{"type":"ping","id":"p"} x"#, false),
            (#"{"type":"ping","id":"p",}"#, false),
            (#"{"type":"ping","id":"p""#, false),
            (#"{"type":"ping"}"#, false),
            (#"{"type":"ping","id":""}"#, true),
            (#"{"type":"call.signal","id":"s","call":"\#(call)"}"#, true),
            (#"[{"type":"ping","id":"p"}]"#, false),
            (#"{"type":7}"#, false),
            ("", false),
        ]
        for frame in frames {
            #expect((byHand(frame.text) != nil) == frame.byHand, "read by hand or not: \(frame.text)")
            let (hand, foundation) = readings(frame.text)
            #expect(hand == foundation, "\(frame.text)")
        }
    }

    @Test func bytesThatAreNotUTF8AreTheDecodersToRefuse() {
        let prefix = Array(#"{"type":"ping","id":""#.utf8), suffix = Array(#""}"#.utf8)
        for bad: [UInt8] in [[0xFF], [0xC3], [0xE0, 0x80, 0x80], [0xED, 0xA0, 0x80], [0x5C, 0x6E, 0xFF]] {
            let data = Data(prefix + bad + suffix)
            #expect(data.withUnsafeBytes { FrameReader.read($0.assumingMemoryBound(to: UInt8.self)) } == nil)
            let hand = Result { () throws(ProtocolError) in try codec.decodeClientMessage(data) }
            let foundation = Result { () throws(ProtocolError) in try codec.decodeClientMessage(data, byHand: false) }
            #expect(hand == foundation)
        }
    }
}
