import Foundation
@testable import ParleyProtocol
import Testing

/// Pins the wire encoding of every message: each sample's JSON must equal its file in Golden/.
/// Run with PARLEY_UPDATE_GOLDEN=1 to rewrite the files after an intended change, then review the diff.
@Suite("Golden wire encoding")
struct GoldenTests {
    static let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"
    static let alice = Party(user: "alice", device: "iphone-1")
    static let offer = SessionDescription(type: "offer", sdp: "v=0\r\no=- 4611 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n")
    static let candidate = IceCandidate(candidate: "candidate:1 1 udp 2122260223 198.51.100.2 54321 typ host", sdpMid: "0", sdpMLineIndex: 0, usernameFragment: "abcd")

    static let serverSamples: [(String, ServerFrame)] = [
        ("welcome", ServerFrame(seq: nil, message: .welcome(Welcome(
            re: "h1", session: "s-1", user: "alice", device: "iphone-1", resumed: false, heartbeat: 20,
            iceServers: [IceServer(urls: ["stun:turn.example.net:3478"]),
                         IceServer(urls: ["turn:turn.example.net:3478?transport=udp"], username: "1767312000:alice", credential: "c2VjcmV0")])))),
        ("ack-empty", ServerFrame(seq: 1, message: .ack(Ack(re: "r1")))),
        ("ack-call-state", ServerFrame(seq: 2, message: .ack(Ack(re: "r2", result: .callState(CallStateResult(call: call, state: .ended, reason: .cancelled)))))),
        ("ack-room-join", ServerFrame(seq: 3, message: .ack(Ack(re: "r3", result: .roomJoin(RoomJoinResult(
            room: "standup", participants: [RoomParticipant(user: "bob", device: "b1", display: "Bob")], media: .mesh)))))),
        ("error", ServerFrame(seq: 4, message: .error(ErrorMessage(re: "r4", code: .callNotFound, message: "no such call")))),
        ("call-incoming", ServerFrame(seq: 5, message: .callIncoming(CallIncoming(
            call: call, from: Party(user: "alice", device: "iphone-1", name: "Alice"), media: .audioOnly,
            metadata: .object(["topic": .string("mentoring")]), expiresAt: 1_767_225_645_000)))),
        ("call-ringing", ServerFrame(seq: 6, message: .callRinging(CallRinging(call: call)))),
        ("call-accepted", ServerFrame(seq: 7, message: .callAccepted(CallAccepted(call: call, device: "laptop")))),
        ("call-ended", ServerFrame(seq: 8, message: .callEnded(CallEnded(call: call, reason: .hangup, detail: "bye", endedAt: 1_767_225_660_000, duration: 57)))),
        ("call-signal-description", ServerFrame(seq: 9, message: .callSignal(CallSignalled(call: call, from: alice, signal: SignalPayload(description: offer))))),
        ("call-signal-candidate", ServerFrame(seq: 10, message: .callSignal(CallSignalled(call: call, from: alice, signal: SignalPayload(candidate: .candidate(candidate)))))),
        ("call-signal-end-of-candidates", ServerFrame(seq: 11, message: .callSignal(CallSignalled(call: call, from: alice, signal: SignalPayload(candidate: .endOfCandidates))))),
        ("call-signal-restart-ice", ServerFrame(seq: 16, message: .callSignal(CallSignalled(call: call, from: alice, signal: SignalPayload(restartIce: true))))),
        ("call-updated", ServerFrame(seq: 12, message: .callUpdated(CallUpdated(call: call, from: alice, muted: true, held: false)))),
        ("room-participant-joined", ServerFrame(seq: 13, message: .roomParticipantJoined(RoomParticipantJoined(room: "standup", participant: RoomParticipant(user: "bob", device: "b1", display: "Bob"))))),
        ("room-participant-left", ServerFrame(seq: 14, message: .roomParticipantLeft(RoomParticipantLeft(room: "standup", user: "bob", device: "b1")))),
        ("room-signal", ServerFrame(seq: 15, message: .roomSignal(RoomSignalled(room: "standup", from: alice, signal: SignalPayload(description: offer))))),
    ]

    static let clientSamples: [(String, ClientMessage)] = [
        ("hello", .hello(Hello(id: "h1", device: "iphone-1", client: ClientInfo(name: "parley-swift", version: "0.1.0", platform: .ios),
                               resume: ResumeRequest(session: "s-1", lastSeq: 41)))),
        ("ping", .ping(Ping(id: "p1"))),
        ("client-ack", .ack(SeqAck(seq: 57))),
        ("call-invite", .callInvite(CallInvite(id: "r1", call: call, to: "bob", media: MediaSpec(audio: true, video: false), metadata: .object(["topic": .string("mentoring")])))),
        ("call-ringing-request", .callRinging(CallRingingRequest(id: "r2", call: call))),
        ("call-accept", .callAccept(CallRequest(id: "r3", call: call))),
        ("call-decline", .callDecline(CallDecline(id: "r4", call: call, reason: .busy))),
        ("call-signal-request", .callSignal(CallSignal(id: "r5", call: call, signal: SignalPayload(candidate: .endOfCandidates)))),
        ("call-signal-restart-ice", .callSignal(CallSignal(id: "r13", call: call, signal: SignalPayload(restartIce: true)))),
        ("call-update", .callUpdate(CallUpdate(id: "r6", call: call, muted: true))),
        ("call-hangup", .callHangup(CallHangup(id: "r7", call: call, reason: "bye"))),
        ("call-report", .callReport(CallReport(id: "r8", call: call, quality: CallQuality(mos: 4.3, rttMs: 12, jitterMs: 3, lossPct: 0.1, bitrateKbps: 32)))),
        ("call-state", .callState(CallRequest(id: "r9", call: call))),
        ("room-join", .roomJoin(RoomJoin(id: "r10", room: "standup", display: "Alice"))),
        ("room-join-again", .roomJoin(RoomJoin(id: "r14", room: "standup", display: "Alice", participant: 4_503_600_164_322_303))),
        ("room-leave", .roomLeave(RoomLeave(id: "r11", room: "standup"))),
        ("room-signal-request", .roomSignal(RoomSignal(id: "r12", room: "standup", to: "b1", signal: SignalPayload(candidate: .candidate(candidate))))),
    ]

    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Golden")
    static var updating: Bool { ProcessInfo.processInfo.environment["PARLEY_UPDATE_GOLDEN"] == "1" }

    static func check(_ name: String, _ data: Data) throws {
        let file = directory.appendingPathComponent("\(name).json")
        let text = String(decoding: data, as: UTF8.self) + "\n"
        if updating {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try text.write(to: file, atomically: true, encoding: .utf8)
            return
        }
        let golden = try String(contentsOf: file, encoding: .utf8)
        #expect(text == golden, "\(name).json differs")
    }

    @Test(arguments: serverSamples.map(\.0))
    func serverFrame(_ name: String) throws {
        let frame = try #require(Self.serverSamples.first { $0.0 == name }?.1)
        let data = WireCodec().encode(frame)
        try Self.check("server-" + name, data)
        #expect(try WireCodec().decodeServerFrame(data) == frame, "decoding gives the frame back")
    }

    @Test(arguments: clientSamples.map(\.0))
    func clientMessage(_ name: String) throws {
        let message = try #require(Self.clientSamples.first { $0.0 == name }?.1)
        let data = WireCodec().encode(message)
        try Self.check("client-" + name, data)
        #expect(try WireCodec().decodeClientMessage(data) == message, "decoding gives the message back")
    }
}
