import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

/// Protocol v1, "Recording with consent": nothing is recorded until the party that did not ask
/// agreed, both hear of every step, either stops it, and the call record says who consented when.
@Suite("Hub: recording with consent")
struct HubRecordingTests {
    let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"

    /// alice calls bob on b1 (bob also has b2, which rang), bob answers; mallory is online.
    func activeCall(_ h: HubHarness) async -> (alice: TestDevice, bob: TestDevice, other: TestDevice) {
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        let other = await h.device("bob", "b2")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = await bob.request { .callAccept(CallRequest(id: $0, call: call)) }
        _ = (alice.events(), bob.events(), other.events())
        return (alice, bob, other)
    }

    func step(_ device: TestDevice, _ step: RecordingStep) async -> Result<Ack, ErrorMessage> {
        await device.request { .callUpdate(CallUpdate(id: $0, call: call, recording: step)) }
    }

    func state(_ result: Result<Ack, ErrorMessage>) throws -> RecordingState {
        try result.get().decodeResult(RecordingStepResult.self).recording
    }

    func told(_ device: TestDevice) -> [RecordingStep] {
        device.events().compactMap { if case .callUpdated(let update) = $0 { update.recording } else { nil } }
    }

    @Test func recordingGoesOnOnlyWithTheOtherPartysConsentAndTheRecordSaysWho() async throws {
        let h = try HubHarness()
        let (alice, bob, other) = await activeCall(h)

        #expect(try state(await step(alice, .requested)) == .requested)
        #expect(told(bob) == [.requested])
        #expect(await step(alice, .accepted).errorCode == .recordingState, "nobody consents to their own request")
        #expect(await step(alice, .requested).errorCode == .recordingState, "one request at a time")
        #expect(await step(other, .accepted).errorCode == .forbidden, "a device of bob's that is not in the call")
        await h.hub.flushRecords()
        #expect(try await h.store.call(call)?.recordings == nil, "a request records nothing")

        await h.advance(.seconds(4))
        #expect(try state(await step(bob, .accepted)) == .on)
        #expect(told(alice) == [.accepted], "the one who asked hears it is on")
        await h.advance(.seconds(6))
        #expect(try state(await step(bob, .stopped)) == .off, "the one who agreed may stop it")
        #expect(told(alice) == [.stopped])
        #expect(await step(alice, .stopped).errorCode == .recordingState, "nothing left to stop")
        #expect(other.events().isEmpty, "a device outside the call hears nothing")

        await h.hub.flushRecords()
        let stretches = try #require(try await h.store.call(call)?.recordings)
        #expect(stretches.count == 1)
        #expect(stretches.first?.requestedBy == Party(user: "alice", device: "a1"))
        #expect(stretches.first?.consentedBy == Party(user: "bob", device: "b1"))
        #expect(stretches.first?.stoppedBy == Party(user: "bob", device: "b1"))
        let stretch = try #require(stretches.first)
        #expect(stretch.endedAt.map { $0 - stretch.startedAt } == 6_000, "from consent to stop")
    }

    @Test func aDeclinedRequestRecordsNothingAndAWithdrawnOneCanBeAskedAgain() async throws {
        let h = try HubHarness()
        let (alice, bob, _) = await activeCall(h)
        _ = await step(bob, .requested)
        _ = told(alice)
        #expect(try state(await step(alice, .declined)) == .off)
        #expect(told(bob) == [.declined])
        #expect(await step(alice, .accepted).errorCode == .recordingState, "no consent after a refusal")

        _ = await step(bob, .requested)
        let pending = try await alice.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(pending.recording == .requested)
        #expect(try state(await step(bob, .stopped)) == .off, "the asker withdraws")
        #expect(told(alice) == [.requested, .stopped])
        #expect(try state(await step(alice, .requested)) == .requested, "and either may ask again")
        await h.hub.flushRecords()
        #expect(try await h.store.call(call)?.recordings == nil)
    }

    @Test func theCallsEndEndsTheRecordingInTheRecord() async throws {
        let h = try HubHarness()
        let (alice, bob, _) = await activeCall(h)
        _ = await step(alice, .requested)
        _ = await step(bob, .accepted)
        await h.advance(.seconds(5))
        let hungUpAt = h.clock.wallNow
        #expect(await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        #expect(await step(bob, .stopped).errorCode == .callEnded)
        await h.advance(.seconds(3))
        await h.hub.flushRecords()
        let stretch = try #require(try await h.store.call(call)?.recordings?.first)
        #expect(stretch.endedAt == hungUpAt, "ended with the call, not when it was written")
        #expect(stretch.endedAt.map { $0 - stretch.startedAt } == 5_000, "after the five seconds recorded")
        #expect(stretch.stoppedBy == nil)
        let listed = try #require(try await h.store.calls(of: "bob", limit: 5).first)
        #expect(listed.recordings?.count == 1, "GET /v1/calls lists it")
    }

    @Test func outsidersAndUnansweredCallsAreRefused() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        _ = await h.device("bob", "b1")
        let mallory = await h.device("mallory", "m1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        #expect(await step(alice, .requested).errorCode == .callNotConnected, "nothing to record before an answer")
        #expect(await step(mallory, .requested).errorCode == .callNotFound, "another user's call id")
        let mixed = await alice.request { .callUpdate(CallUpdate(id: $0, call: call, muted: true, recording: .requested)) }
        #expect(mixed.errorCode == .badRequest, "a recording step goes on its own")
        let mixedByOutsider = await mallory.request { .callUpdate(CallUpdate(id: $0, call: call, muted: true, recording: .requested)) }
        #expect(mixedByOutsider.errorCode == .callNotFound, "an outsider learns nothing, malformed or not")
    }

    @Test func aRecordingInProgressOutlivesARestart() async throws {
        let h = try HubHarness()
        let (alice, bob, _) = await activeCall(h)
        _ = await step(alice, .requested)
        _ = await step(bob, .accepted)
        let restarted = try await h.restarted(after: .seconds(2))
        let alice2 = await restarted.device("alice", "a1")
        let bob2 = await restarted.device("bob", "b1")
        _ = (alice, bob2)
        let asked = try await bob2.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(asked.recording == .on, "call.state says so to a client that lost its session")
        #expect(try state(await step(alice2, .stopped)) == .off, "still on after the restart: it can be stopped")
        #expect(told(bob2) == [.stopped])
        await restarted.hub.flushRecords()
        #expect(try await restarted.store.call(call)?.recordings?.first?.stoppedBy == Party(user: "alice", device: "a1"))
    }
}
