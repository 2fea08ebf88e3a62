import Foundation
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

/// Two SDK clients through the real server, with fake media and a fake CallKit.
@Suite("Calls through the real server")
struct CallFlowTests {
    /// Sets up a connected call from alice to bob; answers (server, alice, bob, call).
    static func connectedCall(_ server: LiveServer) async throws -> (SDKDevice, SDKDevice, UUID) {
        let alice = SDKDevice(server, user: "alice", device: "a1")
        let bob = SDKDevice(server, user: "bob", device: "b1")
        try await alice.start()
        try await bob.start()
        let (call, start) = alice.call("bob")
        try await eventually("bob's phone rings") { bob.incomingCall() == call }
        try await eventually("the start action is fulfilled") { alice.provider.outcome(of: start) == true }
        // Connecting while ringing: the path is ready before the answer (answered sooner, the caller
        // would connect anew and the tests below would look at the path it closed).
        try await eventually("alice connects while it rings") { alice.peers.connections.first?.currentIceState == .connected }
        let answer = bob.provider.perform { .answer($0, call: call) }
        try await eventually("the answer action is fulfilled") { bob.provider.outcome(of: answer) == true }
        alice.provider.deliver(.audioSessionActivated)
        bob.provider.deliver(.audioSessionActivated)
        try await eventually("both connect") {
            let a = await alice.phase(call)
            let b = await bob.phase(call)
            return a == .connected && b == .connected
        }
        // The activation is delivered on CallKit's queue: the media may connect before it lands.
        try await eventually("both enable audio") {
            alice.audio.records.contains(.audioEnabled(true)) && bob.audio.records.contains(.audioEnabled(true))
        }
        return (alice, bob, call)
    }

    @Test func aFullCall() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await Self.connectedCall(server)

        // CallKit's view of it.
        #expect(alice.provider.records.contains(.startedConnecting(call)))
        #expect(alice.provider.records.contains(.connected(call)))
        #expect(bob.provider.records.first == .incoming(IncomingCallReport(call: call, caller: "alice", callerName: nil, video: false)))
        // Audio: configured in the actions, enabled only once the system activated the session.
        #expect(alice.audio.records == [.configured(video: false), .audioEnabled(true)])
        #expect(bob.audio.records == [.configured(video: false), .audioEnabled(true)])
        // Perfect negotiation: the caller offered, the callee answered; candidates crossed.
        let alicePeer = try #require(alice.peers.connections.first)
        let bobPeer = try #require(bob.peers.connections.first)
        #expect(alicePeer.remote?.type == "answer")
        #expect(bobPeer.remote?.type == "offer")
        try await eventually("candidates arrive") { !bobPeer.candidates.isEmpty && !alicePeer.candidates.isEmpty }

        // Mute travels to the other side.
        let mute = bob.provider.perform { .setMuted($0, call: call, muted: true) }
        try await eventually("mute fulfilled") { bob.provider.outcome(of: mute) == true }
        #expect(bobPeer.muted)
        try await eventually("alice hears of it") { alice.events.contains(.remoteUpdated(call, muted: true, held: nil)) }

        // DTMF: an engine that cannot send it (the GStreamer engine) fails the action at once and
        // sends nothing; one that can (WebRTC's) sends it on the media; nonsense tones are refused.
        let refused = alice.provider.perform { .playDTMF($0, call: call, digits: "12#") }
        try await eventually("DTMF refused by an engine without it") { alice.provider.outcome(of: refused) == false }
        #expect(alicePeer.tonesSent == "")
        alicePeer.sendsDTMF = true
        let dtmf = alice.provider.perform { .playDTMF($0, call: call, digits: "12#") }
        try await eventually("DTMF fulfilled") { alice.provider.outcome(of: dtmf) == true }
        #expect(alicePeer.tonesSent == "12#")
        let badDTMF = alice.provider.perform { .playDTMF($0, call: call, digits: "hello") }
        try await eventually("bad DTMF failed") { alice.provider.outcome(of: badDTMF) == false }

        // Quality is measured while connected.
        try await eventually("a quality report") { alice.events.contains { if case .quality(call, _) = $0 { true } else { false } } }

