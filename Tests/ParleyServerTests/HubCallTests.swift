import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

@Suite("Hub: one-to-one calls")
struct HubCallTests {
    let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"

    @Test func inviteRingsEveryDeviceAndFirstAcceptWins() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1", name: "Alice")
        let phone = await h.device("bob", "phone")
        let laptop = await h.device("bob", "laptop")

        let ack = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
        #expect(try ack.decodeResult(CallInviteResult.self).devices == 2)
        for device in [phone, laptop] {
            guard case .callIncoming(let incoming) = device.events().first else { Issue.record("no call.incoming"); return }
            #expect(incoming.from == Party(user: "alice", device: "a1", name: "Alice"))
            #expect(incoming.expiresAt == h.clock.wallNow + 45_000)
        }

        #expect(await phone.request { .callRinging(CallRingingRequest(id: $0, call: call)) }.isSuccess)
        #expect(await laptop.request { .callRinging(CallRingingRequest(id: $0, call: call)) }.isSuccess)
        #expect(alice.events() == [.callRinging(CallRinging(call: call, device: "phone"))], "the caller hears ringing once")

        #expect(await laptop.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        #expect(alice.events() == [.callAccepted(CallAccepted(call: call, device: "laptop"))])
        guard case .callEnded(let ended) = phone.events().first else { Issue.record("phone kept ringing"); return }
        #expect(ended.reason == .answeredElsewhere)

