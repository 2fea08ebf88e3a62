import Foundation
import ParleyGStreamer
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import ParleySoftphone
import Testing

/// Voice rooms on a real Janus AudioBridge with Linux clients through the Parley server.
@Suite("AudioBridge rooms with Linux clients", .serialized, .enabled(if: RoomLab.enabled), .timeLimit(.minutes(5)))
struct RoomTests {
    @Test func talkingFollowsWhoSpeaksAndMuteSilencesThem() async throws {
        try await RoomLab.run { lab in
            // Alice speaks in bursts: one second of 440 Hz, two of silence, over and over.
            let pattern = lab.directory.appendingPathComponent("bursts.wav")
            try RoomLab.writeBursts(to: pattern)
            let alice = try await lab.phone("alice", input: .file(pattern, loop: true))
            let bob = try await lab.phone("bob", input: .silence, record: true)

            let (aliceRoom, aliceHears) = try await lab.join(alice)
            try await aliceHears.wait("alice joined") { if case .joined(_, let people) = $0 { people.map(\.display) == ["alice"] } else { false } }
            let (bobRoom, bobHears) = try await lab.join(bob)
            try await bobHears.wait("bob sees alice") { if case .joined(_, let people) = $0 { people.map(\.display).sorted() == ["alice", "bob"] } else { false } }
            try await aliceHears.wait("alice sees bob join") { if case .memberJoined(let member) = $0 { member.display == "bob" } else { false } }
            let bobConnected = try await bobHears.wait("bob's media up") { $0 == .connected }
            try await bobHears.wait("bob hears the room") { $0 == .hearing }

            // Talking starts and stops with alice's bursts; bob, silent, never talks.
            do {
                try await eventually(timeout: .seconds(15), "two bursts of alice talking") { bobHears.talking(of: "alice").count >= 4 }
            } catch {
                throw TestFailure("bob heard no talking bursts from alice: \(bobHears.all); alice: \(aliceHears.all)")
            }
            // Bob may join mid-burst, so the first change he sees can be either; they alternate.
            let changes = bobHears.talking(of: "alice")
            #expect(zip(changes, changes.dropFirst()).allSatisfy { $0 != $1 }, "\(changes)")
            #expect(changes.filter { $0 }.count >= 2 && changes.filter { !$0 }.count >= 2, "\(changes)")
            #expect(aliceHears.talking(of: "bob").allSatisfy { !$0 }, "bob sends silence")

            // Alice mutes (once bob has had seven seconds of the room to judge): bob is told, and
            // hears silence from then on.
            try await Task.sleep(until: bobConnected + .seconds(7), clock: .continuous)
            let muting = ContinuousClock.now
            try await aliceRoom.setMuted(true)
            try await bobHears.wait("bob sees alice muted") { if case .muted(let member, true) = $0 { member.display == "alice" } else { false } }
            try await Task.sleep(for: .seconds(4))  // the recording's last seconds, checked below, are all after the mute
            await bobRoom.leave()
            try await aliceHears.wait("alice sees bob leave") { if case .memberLeft(let member) = $0 { member.display == "bob" } else { false } }
            await bob.stop()

            // Alice's bursts (one second in three) in every three seconds of bob's recording, from
            // his media connecting to her mute (the recording starts as his media connects).
            let heard = try Recording(lab.recording("bob"))
            let muted = (muting - bobConnected).seconds
            #expect(muted >= 6 && heard.audio.duration >= muted, "bob recorded \(heard.audio.duration) s; alice muted at \(muted) s")
            let quiet = stride(from: 0.0, through: muted - 3, by: 3).filter { start in
                !stride(from: start, to: start + 3, by: 0.25).contains { at in
                    heard.dominantFrequency(from: at, length: 0.5).map { abs($0 - 440) <= 2 } == true
                }
            }
            #expect(quiet.isEmpty, "no burst of alice in the 3 s from \(quiet) s, before her mute at \(muted) s")
            let after = heard.audio.mono(from: heard.audio.duration - 3)
            #expect(AudioAnalysis.isSilent(after), "muted alice is silent at bob's: \(AudioAnalysis.level(after)) dBFS")
        }
    }
}

