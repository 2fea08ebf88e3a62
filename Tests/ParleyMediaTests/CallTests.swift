import Foundation
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import ParleySoftphone
import Testing

/// Two Linux softphones call each other through the real signaling server, with real media over loopback.
@Suite("Calls between two Linux clients", .serialized, .timeLimit(.minutes(5)))
struct CallTests {
    /// Both sides connecting while ringing (the default), neither (the classic flow), and each
    /// against a side that offers or answers only after the accept (an old client).
    @Test(arguments: [(true, true), (false, false), (false, true), (true, false)])
    func callConnectsAndEachSideHearsTheOthersTone(connectWhileRinging: (alice: Bool, bob: Bool)) async throws {
        try await withCall(connectWhileRinging: connectWhileRinging) { call in
            try await call.talk(for: .seconds(2.5))
            let alice = try #require(await call.alice.timeline(of: call.id))
            #expect(alice.timeToIceConnected != nil)
            #expect(alice.timeToFirstAudio != nil)
            // Media over UDP only: no host TCP candidate (MediaEngineConfiguration.iceTCP).
            let peer = try #require(await call.alice.peerConnection(of: call.id))
            #expect(peer.localCandidateTransports == ["udp"])
            try await call.hangUp(by: call.alice)
            try await call.expectEachHeardTheOtherThroughout()
        }
    }

    @Test func dataChannelCarriesMessagesBothWays() async throws {
        try await withCall(dataChannels: [DataChannelSpec(label: "chat"), DataChannelSpec(label: "telemetry", ordered: false, maxRetransmits: 0)]) { call in
            let alicePeer = try #require(await call.alice.peerConnection(of: call.id))
            let bobPeer = try #require(await call.bob.peerConnection(of: call.id))
            let aliceChannels = ChannelCollector(alicePeer.dataChannels)
            let bobChannels = ChannelCollector(bobPeer.dataChannels)
            let aliceChat = try await aliceChannels.channel("chat")
            let bobChat = try await bobChannels.channel("chat")
            let bobTelemetry = try await bobChannels.channel("telemetry")
            let aliceTelemetry = try await aliceChannels.channel("telemetry")
            #expect(bobTelemetry.ordered == false)
            try await eventually { aliceChat.isOpen && bobChat.isOpen && aliceTelemetry.isOpen }
            let bobHears = MessageCollector(bobChat.events)
            let aliceHears = MessageCollector(aliceChat.events)
            let telemetry = MessageCollector(bobTelemetry.events)
            aliceChat.send("hello from alice")
            bobChat.send("hello from bob")
            aliceTelemetry.send(Data([1, 2, 3, 250]))
            try await eventually { bobHears.messages.contains(.text("hello from alice")) }
            try await eventually { aliceHears.messages.contains(.text("hello from bob")) }
            try await eventually { telemetry.messages.contains(.binary(Data([1, 2, 3, 250]))) }
            try await call.hangUp(by: call.bob)
        }
    }

    @Test func muteSilencesTheFarSideForThatSpan() async throws {
        try await withCall { call in
            try await call.talk(for: .seconds(1.5))
            let mutedAt = try call.bobsRecordedSeconds()
            await call.alice.setMuted(call.id, true)
            try await Task.sleep(for: .seconds(2))
            let unmutedAt = try call.bobsRecordedSeconds()
            await call.alice.setMuted(call.id, false)
            try await Task.sleep(for: .seconds(1.5))
            try await call.hangUp(by: call.alice)
            let bob = try call.bobsRecording()
            // Leave half a second each side for the mute to take effect through the jitter buffer.
            let silent = bob.audio.mono(from: mutedAt + 0.5, length: unmutedAt - mutedAt - 1)
            #expect(AudioAnalysis.isSilent(silent))
            #expect(bob.dominantFrequency(from: 0.3, length: mutedAt - 0.5) == 440)
            #expect(bob.dominantFrequency(from: unmutedAt + 0.6, length: 0.8) == 440)
            // The far side heard about it, too.
            #expect(call.bobEvents.contains(.remoteUpdated(call.id, muted: true, held: nil)))
        }
    }

