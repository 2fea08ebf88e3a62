import Foundation
import ParleyJanus
import ParleyProtocol
import Testing

/// Replays a real Janus 1.1.2 session (shared/reference/janus, the AudioBridge scenario: two
/// connections, rooms, joins, mute, errors, leave, destroy) against the client. Each frame the
/// client sends must equal the recorded one but for its transaction id; Janus's recorded answers
/// and events then come back, in the recorded order, across both connections.
@Suite("Janus client against a recorded Janus session")
struct TranscriptReplayTests {
    @Test func theAudioBridgeFlowReplaysFrameForFrame() async throws {
        let replay = try Replay(skipping: Replay.rawProbes)
        let a = JanusClient(transport: replay.connection("A"), keepalive: .seconds(3600))
        let b = JanusClient(transport: replay.connection("B"), keepalive: .seconds(3600))

        #expect(try await a.createSession() == 3_803_991_632_598_826)
        let alice = try await AudioBridge.attach(a, opaqueID: "poc-eIooRm")
        #expect(alice.handle == 481_117_881_321_790)
        try await a.keepaliveNow()
        let rooms = try await alice.list()
        #expect(rooms.first?.room == 1234)

        var options = AudioBridgeRoomOptions()
        options.description = "POC room"
        options.secret = "roomsecret"
        options.isPrivate = false
        options.samplingRate = 16000
        options.audioLevelExtension = true
        options.audioActivePackets = 50
        options.audioLevelAverage = 60
        #expect(try await alice.create(room: 4242, options: options) == 4242)
        await #expect(throws: JanusError.audioBridge(.roomExists, reason: "Room 4242 already exists")) {
            try await alice.createBare(room: 4242)
        }
        #expect(try await alice.exists(room: 4242))
        let joined = try await alice.join(room: 4242, display: "alice", muted: false)
        #expect(joined.id == 7_642_621_689_151_849)
        #expect(joined.participants.isEmpty)

        #expect(try await b.createSession() == 7_802_342_659_733_590)
        let bob = try await AudioBridge.attach(b, opaqueID: "poc-eIooRm")
        let bobJoined = try await bob.join(room: 4242, display: "bob")
        #expect(bobJoined.participants.map(\.display) == ["alice"])
        var aliceEvents = alice.events.makeAsyncIterator()
        var bobEvents = bob.events.makeAsyncIterator()
        let arrival = await aliceEvents.next()
        guard case .joined(4242, let people)? = arrival else { Issue.record("alice hears bob join: \(String(describing: arrival))"); return }
        #expect(people.map(\.display) == ["bob"])

        #expect(try await alice.listParticipants(room: 4242).count == 2)
        try await alice.configure(muted: true)
        let muted = await bobEvents.next()
        guard case .participantsUpdated(4242, let update)? = muted else { Issue.record("bob hears alice mute: \(String(describing: muted))"); return }
        #expect(update.first?.display == "alice" && update.first?.muted == true)
        #expect(try await alice.listParticipants(room: 4242).first { $0.display == "alice" }?.muted == true)
        try await alice.configure(muted: false)
        _ = await bobEvents.next()
        await #expect(throws: JanusError.audioBridge(.alreadyJoined, reason: "Already in a room (use changeroom to join another one)")) {
            _ = try await alice.join(room: 4242, display: "again")
        }

        let spare = try await AudioBridge.attach(a, opaqueID: "poc-eIooRm")
        await #expect(throws: JanusError.audioBridge(.noSuchRoom, reason: "No such room (9999)")) {
            _ = try await spare.join(room: 9999, display: "x")
        }
        await replay.skip(through: "err_join_bad_room_type")
        await #expect(throws: JanusError.audioBridge(.notJoined, reason: "Can't configure (not in a room)")) { try await spare.configure(muted: true) }
        await #expect(throws: JanusError.audioBridge(.notJoined, reason: "Can't leave (not in a room)")) { try await spare.leave() }
        try await spare.detach()
        await #expect(throws: JanusError.audioBridge(.noSuchRoom, reason: "No such room (9999)")) { _ = try await alice.listParticipants(room: 9999) }
        await #expect(throws: JanusError.core(.pluginNotFound, reason: "No such plugin 'janus.plugin.nope'")) {
            _ = try await a.attach(plugin: "janus.plugin.nope", opaqueID: nil)
        }

        try await alice.leave()
        let left = await bobEvents.next()
        #expect(left == .leaving(room: 4242, id: 7_642_621_689_151_849))
        await #expect(throws: JanusError.audioBridge(.unauthorized, reason: "Unauthorized (wrong secret)")) {
            try await alice.destroy(room: 4242, secret: "wrong")
        }
        try await alice.destroy(room: 4242, secret: "roomsecret", permanent: false)
        #expect(await bobEvents.next() == .destroyed(room: 4242))
        try await alice.detach()
        try await a.destroy()
        try await b.destroy()
        #expect(await replay.remaining() == [])
    }
}

