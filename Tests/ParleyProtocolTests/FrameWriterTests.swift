import Foundation
@testable import ParleyProtocol
import Testing

/// The relay's hand-written frames against `JSONEncoder`: byte for byte the same, on values that
/// exercise every branch and every character JSON must escape.
@Suite struct FrameWriterTests {
    /// What the codec writes every other frame with, its own `JSONEncoder`, as bytes (a `String`'s
    /// `==` would call canonically equivalent texts equal).
    static func foundation(_ frame: ServerFrame) -> [UInt8] {
        Array(try! WireCodec.encoder.encode(frame))
    }

    /// Strings with everything JSON escapes, and what it leaves alone.
    static let awkward: [String] = {
        var controls = ""
        for value in 0..<0x20 { controls.unicodeScalars.append(Unicode.Scalar(UInt8(value))) }
        return ["", "a1", "req-42", controls, "e\u{301} (decomposed) and \u{E9}", #"quote " and backslash \ and slash /"#, "é, 日本, 😀, \u{7F}, \u{2028}",
                "candidate:1 1 udp 2122260223 192.0.2.1 50000 typ host generation 0"]
    }()

    @Test func acksAreWhatTheEncoderWrites() {
        for id in Self.awkward + ["x"] {
            for seq in [nil, 0, 7, Int.max] as [Int?] {
                let frame = ServerFrame(seq: seq, message: .ack(Ack(re: id)))
                #expect(FrameWriter.encode(frame).map { Array($0.utf8) } == Self.foundation(frame),
                        "re \(id.debugDescription), seq \(String(describing: seq))")
            }
        }
        // An ack with a result is left to the encoder.
        #expect(FrameWriter.encode(ServerFrame(seq: 1, message: .ack(Ack(re: "r", result: .roomLeave(RoomLeaveResult(revocationPending: true)))))) == nil)
    }

    @Test func relayedSignalsAreWhatTheEncoderWrites() throws {
        let call = CallID.random()
        var payloads: [SignalPayload] = [
            SignalPayload(restartIce: true),
            SignalPayload(candidate: .endOfCandidates),
            SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\n")),
        ]
        for text in Self.awkward {
            payloads.append(SignalPayload(candidate: .candidate(IceCandidate(candidate: text))))
            payloads.append(SignalPayload(description: SessionDescription(type: text, sdp: text),
                                          candidate: .candidate(IceCandidate(candidate: text, sdpMid: text, sdpMLineIndex: 3, usernameFragment: text)),
                                          restartIce: true))
            payloads.append(SignalPayload(description: SessionDescription(type: "answer", sdp: text), candidate: .endOfCandidates))
        }
        let parties = [Party(user: "alice", device: "a1"), Party(user: "bob", device: "b-2", name: "Bob \"the\" Builder"),
                       Party(user: "carol", device: "c", name: "é/日本", address: "192.0.2.7")]
        for payload in payloads {
            for from in parties {
                for seq in [nil, 12] as [Int?] {
                    let frame = ServerFrame(seq: seq, message: .callSignal(CallSignalled(call: call, from: from, signal: payload)))
                    let written = try #require(FrameWriter.encode(frame))
                    #expect(Array(written.utf8) == Self.foundation(frame))
                    #expect(try WireCodec().decodeServerFrame(written) == frame, "and it reads back as the frame")
                }
            }
        }
    }

    @Test func otherFramesAreLeftToTheEncoder() {
        #expect(FrameWriter.encode(ServerFrame(seq: 3, message: .error(ErrorMessage(re: "r", code: .badRequest, message: "no")))) == nil)
    }
}