    @Test func holdSilencesBothDirectionsAndResumes() async throws {
        try await withCall { call in
            try await call.talk(for: .seconds(1))
            let heldAt = try call.bobsRecordedSeconds()
            let aliceHeldAt = try call.alicesRecording().audio.duration
            await call.alice.setHeld(call.id, true)
            try await Task.sleep(for: .seconds(2))
            let resumedAt = try call.bobsRecordedSeconds()
            let aliceResumedAt = try call.alicesRecording().audio.duration
            await call.alice.setHeld(call.id, false)
            try await Task.sleep(for: .seconds(1.5))
            try await call.hangUp(by: call.alice)
            let bob = try call.bobsRecording(), alice = try call.alicesRecording()
            // Bob hears nothing from alice while she holds, and alice plays nothing of bob.
            #expect(AudioAnalysis.isSilent(bob.audio.mono(from: heldAt + 0.5, length: resumedAt - heldAt - 1)))
            #expect(AudioAnalysis.isSilent(alice.audio.mono(from: aliceHeldAt + 0.5, length: aliceResumedAt - aliceHeldAt - 1)))
            #expect(bob.dominantFrequency(from: resumedAt + 0.6, length: 0.7) == 440)
            #expect(alice.dominantFrequency(from: aliceResumedAt + 0.6, length: 0.7) == 660)
            #expect(call.bobEvents.contains(.remoteUpdated(call.id, muted: nil, held: true)))
        }
    }

    @Test func aMutedCallStaysSilentThroughHoldAndResume() async throws {
        try await withCall { call in
            try await call.talk(for: .seconds(1.5))
            let mutedAt = try call.bobsRecordedSeconds()
            await call.alice.setMuted(call.id, true)
            await call.alice.setHeld(call.id, true)
            try await Task.sleep(for: .seconds(1))
            let resumedAt = try call.bobsRecordedSeconds()
            await call.alice.setHeld(call.id, false)
            try await Task.sleep(for: .seconds(2))
            let unmutedAt = try call.bobsRecordedSeconds()
            await call.alice.setMuted(call.id, false)
            try await Task.sleep(for: .seconds(2))
            let end = try call.bobsRecordedSeconds()
            try await call.hangUp(by: call.alice)
            let bob = try call.bobsRecording()
            // Half a second for each change to come through the jitter buffer.
            #expect(AudioAnalysis.isSilent(bob.audio.mono(from: mutedAt + 0.5, length: resumedAt - mutedAt - 0.5)), "silent while held")
            // Silence, not nothing: a muted call still sends (an empty stretch would read -120 dBFS).
            #expect(AudioAnalysis.isSilent(bob.audio.mono(from: resumedAt + 0.5, length: unmutedAt - resumedAt - 0.5)), "still muted after the resume")
            let unmuted = bob.toneInEveryWindow(440, from: unmutedAt + 0.5, to: end)
            #expect(unmuted.passed, "the tone is back once unmuted: \(unmuted)")
        }
    }

    @Test func hangupEndsBothSidesWithTheRightReasons() async throws {
        try await withCall { call in
            try await call.talk(for: .seconds(1))
            try await call.hangUp(by: call.bob)
            let alice = try #require(await call.alice.timeline(of: call.id))
            let bob = try #require(await call.bob.timeline(of: call.id))
            #expect(alice.endReason == .hangup)
            #expect(bob.endReason == .hangup)
            // The event log is read by a task of its own, which may come a moment after the timeline
            // (under AddressSanitizer it did).
            try await eventually("alice's events say the call ended by hangup") { call.aliceEvents.contains(.phase(call.id, .ended(.hangup))) }
        }
    }

    @Test func iceRestartMidCallKeepsAudioFlowing() async throws {
        try await withCall { call in
            try await call.talk(for: .seconds(1.5))
            let before = try call.bobsRecordedSeconds()
            let alicePeer = try #require(await call.alice.peerConnection(of: call.id))
            let bobPeer = try #require(await call.bob.peerConnection(of: call.id))
            await call.alice.networkChanged()
            try await eventually { alicePeer.iceRestartCount == 1 && bobPeer.iceRestartCount == 1 }
            try await Task.sleep(for: .seconds(3))
            #expect(alicePeer.iceRestartCount == 1)
            let end = try call.bobsRecordedSeconds()
            try await call.hangUp(by: call.alice)
            // Audio kept coming across the restart: every half second has the tone, none went quiet.
            let heard = try call.bobsRecording().toneInEveryWindow(440, from: before, to: end)
            #expect(heard.passed, "\(heard)")
            // And none of it missing: a recording holds only what was decoded, so a pause in the
            // media would shorten it rather than leave a quiet window.
            try await call.expectEachHeardTheOtherThroughout()
        }
    }