extension RoomTests {
    /// Two members with steady tones: each hears the other in every half second from the moment
    /// both are in to the leave, on the wall clock (a receiver writes only what it decodes, so the
    /// recording must last that long), and never itself (AudioBridge sends each member the mix of
    /// the others).
    @Test func eachMemberHearsTheOtherInEveryWindowAndNeverItself() async throws {
        try await RoomLab.run { lab in
            let alice = try await lab.phone("alice", input: .tone(hertz: 440), record: true)
            let bob = try await lab.phone("bob", input: .tone(hertz: 660), record: true)
            let (aliceRoom, aliceHears) = try await lab.join(alice)
            let aliceConnected = try await aliceHears.wait("alice's media up") { $0 == .connected }
            let (bobRoom, bobHears) = try await lab.join(bob)
            let bobConnected = try await bobHears.wait("bob's media up") { $0 == .connected }
            try await bobHears.wait("bob hears the room") { $0 == .hearing }
            try await aliceHears.wait("alice sees bob talk") { if case .talking(let member, true) = $0 { member.display == "bob" } else { false } }
            try await Task.sleep(for: .seconds(6))  // the stretch the recordings are judged on
            let left = ContinuousClock.now
            await aliceRoom.leave()
            await bobRoom.leave()
            await alice.stop()
            await bob.stop()

            // Alice's recording starts as her media connects, a while before bob is in the room.
            let bobIn = (bobConnected - aliceConnected).seconds + 1.5
            for (who, hertz, connected, from, other) in [("alice", 660.0, aliceConnected, bobIn, 440.0), ("bob", 440.0, bobConnected, 1.5, 660.0)] {
                let recording = try Recording(lab.recording(UserID(rawValue: who)!))
                let spanned = (left - connected).seconds
                #expect(recording.audio.duration > spanned - 1, "\(who) recorded \(recording.audio.duration) s of the \(spanned) s from media up to the leave")
                let check = recording.toneInEveryWindow(hertz, from: from, to: recording.audio.duration - 0.5)
                #expect(check.passed, "\(who): \(check)")
                let samples = recording.audio.mono(from: from)
                let own = AudioAnalysis.toneAmplitude(samples, frequency: other, sampleRate: recording.audio.sampleRate)
                let heard = AudioAnalysis.toneAmplitude(samples, frequency: hertz, sampleRate: recording.audio.sampleRate)
                #expect(own < heard / 30, "\(who) hears their own \(Int(other)) Hz (amplitude \(own), the other's \(heard))")
            }
        }
    }

    @Test func parleyRoomJoinPrintsWhoIsThereAndWhoTalks() async throws {
        try await RoomLab.run { lab in
            let bob = try await lab.phone("bob", input: .tone(hertz: 660))
            let (_, _) = try await lab.join(bob)
            let result = try await SoftphoneCommandTests.run(["room", "join", "lobby", "--server", lab.server.baseURL, "--as", "dave",
                                                        "--play", "tone:440", "--duration", "4", "--ice-address", TestNetwork.clientAddress])
            #expect(result.status == 0, "\(result.output)\(result.errors)")
            #expect(result.output.contains("joined room lobby: "), "\(result.output)")
            #expect(result.output.contains("dave (you)"))
            #expect(result.output.contains("audio connected to the room"))
            #expect(result.output.contains("dave is talking"), "Janus hears dave's tone: \(result.output)")
            #expect(result.output.hasSuffix("left\n"), "\(result.output)")
        }
    }

