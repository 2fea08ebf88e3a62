import Foundation
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

@Suite("Recording with consent: the rules on this device")
struct RecordingConsentTests {
    @Test func theRecorderStartsOnlyOnTheOtherPartysConsent() throws {
        var asker = RecordingConsent()
        #expect(try asker.request() == [.send(.requested), .notify(.asking, .requestedHere)])
        #expect(throws: RecordingConsent.Refusal.self) { try asker.request() }
        #expect(throws: RecordingConsent.Refusal.self) { try asker.answer(consent: true) }
        #expect(asker.remote(.declined) == [.notify(.off, .declinedThere)], "declined: no recorder")
        _ = try asker.request()
        #expect(asker.remote(.accepted) == [.startRecorder, .notify(.on(here: true), .acceptedThere)])
        #expect(asker.remote(.accepted) == [], "a repeated step changes nothing")
        #expect(asker.remote(.stopped) == [.stopRecorder, .notify(.off, .stoppedThere)])
        // The recording side stops it itself: its recorder stops too.
        _ = try asker.request()
        _ = asker.remote(.accepted)
        #expect(try asker.stop() == [.send(.stopped), .stopRecorder, .notify(.off, .stoppedHere)])
    }

    @Test func theAskedSideAnswersAndNeverRecords() throws {
        var asked = RecordingConsent()
        #expect(throws: RecordingConsent.Refusal.self) { try asked.answer(consent: true) }
        #expect(asked.remote(.requested) == [.notify(.asked, .requestedThere)])
        #expect(try asked.answer(consent: true) == [.send(.accepted), .notify(.on(here: false), .acceptedHere)])
        #expect(try asked.stop() == [.send(.stopped), .notify(.off, .stoppedHere)], "stops without a recorder of its own")
        #expect(asked.remote(.requested) == [.notify(.asked, .requestedThere)])
        #expect(try asked.answer(consent: false) == [.send(.declined), .notify(.off, .declinedHere)])
    }

    @Test func theCallsEndAndRefusalsStopEverything() throws {
        var consent = RecordingConsent()
        _ = try consent.request()
        _ = consent.remote(.accepted)
        #expect(consent.callEnded() == [.stopRecorder, .notify(.off, .callEnded)])
        #expect(consent.callEnded() == [])
        _ = try consent.request()
        #expect(consent.refused(.requested, message: "no") == [.notify(.off, .failed("no"))])
        _ = try consent.request()
        _ = consent.remote(.accepted)
        #expect(consent.recorderFailed("disk full") == [.send(.stopped), .notify(.off, .failed("disk full"))],
                "a recorder that cannot start stops it for the other side too")
    }

    @Test func aRestartedServerThatForgotARequestEndsItHere() throws {
        var asker = RecordingConsent()
        _ = try asker.request()
        #expect(asker.server(.requested) == [], "still asked for")
        #expect(asker.server(.off) == [.notify(.off, .failed("the server no longer has the request"))])
        _ = try asker.request()
        _ = asker.remote(.accepted)
        #expect(asker.server(.on) == [], "kept across the restart")
        #expect(asker.server(.off) == [.stopRecorder, .notify(.off, .failed("the server no longer has the recording"))])
    }

    @Test func bothAskingAtOnceLeavesOneRequest() throws {
        var consent = RecordingConsent()
        _ = try consent.request()
        // The far side's request reached the server first; ours is refused.
        #expect(consent.remote(.requested) == [.notify(.asked, .requestedThere)])
        #expect(consent.refused(.requested, message: "recording was already requested") == [])
        #expect(consent.state == .asked)
    }
}

@Suite("Recording with consent through the real server")
struct RecordingFlowTests {
    @Test func aRecordingNeedsConsentAndStopsWithEitherSide() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await CallFlowTests.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        let bobPeer = try #require(bob.peers.connections.first)

        // Refused: nothing recorded, alice told.
        try await alice.manager.requestRecording(call, to: "/tmp/never.ogg")
        try await eventually("bob is asked") { bob.events.contains(.recording(call, .asked, .requestedThere)) }
        #expect(alicePeer.recordingPath == nil, "nothing before consent")
        try await bob.manager.answerRecording(call, consent: false)
        try await eventually("alice hears no") { alice.events.contains(.recording(call, .off, .declinedThere)) }
        #expect(alicePeer.recordings.isEmpty && bobPeer.recordings.isEmpty)