        #expect(await phone.request { .callAccept(CallRequest(id: $0, call: call)) }.errorCode == .callAlreadyAnswered)
    }

    /// Connect while ringing: each device that rings `early` is named to the caller, whose signals
    /// may then name it; its signals reach the caller. Nobody else's do, and none reach a device
    /// that did not ring early; once answered, only the answering device's path is left.
    @Test func devicesThatRingEarlyExchangeSignalsWithTheCallerBeforeTheAnswer() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let aliceTablet = await h.device("alice", "a2")
        let phone = await h.device("bob", "phone")
        let laptop = await h.device("bob", "laptop")
        let desk = await h.device("bob", "desk")
        let mallory = await h.device("mallory", "m1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = (phone.events(), laptop.events(), desk.events(), aliceTablet.events())

        #expect(await desk.request { .callRinging(CallRingingRequest(id: $0, call: call)) }.isSuccess)
        #expect(await phone.request { .callRinging(CallRingingRequest(id: $0, call: call, early: true)) }.isSuccess)
        #expect(await laptop.request { .callRinging(CallRingingRequest(id: $0, call: call, early: true)) }.isSuccess)
        #expect(await phone.request { .callRinging(CallRingingRequest(id: $0, call: call, early: true)) }.isSuccess)
        #expect(alice.events() == [.callRinging(CallRinging(call: call, device: "desk")),
                                   .callRinging(CallRinging(call: call, device: "phone", early: true)),
                                   .callRinging(CallRinging(call: call, device: "laptop", early: true))],
                "ringing once, then once for each device that rings early")

        let offer = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0"))
        let answer = SignalPayload(description: SessionDescription(type: "answer", sdp: "v=0"))
        #expect(await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer, device: "phone")) }.isSuccess)
        #expect(phone.events() == [.callSignal(CallSignalled(call: call, from: Party(user: "alice", device: "a1"), signal: offer))])
        #expect(laptop.events().isEmpty && desk.events().isEmpty, "a signal reaches the device it names")
        #expect(await phone.request { .callSignal(CallSignal(id: $0, call: call, signal: answer)) }.isSuccess)
        #expect(alice.events() == [.callSignal(CallSignalled(call: call, from: Party(user: "bob", device: "phone"), signal: answer))])

        // Not before the answer: a device that did not ring early, no device named, another caller
        // device, an outsider; and no `call.update`.
        #expect(await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer, device: "desk")) }.errorCode == .callNotConnected)
        #expect(await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer)) }.errorCode == .callNotConnected)
        #expect(await desk.request { .callSignal(CallSignal(id: $0, call: call, signal: answer)) }.errorCode == .callNotConnected)
        #expect(await aliceTablet.request { .callSignal(CallSignal(id: $0, call: call, signal: offer, device: "phone")) }.errorCode == .callNotConnected)
        #expect(await mallory.request { .callSignal(CallSignal(id: $0, call: call, signal: offer, device: "phone")) }.errorCode == .callNotFound)
        #expect(await phone.request { .callUpdate(CallUpdate(id: $0, call: call, muted: true)) }.errorCode == .callNotConnected)
        #expect(phone.events().isEmpty && alice.events().isEmpty && desk.events().isEmpty)

        // The laptop answers: its path is the call's; the phone's is over.
        #expect(await laptop.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        #expect(phone.events().map(\.endReason) == [.answeredElsewhere])
        _ = alice.events()
        #expect(await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer, device: "phone")) }.errorCode == .callAlreadyAnswered)
        #expect(await phone.request { .callSignal(CallSignal(id: $0, call: call, signal: answer)) }.errorCode == .forbidden)
        #expect(await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer, device: "laptop")) }.isSuccess)
        #expect(await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer)) }.isSuccess)
        #expect(laptop.events().count == 2)
    }

    /// A restarted server has forgotten request ids: an invite re-sent under its old id is a new
    /// request to it. From the device that made the call it is acknowledged again and rings no one;
    /// once the call ended it says so; from anyone else the call id is taken.
    @Test func theSameInviteAgainIsAcknowledgedAndRingsNoOne() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let laptop = await h.device("alice", "a2")
        let bob = await h.device("bob", "b1")
        let first = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
        #expect(bob.events().count == 1)
        let again = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
        #expect(again.result == first.result, "answered as the first was")
        #expect(bob.events().isEmpty, "nobody is rung twice")
        #expect(await laptop.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.errorCode == .badRequest)
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "carol")) }.errorCode == .badRequest)
        #expect(await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.errorCode == .callEnded)
    }

    /// PostgreSQL stores U+0000 in neither `TEXT` nor `JSONB`: metadata holding one is refused on
    /// every store, and rings no one (on PostgreSQL it could not be stored, and its batch would fail).
    @Test func metadataHoldingNULIsRefused() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        for metadata: JSONValue in [.string("a\u{0}b"), .array([.object(["topic": .string("\u{0}")])]), .object(["k\u{0}": .null])] {
            let refused = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob", metadata: metadata)) }
            #expect(refused.errorCode == .badRequest, "\(metadata)")
        }
        #expect(bob.events().isEmpty)
        let fine: JSONValue = .object(["topic": .string("taxes \u{1}"), "n": .number(0)])
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob", metadata: fine)) }.isSuccess)
    }

    @Test func declineBusyEndsTheCallEverywhere() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let phone = await h.device("bob", "phone")
        let laptop = await h.device("bob", "laptop")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = (phone.events(), laptop.events())

        #expect(await phone.request { .callDecline(CallDecline(id: $0, call: call, reason: .busy)) }.isSuccess)
        #expect(alice.events().map(\.endReason) == [.busy])
        #expect(laptop.events().map(\.endReason) == [.declinedElsewhere])
        #expect(await laptop.request { .callAccept(CallRequest(id: $0, call: call)) }.errorCode == .callEnded)
        await h.hub.flushRecords()
        #expect(try await h.store.call(call)?.reason == .busy)
    }

    @Test func hangupBeforeAcceptCancelsOrDeclines() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = bob.events()
        #expect(await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        #expect(bob.events().map(\.endReason) == [.cancelled])

        let second: CallID = "0b8a5f3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: second, to: "bob")) }
        _ = bob.events()
        #expect(await bob.request { .callHangup(CallHangup(id: $0, call: second, reason: "in a meeting")) }.isSuccess)
        guard case .callEnded(let ended) = alice.events().first else { Issue.record("caller not told"); return }
        #expect(ended.reason == .declined)
        #expect(ended.detail == "in a meeting")
    }

    @Test func ringTimeoutEndsWithNoAnswer() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = bob.events()
        await h.advance(.seconds(44))
        #expect(alice.events().isEmpty)
        await h.advance(.seconds(1))
        #expect(alice.events().map(\.endReason) == [.noAnswer])
        #expect(bob.events().map(\.endReason) == [.noAnswer])
        let result = try await alice.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(result.state == .ended)
        #expect(result.reason == .noAnswer)
    }

    @Test func signalsFlowOnlyBetweenThePartiesOfAnAcceptedCall() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        let mallory = await h.device("mallory", "m1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = bob.events()
        let offer = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0\r\n"))
        #expect(await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer)) }.errorCode == .callNotConnected)

        _ = await bob.request { .callAccept(CallRequest(id: $0, call: call)) }
        _ = alice.events()
        #expect(await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer)) }.isSuccess)
        #expect(bob.events() == [.callSignal(CallSignalled(call: call, from: Party(user: "alice", device: "a1"), signal: offer))])
        let end = SignalPayload(candidate: .endOfCandidates)
        #expect(await bob.request { .callSignal(CallSignal(id: $0, call: call, signal: end)) }.isSuccess)
        #expect(alice.events() == [.callSignal(CallSignalled(call: call, from: Party(user: "bob", device: "b1"), signal: end))])
        #expect(await bob.request { .callUpdate(CallUpdate(id: $0, call: call, muted: true)) }.isSuccess)
        #expect(alice.events() == [.callUpdated(CallUpdated(call: call, from: Party(user: "bob", device: "b1"), muted: true))])

        // An outsider learns nothing and changes nothing.
        #expect(await mallory.request { .callSignal(CallSignal(id: $0, call: call, signal: offer)) }.errorCode == .callNotFound)
        #expect(await mallory.request { .callHangup(CallHangup(id: $0, call: call)) }.errorCode == .callNotFound)
        #expect(await mallory.request { .callAccept(CallRequest(id: $0, call: call)) }.errorCode == .callNotFound)
        #expect(await mallory.request { .callState(CallRequest(id: $0, call: call)) }.errorCode == .callNotFound)
        #expect(await mallory.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.errorCode == .callNotFound)
        #expect(alice.events().isEmpty && bob.events().isEmpty)
        #expect(try await alice.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self).state == .active)
    }

    @Test func hangupRecordsDurationAndReportIsStored() async throws {
        let h = try HubHarness { $0.heartbeat = 3600 }
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob", media: MediaSpec(audio: true, video: true))) }
        await h.advance(.seconds(3))
        _ = await bob.request { .callAccept(CallRequest(id: $0, call: call)) }
        await h.advance(.seconds(30))
        _ = await alice.request { .ping(Ping(id: $0)) }
        await h.advance(.seconds(27))
        _ = (alice.events(), bob.events())
        #expect(await bob.request { .callHangup(CallHangup(id: $0, call: call, reason: "bye")) }.isSuccess)
        guard case .callEnded(let ended) = alice.events().first else { Issue.record("no call.ended"); return }
        #expect(ended.reason == .hangup)
        #expect(ended.detail == "bye")
        #expect(ended.duration == 57)
        #expect(await bob.request { .callHangup(CallHangup(id: $0, call: call)) }.errorCode == .callEnded)

        await h.advance(.seconds(30))
        let quality = CallQuality(mos: 4.3, rttMs: 12, jitterMs: 3, lossPct: 0.1, bitrateKbps: 32)
        // Only its parties report on a call: to anyone else there is no such call.
        let mallory = await h.device("mallory", "m1")
        let forged = CallQuality(mos: 1, rttMs: 900, jitterMs: 300, lossPct: 40, bitrateKbps: 1)
        #expect(await mallory.request { .callReport(CallReport(id: $0, call: call, quality: forged)) }.errorCode == .callNotFound)
        #expect(await alice.request { .callReport(CallReport(id: $0, call: call, quality: quality)) }.isSuccess)
        await h.hub.flushRecords()
        let record = try #require(try await h.store.calls(of: "bob", limit: 10).first)
        #expect(record.call == call)
        #expect(record.calleeDevice == "b1")
        #expect(record.answeredAt == h.clock.wallOrigin + 3000)
        #expect(record.duration == 57)
        #expect(record.reason == .hangup)
        #expect(record.quality == quality)
        #expect(record.media == MediaSpec(audio: true, video: true))

        // Still answerable after the hub forgets the call: the record speaks.
        await h.advance(.seconds(200))
        #expect(await alice.request { .callReport(CallReport(id: $0, call: call, quality: quality)) }.errorCode == .callEnded)
        #expect(await mallory.request { .callReport(CallReport(id: $0, call: call, quality: forged)) }.errorCode == .callNotFound,
                "the stored record is no more anyone's")
        #expect(try await bob.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self).reason == .hangup)
    }

    @Test func aRepeatedRequestIDIsAnsweredAgainAndNotExecutedTwice() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        #expect(await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        _ = (alice.events(), bob.events())
        // A signal, which each run relays (an invite run again answers as the first did and rings no one).
        let signal = ClientMessage.callSignal(CallSignal(id: "same", call: call, signal: SignalPayload(restartIce: true)))
        await alice.send(signal)
        await alice.send(signal)
        let answers = alice.sink.take()
        #expect(answers.count == 2)
        #expect(answers[0].message == answers[1].message)
        #expect(answers[1].seq == answers[0].seq! + 1)
        #expect(bob.events().filter { if case .callSignal = $0 { true } else { false } }.count == 1, "relayed once")
    }

    @Test func aDeviceThatConnectsLateGetsTheRingingInvite() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        let bob = await h.device("bob", "woken-by-push")
        guard case .callIncoming(let incoming) = bob.events().first else { Issue.record("no call.incoming on connect"); return }
        #expect(incoming.call == call)
        #expect(await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
    }

    @Test func aSessionThatDoesNotComeBackLosesItsCall() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = await bob.request { .callAccept(CallRequest(id: $0, call: call)) }
        _ = alice.events()
        await bob.disconnect()
        await h.advance(.seconds(30))
        #expect(await alice.request { .ping(Ping(id: $0)) }.isSuccess)
        await h.advance(.seconds(29))
        #expect(alice.events().isEmpty, "held for resume")
        await h.advance(.seconds(1))
        #expect(alice.events().map(\.endReason) == [.connectionLost])
        await h.hub.flushRecords()
        #expect(try await h.store.call(call)?.reason == .connectionLost)
    }

    @Test func shutdownClosesWith1001AndEndsNoCall() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = bob.events()
        await h.hub.shutdown()
        #expect(alice.events().isEmpty)
        #expect(bob.events().isEmpty)
        #expect(alice.sink.closeCode == .goingAway)
        await h.hub.flushRecords()
        #expect(try await h.store.unfinishedCalls().map(\.record.call) == [call], "kept for the next start")
    }

    @Test func aUserCannotCallThemselvesOrReuseACallID() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "alice")) }.errorCode == .badRequest)
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
        #expect(await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "carol")) }.errorCode == .badRequest)
    }
}

extension ServerMessage {
    var endReason: EndReason? {
        if case .callEnded(let ended) = self { return ended.reason }
        return nil
    }

    /// The request an answer answers.
    var requestID: String? {
        switch self {
        case .ack(let ack): ack.re
        case .error(let error): error.re
        case .welcome(let welcome): welcome.re
        default: nil
        }
    }
}