        let end = alice.provider.perform { .end($0, call: call) }
        try await eventually("bob's call ends") { bob.provider.endReason(of: call) == .remoteEnded }
        #expect(alice.provider.outcome(of: end) == true)
        #expect(alicePeer.closed && bobPeer.closed)
        let record = try await server.http("GET", "/v1/calls", token: server.token("bob")).decode(CallList.self).calls.first
        #expect(record?.reason == .hangup)
        #expect(record?.calleeDevice == "b1")
        #expect(record?.quality?.mos != nil, "the caller reported the call's quality")
        #expect(alice.provider.violations.isEmpty && bob.provider.violations.isEmpty)
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    /// Loss on the path reaches the encoder: the quality loop reads it from the statistics, and
    /// the bitrate controller turns Opus's in-band FEC on and tells it how much to expect.
    @Test func lossOnThePathTurnsForwardErrorCorrectionOn() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await Self.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        try await eventually("a quality report") { alice.events.contains { if case .quality(call, _) = $0 { true } else { false } } }
        #expect(alicePeer.encoding?.fec != true, "a clean path needs no FEC")
        alicePeer.simulatedLossPct = 10
        try await eventually("the encoder is told to protect against the loss") {
            alicePeer.encoding.map { $0.fec && $0.expectedLossPct > 0 } == true
        }
        _ = bob.provider.perform { .end($0, call: call) }
        try await eventually("alice's call ends") { alice.provider.endReason(of: call) == .remoteEnded }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    /// Connected, but nothing arrives (DTLS up, the far side sends nothing, or its packets are
    /// dropped): the SDK says so, rates nothing and restarts ICE; it says so again when packets
    /// come back.
    @Test func aConnectedCallThatReceivesNothingSaysSoAndHasNoMOS() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await Self.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        try await eventually("a quality report") { alice.events.contains { if case .quality(call, _) = $0 { true } else { false } } }
        alicePeer.nothingArrives = true
        // CallManager.Configuration's default: 5 s without a packet.
        try await eventually(timeout: .seconds(10), "alice hears of the silence") { alice.events.contains(.receivingMedia(call, false)) }
        let silentAt = alice.events.count
        try await Task.sleep(for: .milliseconds(500))  // checks that nothing happens: no report rates the silence
        #expect(!alice.events.dropFirst(silentAt).contains { if case .quality(call, _) = $0 { true } else { false } })
        #expect(await alice.phase(call) == .connected, "the call goes on: the far side may come back")
        // The path may be dead while ICE does not know: alice (the caller) restarts ICE.
        try await eventually("an ICE restart offer went out") { alicePeer.offersMade.contains(true) }
        alicePeer.nothingArrives = false
        try await eventually("alice hears packets again") { alice.events.contains(.receivingMedia(call, true)) }
        try await eventually("and rates them") { alice.events.dropFirst(silentAt).contains { if case .quality(call, _) = $0 { true } else { false } } }
        _ = bob.provider.perform { .end($0, call: call) }
        try await eventually("alice's call ends") { alice.provider.endReason(of: call) == .remoteEnded }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    /// A statistics read that fails (the engine gives one up that its pipeline leaves unanswered)
    /// skips an interval; the call's quality loop goes on.
    @Test func failedStatisticsReadsDoNotStopTheQualityReports() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await Self.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        try await eventually("a quality report") { alice.events.contains { if case .quality(call, _) = $0 { true } else { false } } }
        alicePeer.failingStatisticsReads = 3
        try await eventually("the failing reads were made") { alicePeer.failingStatisticsReads == 0 }
        let afterFailures = alice.events.count
        try await eventually(timeout: .seconds(5), "reports go on after the failed reads") {
            alice.events.dropFirst(afterFailures).contains { if case .quality(call, _) = $0 { true } else { false } }
        }
        _ = bob.provider.perform { .end($0, call: call) }
        try await eventually("alice's call ends") { alice.provider.endReason(of: call) == .remoteEnded }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func aCutConnectionResumesAndTheCallSurvivesWithAnICERestart() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await Self.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        await alice.manager.networkChanged()
        try await eventually("an ICE restart offer went out") { alicePeer.offersMade.contains(true) }
        try await eventually("signaling resumed") { await alice.signaling.session?.resumed == true }
        let bobPeer = try #require(bob.peers.connections.first)
        try await eventually("bob took the restart offer") { bobPeer.remote?.sdp.contains("restart") == true }
        #expect(await alice.phase(call) == .connected)
        #expect(await bob.phase(call) == .connected)
        _ = bob.provider.perform { .end($0, call: call) }
        try await eventually("alice's call ends") { alice.provider.endReason(of: call) == .remoteEnded }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func iceThatCannotRecoverEndsTheCallWithAReason() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await Self.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        alicePeer.breakNetwork()
        try await eventually("alice gives up") { alice.provider.endReason(of: call) == .failed }
        try await eventually("bob hears the call ended") { bob.provider.endReason(of: call) == .remoteEnded }
        #expect(alicePeer.offersMade.filter { $0 }.count == 3, "three ICE restarts before giving up")
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func aServerRestartMidCallEndsNothing() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("parley-\(UUID().uuidString).sqlite").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        let server = try await LiveServer.start(databasePath: path)
        let port = server.port
        let (alice, bob, call) = try await Self.connectedCall(server)
        try await server.stop()
        let restarted = try await LiveServer.start(databasePath: path) { $0.port = port }
        // Both reconnect to a server that restored the call; bob's hangup reaches alice through it.
        let end = bob.provider.perform { .end($0, call: call) }
        try await eventually("bob's end action is fulfilled") { bob.provider.outcome(of: end) == true }
        try await eventually("alice hears bob hung up") { await alice.phase(call) == .ended(.hangup) }
        #expect(alice.provider.endReason(of: call) == .remoteEnded)
        let calls = try await restarted.http("GET", "/v1/calls", token: restarted.token("alice")).decode(CallList.self).calls
        #expect(calls.map(\.reason) == [.hangup])
        await alice.stop(); await bob.stop()
        try await restarted.stop()
    }

    @Test func aServerThatLostTheCallEndsItWithServerLostCall() async throws {
        let server = try await LiveServer.start()  // in memory: a restart forgets every call
        let port = server.port
        let (alice, bob, call) = try await Self.connectedCall(server)
        try await server.stop()
        let restarted = try await LiveServer.start { $0.port = port }
        try await eventually("alice ends the lost call") { await alice.phase(call) == .ended(.serverLostCall) }
        try await eventually("bob too") { await bob.phase(call) == .ended(.serverLostCall) }
        #expect(alice.provider.endReason(of: call) == .failed)
        await alice.stop(); await bob.stop()
        try await restarted.stop()
    }

    @Test func aPushForACallAlreadyCancelledIsReportedThenEnded() async throws {
        let server = try await LiveServer.start()
        let alice = SDKDevice(server, user: "alice", device: "a1")
        try await alice.start()
        let (call, _) = alice.call("bob")
        try await eventually("invite sent") { await alice.phase(call) == .ringing }
        _ = alice.provider.perform { .end($0, call: call) }
        try await eventually("cancelled") { await alice.phase(call) == .ended(.hangup) }

        // Bob's phone wakes for the (stale) push.
        let bob = SDKDevice(server, user: "bob", device: "iphone")
        try await bob.start()
        let payload = #"{"parley":{"call":"\#(call.uuidString.lowercased())","from":{"user":"alice","name":"Alice"},"media":{"audio":true,"video":false},"expiresAt":1767225600000}}"#
        let reportedBeforeCompletion = Locked(false)
        await bob.manager.handleVoIPPush(Data(payload.utf8)) {
            reportedBeforeCompletion.set(bob.incomingCall() == call)
        }
        #expect(reportedBeforeCompletion.value, "reported before the push handler completed")
        try await eventually("then ended with the server's reason") { bob.provider.endReason(of: call) == .remoteEnded }
        #expect(await bob.phase(call) == .ended(.cancelled))
        #expect(bob.audio.records.isEmpty, "no audio for a call that never was")
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func aMalformedPushIsStillReportedThenEnded() async throws {
        let server = try await LiveServer.start()
        let bob = SDKDevice(server, user: "bob", device: "iphone")
        let reported = Locked(false)
        await bob.manager.handleVoIPPush(Data("{\"aps\":{}}".utf8)) { reported.set(bob.incomingCall() != nil) }
        #expect(reported.value)
        let placeholder = try #require(bob.incomingCall())
        #expect(bob.provider.endReason(of: placeholder) == .failed)
        try await server.stop()
    }

    @Test func anAnswerFailsWhenAnotherDeviceAnsweredFirst() async throws {
        let server = try await LiveServer.start()
        let alice = SDKDevice(server, user: "alice", device: "a1")
        let phone = SDKDevice(server, user: "bob", device: "phone")
        let laptop = SDKDevice(server, user: "bob", device: "laptop")
        for device in [alice, phone, laptop] { try await device.start() }
        let (call, _) = alice.call("bob")
        try await eventually("both ring") { phone.incomingCall() == call && laptop.incomingCall() == call }
        let first = phone.provider.perform { .answer($0, call: call) }
        try await eventually("the phone answered") { phone.provider.outcome(of: first) == true }
        try await eventually("the laptop stops ringing") { laptop.provider.endReason(of: call) == .answeredElsewhere }
        let late = laptop.provider.perform { .answer($0, call: call) }
        try await eventually("a late answer fails") { laptop.provider.outcome(of: late) == false }
        for device in [alice, phone, laptop] { await device.stop() }
        try await server.stop()
    }

    @Test func callWaitingDeclineBusyThenHoldAndAnswer() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, first) = try await Self.connectedCall(server)
        let carol = SDKDevice(server, user: "carol", device: "c1")
        try await carol.start()
        let bobPeer = try #require(bob.peers.connections.first)
        let audioBefore = bob.audio.records

        // A second call rings during the first: reported, and the first call's audio is untouched.
        let (second, _) = carol.call("bob")
        try await eventually("the second call rings") { bob.incomingCall() == second }
        #expect(bob.audio.records == audioBefore)
        #expect(!bobPeer.held && !bobPeer.muted)
        _ = bob.provider.perform { .end($0, call: second) }
        try await eventually("carol hears busy") { await carol.phase(second) == .ended(.busy) }
        #expect(await bob.phase(first) == .connected)

        // Hold and answer.
        let (third, _) = carol.call("bob")
        try await eventually("the third call rings") { bob.incomingCall() == third }
        let hold = bob.provider.perform { .setHeld($0, call: first, held: true) }
        let answer = bob.provider.perform { .answer($0, call: third) }
        try await eventually("held and answered") { bob.provider.outcome(of: hold) == true && bob.provider.outcome(of: answer) == true }
        #expect(bobPeer.held)
        try await eventually("alice hears the hold") { alice.events.contains(.remoteUpdated(first, muted: nil, held: true)) }
        try await eventually("the third call connects") { await bob.phase(third) == .connected }
        #expect(await bob.phase(first) == .connected)
        for device in [alice, bob, carol] { await device.stop() }
        try await server.stop()
    }

    @Test func audioFollowsTheSystemsActivationsAndAResetEndsEverything() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await Self.connectedCall(server)
        try await eventually("the first activation enabled audio") { bob.audio.isAudioEnabled }
        bob.provider.deliver(.audioSessionDeactivated)   // an interruption, say
        try await eventually("audio stops") { !bob.audio.isAudioEnabled }
        bob.provider.deliver(.audioSessionActivated)
        try await eventually("audio restarts on every activation") { bob.audio.isAudioEnabled }
        #expect(bob.audio.records.filter { $0 == .audioEnabled(true) }.count == 2)

        bob.provider.deliver(.reset)
        try await eventually("alice's call ends") { alice.provider.endReason(of: call) == .remoteEnded }
        #expect(await bob.phase(call)?.isEnded == true)
        #expect(!bob.audio.isAudioEnabled)
        await alice.stop(); await bob.stop()
        try await server.stop()
    }
}