extension AudioBridge {
    /// `create` with only the room, as the recorded error probe sends it.
    func createBare(room: Int64) async throws {
        _ = try await client.message(handle, body: ["request": "create", "room": .number(Double(room))])
    }
}

/// The recorded frames, served to clients connection by connection in the recorded order.
actor Replay {
    struct Frame {
        var seq: Int
        var connection: String
        var direction: String
        var step: String
        var raw: String
    }

    /// Steps of the recording that send hand-made malformed frames a typed client never sends.
    static let rawProbes: Set<String> = [
        "info", "err_listparticipants_bad_room_type", "err_create_bad_room_type", "err_missing_room", "err_unknown_request",
        "err_missing_request", "err_unknown_handle", "err_unknown_session", "err_message_without_body",
        "err_unknown_janus_verb", "err_missing_transaction", "err_invalid_json",
    ]

    private var frames: [Frame]
    private var transactions: [String: String] = [:]  // recorded → the client's
    private var outlets: [String: AsyncStream<String>.Continuation] = [:]
    private var streams: [String: AsyncStream<String>] = [:]

    init(skipping: Set<String>) throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/audiobridge-flow.json")
        let root = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as! [String: Any]
        let scenario = (root["scenarios"] as! [String: Any])["audiobridge_flow"] as! [String: Any]
        frames = (scenario["messages"] as! [[String: Any]]).compactMap { message in
            let step = message["step"] as? String ?? ""
            guard !skipping.contains(step), message["dir"] as? String != "close" else { return nil }
            return Frame(seq: message["seq"] as! Int, connection: message["conn"] as! String, direction: message["dir"] as! String,
                         step: step, raw: message["raw"] as! String)
        }
        for name in ["A", "B"] {
            let (stream, continuation) = AsyncStream<String>.makeStream()
            streams[name] = stream
            outlets[name] = continuation
        }
    }

    nonisolated func connection(_ name: String) -> Connection { Connection(replay: self, name: name) }

    func incoming(_ name: String) -> AsyncStream<String> { streams[name]! }

    /// Drops the recorded frames up to and including the step (probes the typed API cannot send).
    func skip(through step: String) {
        while let index = frames.firstIndex(where: { $0.step == step }) { frames.remove(at: index) }
    }

    func remaining() -> [String] { frames.map { "\($0.seq) \($0.connection) \($0.direction) \($0.step)" } }

    func sent(_ text: String, on connection: String) throws {
        guard let next = frames.first, next.direction == "send", next.connection == connection else {
            throw ReplayError("\(connection) sent \(text) but the recording expects \(frames.first.map { "\($0.connection) \($0.direction) \($0.step)" } ?? "nothing")")
        }
        frames.removeFirst()
        var recorded = try Self.object(next.raw)
        var actual = try Self.object(text)
        guard let theirs = recorded.removeValue(forKey: "transaction") as? String, let ours = actual.removeValue(forKey: "transaction") as? String else {
            throw ReplayError("no transaction in \(text)")
        }
        transactions[theirs] = ours
        // As JSON values, which tell `true` from `1` (Foundation's numbers do not, and Janus does).
        guard try Self.value(next.raw, without: "transaction") == Self.value(text, without: "transaction"),
              NSDictionary(dictionary: recorded).isEqual(to: actual) else {
            throw ReplayError("step \(next.step): sent \(text)\n  recorded \(next.raw)")
        }
        // Janus's answers and the events it caused, up to the next frame a client sends.
        while let frame = frames.first, frame.direction == "recv" {
            frames.removeFirst()
            var raw = frame.raw
            for (theirs, ours) in transactions { raw = raw.replacingOccurrences(of: "\"\(theirs)\"", with: "\"\(ours)\"") }
            outlets[frame.connection]!.yield(raw)
        }
    }

    static func value(_ text: String, without key: String) throws -> JSONValue {
        guard case .object(var members) = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)) else {
            throw ReplayError("not an object: \(text)")
        }
        members[key] = nil
        return .object(members)
    }

    static func object(_ text: String) throws -> [String: Any] {
        guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else { throw ReplayError("not an object: \(text)") }
        return object
    }

    struct Connection: JanusTransport {
        let replay: Replay
        let name: String
        let stream: AsyncStream<String>

        init(replay: Replay, name: String) {
            self.replay = replay
            self.name = name
            let (stream, continuation) = AsyncStream<String>.makeStream()
            self.stream = stream
            Task {
                for await frame in await replay.incoming(name) { continuation.yield(frame) }
                continuation.finish()
            }
        }

        func send(_ text: String) async throws { try await replay.sent(text, on: name) }
        var incoming: AsyncStream<String> { stream }
        func close() async {}
    }
}

struct ReplayError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
