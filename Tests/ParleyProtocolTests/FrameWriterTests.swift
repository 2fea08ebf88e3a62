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
        // An ack with another result is left to the encoder.
        #expect(FrameWriter.encode(ServerFrame(seq: 1, message: .ack(Ack(re: "r", result: .roomLeave(RoomLeaveResult(revocationPending: true)))))) == nil)
    }

    @Test func inviteAcksAreWhatTheEncoderWrites() throws {
        for id in Self.awkward {
            for (devices, pushed, expiresAt) in [(0, 0, Int64(0)), (3, 1, 1_733_000_045_000), (Int.max, Int.max, Int64.max)] {
                for seq in [nil, 5] as [Int?] {
                    let frame = ServerFrame(seq: seq, message: .ack(Ack(re: id, result: .callInvite(
                        CallInviteResult(call: .random(), devices: devices, pushed: pushed, expiresAt: expiresAt)))))
                    let written = try #require(FrameWriter.encode(frame))
                    #expect(Array(written.utf8) == Self.foundation(frame), "\(written)")
                }
            }
        }
    }

    @Test func callsComingInAreWhatTheEncoderWrites() throws {
        let parties = [Party(user: "alice", device: "a1"), Party(user: "bob", device: "b-2", name: "Bob \"the\" Builder"),
                       Party(user: "carol", device: "c", name: "é/日本", address: "192.0.2.7"), Party(user: "dan", device: "d", address: "[2001:db8::1]:5")]
            + Self.awkward.map { Party(user: "erin", device: "e", name: $0, address: $0) }
        for from in parties {
            for media in [MediaSpec(audio: true, video: false), MediaSpec(audio: true, video: true), MediaSpec(audio: false, video: false)] {
                for seq in [nil, 9] as [Int?] {
                    let frame = ServerFrame(seq: seq, message: .callIncoming(CallIncoming(call: .random(), from: from, media: media,
                                                                                          expiresAt: 1_733_000_045_000)))
                    let written = try #require(FrameWriter.encode(frame))
                    #expect(Array(written.utf8) == Self.foundation(frame), "\(written)")
                    #expect(try WireCodec().decodeServerFrame(written) == frame, "and it reads back as the frame")
                }
            }
        }
        // Metadata, any JSON, is the encoder's.
        #expect(FrameWriter.encode(ServerFrame(seq: 1, message: .callIncoming(CallIncoming(
            call: .random(), from: parties[0], media: MediaSpec(), metadata: .object(["topic": .string("x")]), expiresAt: 1)))) == nil)
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

    /// `call.ringing`, `call.accepted` and `call.ended` on every optional field, present and absent,
    /// every reason, and durations JSONEncoder writes in every form it has (whole, fraction,
    /// exponent, negative zero, the extremes).
    @Test func aCallsNewsIsWhatTheEncoderWrites() throws {
        let call = CallID.random()
        let devices: [DeviceID] = ["b1", "a.b_c:d@e-f", DeviceID(rawValue: String(repeating: "Z9", count: 64))!]
        var frames: [ServerMessage] = []
        for device in devices {
            frames.append(.callAccepted(CallAccepted(call: call, device: device)))
            for early in [nil, true, false] as [Bool?] {
                frames.append(.callRinging(CallRinging(call: call, device: device, early: early)))
                frames.append(.callRinging(CallRinging(call: call, device: nil, early: early)))
            }
        }
        let reasons: [EndReason] = [.hangup, .cancelled, .declined, .busy, .answeredElsewhere, .declinedElsewhere, .noAnswer,
                                    .connectionLost, .serverShutdown, .serverLostCall, EndReason(rawValue: "a \"new\" one/é")]
        let durations: [Double?] = [nil, 0, -0.0, 1, 12.5, 0.1, 1.0 / 3, 59.999_999_999, 1e-7, 123_456_789.25, 1e16, 2e22,
                                    Double.leastNonzeroMagnitude, Double.greatestFiniteMagnitude, -4.75]
        for reason in reasons {
            for (index, duration) in durations.enumerated() {
                let detail = index.isMultiple(of: 3) ? nil : Self.awkward[index % Self.awkward.count]
                frames.append(.callEnded(CallEnded(call: call, reason: reason, detail: detail, endedAt: [0, 1_733_000_000_123, Int64.max][index % 3],
                                                   duration: duration)))
            }
        }
        for message in frames {
            for seq in [nil, 0, 41] as [Int?] {
                let frame = ServerFrame(seq: seq, message: message)
                let written = try #require(FrameWriter.encode(frame), "\(message.type) is written by hand")
                #expect(Array(written.utf8) == Self.foundation(frame), "\(written)")
                #expect(try WireCodec().decodeServerFrame(written) == frame, "and it reads back as the frame")
            }
        }
        // What JSON cannot say is the encoder's to refuse.
        #expect(FrameWriter.encode(ServerFrame(seq: 1, message: .callEnded(CallEnded(call: call, reason: .hangup, endedAt: 1, duration: .nan)))) == nil)
    }

    /// The fields of every type `FrameWriter` writes, as it writes them. A field added to one of
    /// them fails here until the writer writes it too (an optional one would otherwise be dropped,
    /// and the comparisons above, on values made without it, would not see it).
    @Test func theWriterKnowsEveryField() {
        func fields(_ value: Any) -> [String] { Mirror(reflecting: value).children.compactMap(\.label) }
        let call = CallID.random()
        #expect(fields(Ack(re: "r")) == ["re", "result"])
        #expect(fields(CallInviteResult(call: call, devices: 1, pushed: 0, expiresAt: 1)) == ["call", "devices", "pushed", "expiresAt"])
        #expect(fields(CallIncoming(call: call, from: Party(user: "a", device: "b"), media: MediaSpec(), expiresAt: 1))
                == ["call", "from", "media", "metadata", "expiresAt"])
        #expect(fields(Party(user: "a", device: "b")) == ["user", "device", "name", "address"])
        #expect(fields(MediaSpec()) == ["audio", "video"])
        #expect(fields(CallRinging(call: call)) == ["call", "device", "early"])
        #expect(fields(CallAccepted(call: call, device: "b")) == ["call", "device"])
        #expect(fields(CallEnded(call: call, reason: .hangup, endedAt: 1)) == ["call", "reason", "detail", "endedAt", "duration"])
        #expect(fields(CallSignalled(call: call, from: Party(user: "a", device: "b"), signal: SignalPayload())) == ["call", "from", "signal"])
        #expect(fields(SignalPayload()) == ["description", "candidate", "restartIce"])
        #expect(fields(SessionDescription(type: "offer", sdp: "")) == ["type", "sdp"])
        #expect(fields(IceCandidate(candidate: "c")) == ["candidate", "sdpMid", "sdpMLineIndex", "usernameFragment"])
        #expect(fields(ServerFrame(seq: 1, message: .ack(Ack(re: "r")))) == ["seq", "message"])
    }

    @Test func otherFramesAreLeftToTheEncoder() {
        #expect(FrameWriter.encode(ServerFrame(seq: 3, message: .error(ErrorMessage(re: "r", code: .badRequest, message: "no")))) == nil)
    }
}