    /// A video call through the server: each side sees the other's picture (its colour) moving
    /// (frames that differ from the one before), through an ICE restart; hold stops alice's
    /// picture at bob's, and it moves again once resumed.
    @Test func aVideoCallKeepsAMovingPictureThroughAnICERestartAndHold() async throws {
        try await withCall(video: true) { call in
            let alicePeer = try #require(await call.alice.peerConnection(of: call.id))
            let bobPeer = try #require(await call.bob.peerConnection(of: call.id))
            let (orange, teal) = (FrameColor(rgb: 0xE07020), FrameColor(rgb: 0x20A0A0))
            func expectMoving(_ when: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
                let before = [(alicePeer.receivedVideoFrames, alicePeer.receivedVideoChanges), (bobPeer.receivedVideoFrames, bobPeer.receivedVideoChanges)]
                try await Task.sleep(for: .seconds(2))
                for (index, (peer, color, who)) in [(alicePeer, teal, "alice"), (bobPeer, orange, "bob")].enumerated() {
                    let frames = peer.receivedVideoFrames - before[index].0, changes = peer.receivedVideoChanges - before[index].1
                    #expect(frames >= 20 && changes >= frames * 3 / 4, "\(who), \(when): \(frames) frames, \(changes) changed", sourceLocation: sourceLocation)
                    #expect(peer.receivedVideoColor.map { $0.isClose(to: color) } == true, "\(who), \(when): \(String(describing: peer.receivedVideoColor))",
                            sourceLocation: sourceLocation)
                }
            }
            try await eventually(timeout: .seconds(10), "pictures both ways") { alicePeer.receivedVideoFrames > 10 && bobPeer.receivedVideoFrames > 10 }
            try await expectMoving("at first")

            await call.alice.networkChanged()
            try await eventually("ICE restarted") { alicePeer.iceRestartCount == 1 && bobPeer.iceRestartCount == 1 }
            try await expectMoving("after the ICE restart")

            await call.alice.setHeld(call.id, true)
            try await Task.sleep(for: .milliseconds(500))  // what was in flight arrives
            let frames = bobPeer.receivedVideoFrames
            try await Task.sleep(for: .seconds(1.5))
            #expect(bobPeer.receivedVideoFrames - frames <= 2, "no picture of alice while she holds")
            await call.alice.setHeld(call.id, false)
            try await eventually("alice's picture is back") { bobPeer.receivedVideoFrames > frames + 5 }
            try await expectMoving("after the hold")
            try await call.hangUp(by: call.bob)
        }
    }

    @Test func bothNetworksChangingAtOnceKeepTheCallAndItsAudio() async throws {
        try await withCall { call in
            try await call.talk(for: .seconds(1.5))
            let alicePeer = try #require(await call.alice.peerConnection(of: call.id))
            let bobPeer = try #require(await call.bob.peerConnection(of: call.id))
            let aliceBefore = try call.alicesRecording().audio.duration, bobBefore = try call.bobsRecordedSeconds()
            let (aliceUfrag, bobUfrag) = (alicePeer.iceUfrags.local, bobPeer.iceUfrags.local)
            async let a: Void = call.alice.networkChanged()
            async let b: Void = call.bob.networkChanged()
            _ = await (a, b)
            try await eventually("both sides restarted ICE and agree on the new credentials") {
                let alice = alicePeer.iceUfrags, bob = bobPeer.iceUfrags
                let aliceState = await alicePeer.signalingState(), bobState = await bobPeer.signalingState()
                return aliceState == .stable && bobState == .stable && alice.local != aliceUfrag && bob.local != bobUfrag
                    && alice.remote == bob.local && bob.remote == alice.local
            }
            try await Task.sleep(for: .seconds(3))
            #expect(await call.alice.timeline(of: call.id)?.isEnded == false)
            #expect(await call.bob.timeline(of: call.id)?.isEnded == false)
            let aliceEnd = try call.alicesRecording().audio.duration, bobEnd = try call.bobsRecordedSeconds()
            try await call.hangUp(by: call.bob)
            // Audio both ways, in every half second from before the change to the end.
            let bobHeard = try call.bobsRecording().toneInEveryWindow(440, from: bobBefore, to: bobEnd)
            let aliceHeard = try call.alicesRecording().toneInEveryWindow(660, from: aliceBefore, to: aliceEnd)
            #expect(bobHeard.passed, "bob: \(bobHeard)")
            #expect(aliceHeard.passed, "alice: \(aliceHeard)")
            try await call.expectEachHeardTheOtherThroughout()
        }
    }

    @Test func mediaSurvivesTheSignalingConnectionBeingCut() async throws {
        let proxy = try TCPProxy()
        defer { proxy.stop() }
        try await withCall(aliceThrough: proxy) { call in
            try await call.talk(for: .seconds(1))
            let signaling = try #require(await call.alice.signalingClient)
            let before = try #require(await signaling.session)
            let cutAt = try call.bobsRecordedSeconds()
            // The path to the server breaks under alice (a reset, as a network does); the SDK
            // reconnects through it and resumes its session on its own.
            proxy.cut()
            try await eventually { await signaling.session?.resumed == true }
            let after = try #require(await signaling.session)
            #expect(after.session == before.session)
            try await Task.sleep(for: .seconds(1.5))
            #expect(await call.alice.timeline(of: call.id)?.isEnded == false)
            let end = try call.bobsRecordedSeconds()
            // Signaling works again: the hangup reaches the far side.
            try await call.hangUp(by: call.alice)
            let heard = try call.bobsRecording().toneInEveryWindow(440, from: cutAt, to: end)
            #expect(heard.passed, "\(heard)")
            try await call.expectEachHeardTheOtherThroughout()
        }
    }

    /// A path that goes silent without a reset, as a phone's does when its network drops away: no
    /// close, no error, only nothing arriving. The heartbeat (every 2 s here) goes unanswered, the
    /// SDK gives the connection up and resumes its session on a new one.
    @Test func aSignalingConnectionThatGoesSilentIsNoticedAndResumed() async throws {
        let proxy = try TCPProxy()
        defer { proxy.stop() }
        try await withCall(aliceThrough: proxy, server: { $0.heartbeat = 2 }) { call in
            try await call.talk(for: .seconds(1))
            let signaling = try #require(await call.alice.signalingClient)
            let before = try #require(await signaling.session)
            let silencedAt = try call.bobsRecordedSeconds()
            proxy.blackHole()
            try await eventually(timeout: .seconds(30), "alice's SDK noticed the silent connection and resumed on a new one") {
                await signaling.session?.resumed == true
            }
            #expect(await signaling.session?.session == before.session)
            #expect(await call.alice.timeline(of: call.id)?.isEnded == false)
            let end = try call.bobsRecordedSeconds()
            // Signaling works again: the hangup reaches the far side.
            try await call.hangUp(by: call.alice)
            let heard = try call.bobsRecording().toneInEveryWindow(440, from: silencedAt, to: end)
            #expect(heard.passed, "\(heard)")
            try await call.expectEachHeardTheOtherThroughout()
        }
    }

    @Test(.enabled(if: Coturn.testsEnabled))
    func relayOnlyCallGoesThroughTurnWithTheServersCredentials() async throws {
        let turn = try await Coturn()
        defer { turn.stop() }
        try await withCall(relayOnly: true, server: { configuration in
            configuration.iceServers = IceServerProvider(turnURLs: [turn.url], turnSecret: turn.secret)
        }) { call in
            try await call.talk(for: .seconds(1.5))
            let alicePeer = try #require(await call.alice.peerConnection(of: call.id))
            let bobPeer = try #require(await call.bob.peerConnection(of: call.id))
            #expect(alicePeer.localCandidateTypes == ["relay"])
            #expect(bobPeer.localCandidateTypes == ["relay"])
            // The media runs on relay candidates coturn allocated: the selected pairs are relays on its ports.
            for (peer, user) in [(alicePeer, "alice"), (bobPeer, "bob")] {
                let pair = try #require(peer.selectedCandidatePair, "\(user) has a selected pair")
                #expect(pair.localType == "relay", "\(user): \(pair)")
                #expect(turn.relayPorts.contains(pair.localPort), "\(user)'s relay port \(pair.localPort) is coturn's")
                #expect(turn.allocated(for: user), "coturn allocated for \(user): \(turn.output.suffix(3000))")
            }
            try await call.hangUp(by: call.alice)
            try await call.expectEachHeardTheOtherThroughout()
        }
    }

    @Test func callingAnOfflineUserSaysSo() async throws {
        let server = try await LiveServer.start()
        let alice = try makePhone(server, "alice", tone: 440, record: nil)
        try await alice.start()
        let events = EventCollector(alice.events)
        let call = await alice.call("nobody")
        try await eventually { events.events.contains(.calleeOffline(call)) }
        await alice.stop()
        try await server.stop()
    }

    @Test func aServerThatIsDownGetsAClearError() async throws {
        let phone = try makePhone(URL(string: "http://127.0.0.1:9")!, "alice", tone: 440, record: nil)
        await #expect(throws: SoftphoneError.self) { try await phone.start() }
        do { try await phone.start() } catch { #expect("\(error)".contains("cannot reach the Parley server")) }
    }
}
