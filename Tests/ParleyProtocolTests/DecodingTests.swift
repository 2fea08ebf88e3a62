import Foundation
@testable import ParleyProtocol
import Testing

@Suite("Decoding client frames")
struct DecodingTests {
    let codec = WireCodec()

    func failure(_ text: String) -> ProtocolError? {
        do {
            _ = try codec.decodeClientMessage(text)
            return nil
        } catch {
            return error
        }
    }

    @Test func malformedFramesGiveTypedErrors() {
        #expect(failure("{not json")?.kind == .invalidJSON)
        #expect(failure("")?.kind == .invalidJSON)
        #expect(failure("[1]")?.kind == .notAnObject)
        #expect(failure("42")?.kind == .notAnObject)
        #expect(failure(#"{"id":"a"}"#) == ProtocolError(kind: .missingType, requestID: "a", message: "the frame has no 'type'"))
        #expect(failure(#"{"type":7,"id":"a"}"#)?.kind == .missingType)
        let unknown = failure(#"{"type":"call.teleport","id":"a"}"#)
        #expect(unknown?.kind == .unknownType)
        #expect(unknown?.errorCode == .unsupported)
        #expect(unknown?.requestID == "a")
    }

    @Test func invalidFieldsNameTheField() throws {
        let missing = failure(#"{"type":"call.invite","id":"i","call":"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21","media":{"audio":true,"video":false}}"#)
        #expect(missing?.kind == .invalidField)
        #expect(missing?.message == "missing field 'to'")
        #expect(missing?.requestID == "i")
        #expect(missing?.errorCode == .badRequest)
        let badCall = failure(#"{"type":"call.accept","id":"i","call":"nope"}"#)
        #expect(badCall?.message.contains("'call'") == true)
        #expect(failure(#"{"type":"call.accept","id":"i","call":42}"#)?.message == "field 'call' has the wrong type")
        #expect(failure(#"{"type":"hello","id":"h","device":"has spaces"}"#)?.kind == .invalidField)
        #expect(failure(#"{"type":"ping","id":""}"#)?.kind == .invalidField)
        let overLong = try #require(failure(#"{"type":"ping","id":"\#(String(repeating: "x", count: 65))"}"#), "an id over 64 characters is refused")
        #expect(overLong.kind == .invalidField && overLong.requestID == nil, "and not echoed")
        #expect(failure(#"{"type":"call.decline","id":"d","call":"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21","reason":"bored"}"#)?.kind == .invalidField)
        #expect(failure(#"{"type":"call.signal","id":"s","call":"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"}"#)?.message == "a signal needs 'description', 'candidate' or 'restartIce'")
        #expect(failure(#"{"type":"call.signal","id":"s","call":"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21","restartIce":false}"#)?.message == "a signal needs 'description', 'candidate' or 'restartIce'")
        #expect(failure(#"{"type":"call.signal","id":"s","call":"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21","candidate":"x"}"#)?.kind == .invalidField)
        for participant in ["0", "-3", "9007199254740992"] {
            #expect(failure(#"{"type":"room.join","id":"j","room":"lobby","participant":\#(participant)}"#)?.message
                    == "'participant' must be a Janus participant id, 1 to 2^53 - 1")
        }
        #expect(failure(#"{"type":"room.join","id":"j","room":"lobby","participant":"7"}"#)?.kind == .invalidField)
    }

    /// Of an object with several bad values the error names the same one every time (the fuzzer
    /// found Foundation's decoder naming whichever came first in an order of its own).
    @Test func ofSeveralBadValuesTheSameIsNamedEveryTime() {
        // Strings with a raw control character, which JSON allows only escaped, in an invite's metadata.
        let frame = "{\"type\":\"call.invite\",\"id\":\"i\",\"call\":\"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21\",\"to\":\"bob\","
            + "\"media\":{\"audio\":true,\"video\":false},\"metadata\":{\"c\":\"\u{01}\",\"a\":\"\u{01}\",\"b\":\"\u{01}\"}}"
        let messages = Set((0..<20).map { _ in failure(frame)?.message })
        #expect(messages == ["field 'metadata.a' has the wrong type"])
    }

    @Test func aRoomJoinMayNameItsParticipant() throws {
        let join = try codec.decodeClientMessage(#"{"type":"room.join","id":"j","room":"lobby","participant":9007199254740991}"#)
        #expect(join == .roomJoin(RoomJoin(id: "j", room: "lobby", participant: (1 << 53) - 1)))
    }

    @Test func unknownFieldsAreIgnoredAndCallIDsNormalised() throws {
        let message = try codec.decodeClientMessage(#"{"type":"call.accept","id":"a","call":"6F1C0B6E-3D7A-4C55-9E7E-2B1F0A9D4C21","future":{"x":1}}"#)
        #expect(message == .callAccept(CallRequest(id: "a", call: "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21")))
    }

    @Test func candidateNullMeansEndOfCandidatesAndAbsentMeansNone() throws {
        let end = try codec.decodeClientMessage(#"{"type":"call.signal","id":"s","call":"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21","candidate":null}"#)
        guard case .callSignal(let signal) = end else { Issue.record("not a signal"); return }
        #expect(signal.signal.candidate == .endOfCandidates)
        #expect(signal.signal.description == nil)
    }

    @Test func aRestartRequestNeedsNothingElseAndSurvivesTheRelay() throws {
        let request = try codec.decodeClientMessage(#"{"type":"call.signal","id":"s","call":"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21","restartIce":true}"#)
        guard case .callSignal(let signal) = request else { Issue.record("not a signal"); return }
        #expect(signal.signal == SignalPayload(restartIce: true))
        // What the hub sends on: the same payload, from the sender.
        let relayed = ServerFrame(seq: 1, message: .callSignal(CallSignalled(call: signal.call, from: Party(user: "bob", device: "b1"), signal: signal.signal)))
        let text = String(decoding: codec.encode(relayed), as: UTF8.self)
        #expect(text.contains(#""restartIce":true"#))
        #expect(try codec.decodeServerFrame(Data(text.utf8)) == relayed)
        let plain = String(decoding: codec.encode(ClientMessage.callSignal(CallSignal(id: "c", call: signal.call, signal: SignalPayload(candidate: .endOfCandidates)))), as: UTF8.self)
        #expect(!plain.contains("restartIce"), "v1 peers never see the field unless it is asked for")
        #expect(failure(#"{"type":"room.signal","id":"s","room":"r","to":"d","restartIce":true}"#)?.message == "a signal needs 'description' or 'candidate'")
    }

    @Test func serverFramesWithUnknownFieldsStillDecode() throws {
        let frame = try codec.decodeServerFrame(#"{"type":"call.ringing","seq":3,"call":"6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21","newField":true}"#)
        #expect(frame.seq == 3)
        #expect(frame.message == .callRinging(CallRinging(call: "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21")))
        #expect(throws: ProtocolError.self) { try codec.decodeServerFrame(#"{"type":"call.hologram","seq":4}"#) }
    }

    @Test func randomBytesNeverTrap() {
        var generator = SystemRandomNumberGenerator()
        let pieces = ["{", "}", "[", "]", "\"type\"", ":", ",", "\"call.invite\"", "\"id\"", "null", "1e999", "\"\\u0000\"", "-", "true", "\"call\""]
        for _ in 0..<2000 {
            let text = (0..<Int.random(in: 0...12, using: &generator)).map { _ in pieces.randomElement(using: &generator)! }.joined()
            _ = try? codec.decodeClientMessage(text)
        }
    }
}