    /// The same device joins again (an app restarted): the server revokes the old admission and
    /// kicks the old participant, whose session ends and says why; the others see one of it.
    @Test func joiningAgainFromTheSameDeviceRemovesTheOldParticipant() async throws {
        try await RoomLab.run { lab in
            let alice = try await lab.phone("alice", input: .tone(hertz: 440))
            let bob = try await lab.phone("bob", input: .silence)
            let (_, bobHears) = try await lab.join(bob)
            let (_, firstHears) = try await lab.join(alice)
            try await bobHears.wait("bob sees alice") { if case .memberJoined(let member) = $0 { member.display == "alice" } else { false } }
            let (_, secondHears) = try await lab.join(alice)
            try await firstHears.wait("the old session is removed") { $0 == .ended(reason: "removed from the room") }
            try await secondHears.wait("the new session is in") { if case .joined(_, let people) = $0 { Set(people.map(\.display)) == ["alice", "bob"] } else { false } }
            try await bobHears.wait("bob sees the old alice leave") { if case .memberLeft(let member) = $0 { member.display == "alice" } else { false } }
            try await eventually("one alice at bob's") {
                let joins = bobHears.all.filter { if case .memberJoined(let m) = $0 { m.display == "alice" } else { false } }.count
                let lefts = bobHears.all.filter { if case .memberLeft(let m) = $0 { m.display == "alice" } else { false } }.count
                return joins - lefts == 1
            }
        }
    }

    @Test func parleyRoomJoinSaysWhenTheServerHasNoJanus() async throws {
        let server = try await LiveServer.start()
        let result = try await SoftphoneCommandTests.run(["room", "join", "lobby", "--server", server.baseURL, "--as", "dave", "--play", "silence"])
        #expect(result.status != 0)
        #expect(result.errors.contains("room lobby is a mesh room; voice rooms need AudioBridge (start the server with --janus)"), "\(result.errors)")
        try await server.stop()
    }
}

@Suite("AudioBridge rooms survive a Janus restart", .serialized, .enabled(if: RoomLab.enabled), .timeLimit(.minutes(5)))
struct RoomRestartTests {
    @Test func clientsRejoinByThemselvesWhenJanusRestarts() async throws {
        try TestNetwork.janusLink()
        var janus = try await JanusServer.start()
        let port = janus.port
        defer { janus.stop() }
        let server = try await LiveServer.start { $0.janus = JanusSettings(url: janus.url) }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-restart-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let pattern = directory.appendingPathComponent("bursts.wav")
        try RoomLab.writeBursts(to: pattern)
        let alice = try await RoomLab.phone(server, "alice", input: .file(pattern, loop: true), record: nil)
        let bob = try await RoomLab.phone(server, "bob", input: .silence, record: directory.appendingPathComponent("bob.wav"))
        let (aliceRoom, aliceHears) = try await RoomLab.join(alice)
        let (bobRoom, bobHears) = try await RoomLab.join(bob)
        try await bobHears.wait("bob hears alice talk") { if case .talking(let member, true) = $0 { member.display == "alice" } else { false } }

        let restartedAt = ContinuousClock.now
        janus.stop()
        janus = try await JanusServer.start(port: port)
        for (name, hears) in [("alice", aliceHears), ("bob", bobHears)] as [(String, RoomEvents)] {
            try await hears.wait("\(name) notices", timeout: .seconds(15)) { if case .reconnecting = $0 { true } else { false } }
        }
        // Joined again on the new Janus: two `joined` events each, media up, talking detected anew.
        try await eventually(timeout: .seconds(20), "both joined again") {
            let joins = [aliceHears, bobHears].map { $0.all.filter { if case .joined = $0 { true } else { false } }.count }
            return joins.allSatisfy { $0 >= 2 }
        }
        let rejoinedAt = ContinuousClock.now
        // Only what happens after the rejoin counts: talking detected anew, and audio from the new Janus.
        try await eventually(timeout: .seconds(25), "bob sees alice talk and stop twice after the restart") {
            bobHears.talking(of: "alice", since: rejoinedAt).count >= 4
        }
        #expect(bobHears.count(since: restartedAt) { $0 == .hearing } >= 1, "bob's new media connection decodes audio")
        // Nine seconds of the new connection to judge: three of alice's bursts.
        let connected = try #require(bobHears.last { $0 == .connected })
        try await Task.sleep(until: connected + .seconds(9), clock: .continuous)
        let left = ContinuousClock.now
        await aliceRoom.leave()
        await bobRoom.leave()
        await alice.stop()
        await bob.stop()
        try await server.stop()

        // The new media connection has a recording of its own (the engine numbers them): alice's
        // bursts (one second in three) in every three seconds of it, from its start to the leave.
        let recording = try Recording(directory.appendingPathComponent("bob-2.wav"))
        let spanned = (left - connected).seconds
        #expect(recording.audio.duration > spanned - 1, "bob recorded \(recording.audio.duration) s of the \(spanned) s of his second media connection")
        let quiet = stride(from: 0.0, through: recording.audio.duration - 3, by: 3).filter { start in
            !stride(from: start, to: start + 3, by: 0.25).contains { at in
                recording.dominantFrequency(from: at, length: 0.5).map { abs($0 - 440) <= 2 } == true
            }
        }
        #expect(recording.audio.duration >= 6 && quiet.isEmpty, "no burst of alice in the 3 s from \(quiet) s of \(recording.audio.duration) s")
    }
}

