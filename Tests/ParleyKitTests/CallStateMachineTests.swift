import Foundation
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import Testing

@Suite("Client call state machine")
struct ClientCallStateMachineTests {
    let id: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"

    @Test func theAnswerActionWaitsForTheServerAndThePeerConnection() {
        var (call, actions) = CallStateMachine.incoming(id, from: "alice", name: "Alice", media: .audioOnly, alreadyReported: false)
        #expect(actions == [.reportIncoming])
        let answer = ProviderActionID()
        let step1 = call.answer(answer)
        #expect(step1 == [.configureAudio, .sendAccept, .makePeerConnection(polite: true)])
        let step2 = call.peerConnectionReady()
        #expect(step2 == [], "not before the server took the accept")
        let step3 = call.acceptAcknowledged()
        #expect(step3 == [.fulfill(answer)])
        #expect(call.phase == .connecting)
        let step4 = call.mediaConnected()
        #expect(step4 == [], "CallKit learns of an incoming call's connection through the answer action")
        #expect(call.phase == .connected)
    }

    /// Connecting while ringing, as a callee: the connection is made on the invite and holds its
    /// media; an answer that finds it connected is connected at once and starts media only once the
    /// server took the accept. One that failed while ringing leaves the call ringing, and the
    /// answer makes another, held as well.
    @Test func aCalleeConnectsWhileRingingAndStartsMediaOnlyOnceTheAcceptIsTaken() {
        var (call, _) = CallStateMachine.incoming(id, from: "alice", name: nil, media: .audioOnly, alreadyReported: false,
                                                  connectWhileRinging: true)
        #expect(call.signalingInviteArrived() == [.sendRinging(early: true), .makePeerConnection(polite: true, early: true)])
        #expect(call.signalingInviteArrived() == [.sendRinging(early: true)], "one connection, however often the invite comes")
        _ = call.peerConnectionReady()
        #expect(call.mediaConnected() == [] && call.phase == .ringing)
        let answer = ProviderActionID()
        #expect(call.answer(answer) == [.configureAudio, .sendAccept])
        #expect(call.acceptAcknowledged() == [.fulfill(answer), .startMedia])
        #expect(call.phase == .connected, "its path was ready")

        var (failing, _) = CallStateMachine.incoming(id, from: "alice", name: nil, media: .audioOnly, alreadyReported: false,
                                                     connectWhileRinging: true)
        _ = failing.signalingInviteArrived()
        _ = failing.peerConnectionReady()
        #expect(failing.mediaFailed("ice-failed") == [.closePeerConnection])
        #expect(failing.phase == .ringing, "a path that failed while ringing does not decline the call")
        #expect(failing.answer(answer) == [.configureAudio, .sendAccept, .makePeerConnection(polite: true, early: true)])
        #expect(failing.acceptAcknowledged() == [])
        #expect(failing.peerConnectionReady() == [.fulfill(answer), .startMedia])
        #expect(failing.phase == .connecting)
    }

    @Test func anAnswerThatCannotJoinFails() {
        var (call, _) = CallStateMachine.incoming(id, from: "alice", name: nil, media: .audioOnly, alreadyReported: true)
        let answer = ProviderActionID()
        _ = call.answer(answer)
        let step5 = call.acceptFailed(.callAlreadyAnswered)
        #expect(step5 == [.fail(answer), .closePeerConnection, .reportEnded(.answeredElsewhere)])
        #expect(call.phase == .ended(.answeredElsewhere))
    }

    @Test func audioIsConfiguredOnlyInStartAndAnswerActions() {
        let start = ProviderActionID()
        var (call, actions) = CallStateMachine.outgoing(id, to: "bob", media: .audioOnly, action: start)
        #expect(actions == [.configureAudio, .sendInvite])
        let step6 = call.inviteAcknowledged()
        #expect(step6 == [.fulfill(start), .reportStartedConnecting])
        let all = call.remoteAccepted() + call.mediaConnected() + call.setMuted(true, action: ProviderActionID())
            + call.remoteEnded(.hangup)
        #expect(!all.contains(.configureAudio))
        #expect(all.contains(.reportConnected))
        #expect(all.last == .reportEnded(.remoteEnded))
    }

    @Test func decliningWhileAnotherCallIsInProgressIsBusy() {
        var (call, _) = CallStateMachine.incoming(id, from: "carol", name: nil, media: .audioOnly, alreadyReported: false)
        let end = ProviderActionID()
        let step7 = call.end(end, anotherCallActive: true)
        #expect(step7 == [.sendDecline(.busy), .closePeerConnection, .fulfill(end)])
        var (quiet, _) = CallStateMachine.incoming(id, from: "carol", name: nil, media: .audioOnly, alreadyReported: false)
        #expect(quiet.end(end, anotherCallActive: false).first == .sendDecline(.declined))
    }

    @Test func serverReasonsMapToCallKitReasons() {
        #expect(CallStateMachine.systemReason(.noAnswer, direction: .outgoing) == .unanswered)
        #expect(CallStateMachine.systemReason(.answeredElsewhere, direction: .incoming) == .answeredElsewhere)
        #expect(CallStateMachine.systemReason(.declinedElsewhere, direction: .incoming) == .declinedElsewhere)
        #expect(CallStateMachine.systemReason(.cancelled, direction: .incoming) == .remoteEnded)
        #expect(CallStateMachine.systemReason(.connectionLost, direction: .incoming) == .failed)
        #expect(CallStateMachine.systemReason(.serverShutdown, direction: .outgoing) == .failed)
    }

    @Test func holdAndMuteNeedACall() {
        var (call, _) = CallStateMachine.incoming(id, from: "alice", name: nil, media: .audioOnly, alreadyReported: false)
        let hold = ProviderActionID()
        let step8 = call.setHeld(true, action: hold)
        #expect(step8 == [.fail(hold)], "nothing to hold while ringing")
        _ = call.answer(ProviderActionID())
        _ = call.acceptAcknowledged()
        _ = call.peerConnectionReady()
        let step9 = call.setHeld(true, action: hold)
        #expect(step9 == [.setPeerHeld(true), .sendUpdate(muted: nil, held: true), .fulfill(hold)])
        #expect(call.held)
    }
}