        // Agreed: alice's engine records, bob's does not; bob stops it.
        try await alice.manager.requestRecording(call, to: "/tmp/call.ogg", layout: .twoChannels)
        try await eventually("bob is asked again") { await bob.manager.recordingState(of: call) == .asked }
        try await bob.manager.answerRecording(call, consent: true)
        try await eventually("alice records") { alicePeer.recordingPath == "/tmp/call.ogg" }
        #expect(bobPeer.recordingPath == nil, "only the asker records")
        #expect(await bob.manager.recordingState(of: call) == .on(here: false))
        try await bob.manager.stopRecording(call)
        try await eventually("alice's recorder stops") { alicePeer.recordingPath == nil }
        try await eventually("alice has the file") {
            alice.events.contains { if case .recorded(call, let file) = $0 { file.path == "/tmp/call.ogg" && file.layout == .twoChannels } else { false } }
        }

        // Agreed again, then the call ends: the recorder stops with it.
        try await bob.manager.requestRecording(call, to: "/tmp/bob.ogg")
        try await eventually("alice is asked") { await alice.manager.recordingState(of: call) == .asked }
        try await alice.manager.answerRecording(call, consent: true)
        try await eventually("bob records") { bobPeer.recordingPath == "/tmp/bob.ogg" }
        let end = alice.provider.perform { .end($0, call: call) }
        try await eventually("the call ends") { alice.provider.outcome(of: end) == true }
        try await eventually("bob's recorder stops") { bobPeer.recordings.count == 1 }
        #expect(bobPeer.recordingPath == nil)

        let record = try await server.http("GET", "/v1/calls", token: server.token("alice")).decode(CallList.self).calls.first
        let stretches = try #require(record?.recordings)
        #expect(stretches.map(\.consentedBy.user) == ["bob", "alice"])
        #expect(stretches.map(\.stoppedBy?.user) == ["bob", nil])
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    /// The actor takes other events while the recorder starts: a stop that comes then must still
    /// stop it, not leave it recording after consent was withdrawn.
    @Test func aStopWhileTheRecorderStartsStopsIt() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await CallFlowTests.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        alicePeer.recordingStartDelay = .milliseconds(500)
        try await alice.manager.requestRecording(call, to: "/tmp/slow.ogg")
        try await eventually("bob is asked") { await bob.manager.recordingState(of: call) == .asked }
        try await bob.manager.answerRecording(call, consent: true)
        try await eventually("alice hears yes") { await alice.manager.recordingState(of: call) == .on(here: true) }
        try await bob.manager.stopRecording(call)
        try await eventually("alice's recorder stopped after it started") { alicePeer.recordings.count == 1 }
        #expect(alicePeer.recordingPath == nil)
        #expect(await alice.manager.recordingState(of: call) == .off)
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func anEngineThatCannotRecordAsksNobody() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await CallFlowTests.connectedCall(server)
        let alicePeer = try #require(alice.peers.connections.first)
        alicePeer.canRecordCalls = false
        await #expect(throws: RecordingConsent.Refusal.cannotRecord) { try await alice.manager.requestRecording(call, to: "/tmp/x.ogg") }
        try await Task.sleep(for: .milliseconds(200))
        #expect(await bob.manager.recordingState(of: call) == .off, "bob was not asked")
        #expect(await alice.manager.recordingState(of: call) == .off)
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func nothingToRecordBeforeTheCallIsAnswered() async throws {
        let server = try await LiveServer.start()
        let alice = SDKDevice(server, user: "alice", device: "a1")
        try await alice.start()
        let (call, _) = alice.call("bob")
        // Dialing, the start action fulfilled by the invite's acknowledgement (CallKit's rule).
        try await eventually("dialing") { await alice.phase(call) != nil && alice.provider.openActions.isEmpty }
        await #expect(throws: RecordingConsent.Refusal.notConnected) { try await alice.manager.requestRecording(call, to: "/tmp/x.ogg") }
        await #expect(throws: RecordingConsent.Refusal.noSuchCall) { try await alice.manager.requestRecording(UUID(), to: "/tmp/x.ogg") }
        await alice.stop()
        try await server.stop()
    }
}