@Suite("Voice rooms through a restart of the Parley server", .serialized, .enabled(if: RoomLab.enabled), .timeLimit(.minutes(5)))
struct RoomServerRestartTests {
    /// The Parley server restarts under a voice room (on SQLite, which keeps the room key; Janus
    /// goes on). Each member's signaling session starts anew, and its `RoomSession` joins the room
    /// again naming its Janus participant: the restarted server lists both to a newcomer, and their
    /// media never stops — no reconnect, no end, and bob goes on seeing alice talk.
    @Test func membersAreListedAgainAndTheirMediaGoesOn() async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-room-restart-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = directory.appendingPathComponent("parley.sqlite").path
        let first = try await LiveServer.start(databasePath: database) { $0.janus = JanusSettings(url: janus.url) }
        let pattern = directory.appendingPathComponent("bursts.wav")
        try RoomLab.writeBursts(to: pattern)
        let alice = try await RoomLab.phone(first, "alice", input: .file(pattern, loop: true), record: nil)
        let bob = try await RoomLab.phone(first, "bob", input: .silence, record: nil)
        let (aliceRoom, aliceHears) = try await RoomLab.join(alice)
        let (bobRoom, bobHears) = try await RoomLab.join(bob)
        try await bobHears.wait("bob sees alice talk") { if case .talking(let member, true) = $0 { member.display == "alice" } else { false } }

        let restartedAt = ContinuousClock.now
        try await first.stop()
        let second = try await LiveServer.start(databasePath: database) {
            $0.janus = JanusSettings(url: janus.url)
            $0.port = first.port
        }
        let carol = try await RoomLab.phone(second, "carol", input: .silence, record: nil)
        let carolSignaling = try #require(await carol.signalingClient)
        try await eventually(timeout: .seconds(20), "the restarted server lists alice and bob to carol") {
            try await Task.sleep(for: .milliseconds(300))  // a join a few times a second, not a flood
            let joined = try await carolSignaling.request { .roomJoin(RoomJoin(id: $0, room: "lobby", display: "carol")) }
                .decodeResult(RoomJoinResult.self)
            return Set(joined.participants.map(\.user)) == ["alice", "bob"]
        }
        let listedAt = ContinuousClock.now
        try await eventually(timeout: .seconds(10), "bob sees alice talk and stop after the restart") {
            bobHears.talking(of: "alice", since: listedAt).count >= 2
        }
        for (name, hears) in [("alice", aliceHears), ("bob", bobHears)] as [(String, RoomEvents)] {
            let broken = hears.count(since: restartedAt) { if case .reconnecting = $0 { true } else if case .ended = $0 { true } else { false } }
            #expect(broken == 0, "\(name)'s media went on: \(hears.all)")
        }
        _ = try? await carolSignaling.request { .roomLeave(RoomLeave(id: $0, room: "lobby")) }
        await aliceRoom.leave()
        await bobRoom.leave()
        for phone in [alice, bob, carol] { await phone.stop() }
        try await second.stop()
    }
}