final class Locked<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value { lock.withLock { stored } }
    func set(_ value: Value) { lock.withLock { stored = value } }
}

@Suite("Audio routes and interruptions in a call")
struct CallAudioTests {
    @Test func aCellularCallHoldsTheCallAndItsEndResumesIt() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await CallFlowTests.connectedCall(server)
        let bobPeer = try #require(bob.peers.connections.first)
        await bob.manager.audioInterrupted(.beganByCall)
        #expect(bobPeer.held)
        #expect(!bob.audio.isAudioEnabled)
        try await eventually("alice sees the hold") { alice.events.contains(.remoteUpdated(call, muted: nil, held: true)) }
        await bob.manager.audioInterrupted(.ended(shouldResume: true))
        #expect(!bobPeer.held)
        #expect(bob.audio.isAudioEnabled)
        try await eventually("and the resume") { alice.events.contains(.remoteUpdated(call, muted: nil, held: false)) }

        await bob.manager.audioRouteChanged(.newDeviceAvailable(.bluetooth("Car kit")))
        #expect(bob.audio.records.last == .routed(.bluetooth("Car kit")))
        try await eventually("the UI hears of the route") { bob.events.contains(.route(.bluetooth("Car kit"))) }
        await bob.manager.audioRouteChanged(.oldDeviceUnavailable(.bluetooth("Car kit")))
        #expect(bob.audio.records.last == .routed(.receiver))
        await alice.stop(); await bob.stop()
        try await server.stop()
    }
}

@Suite("Call manager housekeeping")
struct CallManagerHousekeepingTests {
    @Test func endedCallsAreForgottenAfterTheRetention() async throws {
        let server = try await LiveServer.start()
        let alice = SDKDevice(server, user: "alice", device: "a1") { $0.endedCallRetention = .milliseconds(300) }
        try await alice.start()
        let (call, _) = alice.call("bob")
        try await eventually("ringing") { await alice.phase(call) == .ringing }
        _ = alice.provider.perform { .end($0, call: call) }
        try await eventually("ended") { await alice.phase(call)?.isEnded == true }
        try await eventually("forgotten") { await alice.phase(call) == nil }
        await alice.stop()
        try await server.stop()
    }
}
