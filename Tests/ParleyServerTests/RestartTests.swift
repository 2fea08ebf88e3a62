import Foundation
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import Testing

/// Protocol v1, "Restarts and several nodes": a restart, graceful or a crash, ends no call.
@Suite("Restarts: the hub restores unfinished calls")
struct HubRestartTests {
    let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"

    /// alice calls bob, bob answers: an active call on `h`.
    func activeCall(_ h: HubHarness) async -> (TestDevice, TestDevice) {
        let alice = await h.device("alice", "a1", name: "Alice")
        let bob = await h.device("bob", "b1")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = await bob.request { .callAccept(CallRequest(id: $0, call: call)) }
        _ = alice.events()
        _ = bob.events()
        return (alice, bob)
    }

    @Test func anActiveCallGoesOnAfterACrashAndEndsWithTheWholeDuration() async throws {
        let h = try HubHarness()
        _ = await activeCall(h)
        await h.advance(.seconds(10))
        let restarted = try await h.restarted(after: .seconds(3))

        let alice = await restarted.device("alice", "a1")
        let bob = await restarted.device("bob", "b1")
        #expect(alice.welcome?.resumed == false)
        let state = try await alice.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(state.state == .active)
        #expect(await bob.request { .callUpdate(CallUpdate(id: $0, call: call, muted: true)) }.isSuccess, "requests about a restored call work")
        #expect(alice.events().contains { if case .callUpdated(let update) = $0 { update.muted == true } else { false } })

        await restarted.advance(.seconds(5))
        #expect(await bob.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        #expect(alice.events().map(\.endReason) == [.hangup])
        await restarted.hub.flushRecords()
        let records = try await restarted.store.calls(of: "alice", limit: 10)
        #expect(records.count == 1, "one call, not one per server run")
        #expect(records.first?.reason == .hangup)
        #expect(records.first?.duration == 18, "10 s before the crash, 3 s down, 5 s after")
    }

    @Test func aPartyWhoDoesNotComeBackEndsTheCallWithConnectionLostAfterTheResumeWindow() async throws {
        let h = try HubHarness()
        _ = await activeCall(h)
        let restarted = try await h.restarted()
        let alice = await restarted.device("alice", "a1")
        await restarted.advance(.seconds(30))
        #expect(await alice.request { .ping(Ping(id: $0)) }.isSuccess, "alice's heartbeat")
        await restarted.advance(.seconds(29))
        #expect(alice.events().isEmpty, "bob may still come back")
        await restarted.advance(.seconds(1))
        #expect(alice.events().map(\.endReason) == [.connectionLost])
        let bob = await restarted.device("bob", "b1")
        let state = try await bob.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(state.state == .ended)
        #expect(state.reason == .connectionLost)
    }

    @Test func aRingingCallKeepsItsExpiryAndRingsDevicesThatConnect() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1", name: "Alice")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob", metadata: .object(["topic": .string("maths")]))) }
        await h.advance(.seconds(20))
        let restarted = try await h.restarted(after: .seconds(5))

        let aliceAgain = await restarted.device("alice", "a1")
        let bob = await restarted.device("bob", "b1")
        let incoming = bob.events().compactMap { if case .callIncoming(let incoming) = $0 { incoming } else { nil } }
        #expect(incoming.map(\.call) == [call], "the callee's device hears the restored invite")
        #expect(incoming.first?.from.name == "Alice")
        #expect(incoming.first?.metadata == .object(["topic": .string("maths")]))
        await restarted.advance(.seconds(19))
        #expect(aliceAgain.events().isEmpty)
        await restarted.advance(.seconds(1))
        #expect(aliceAgain.events().map(\.endReason) == [.noAnswer], "45 s after the invite, restart or not")
    }

    @Test func theAnsweringDeviceMayAcceptAgainAndNoOtherMay() async throws {
        let h = try HubHarness()
        let alice = await h.device("alice", "a1")
        let bob = await h.device("bob", "b1")
        _ = await h.device("bob", "b2")
        _ = await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = await bob.request { .callAccept(CallRequest(id: $0, call: call)) }
        let restarted = try await h.restarted()
        // After a restart the server has forgotten the request ids it answered: a client that
        // never got its ack re-sends the accept under a session the server has not seen.
        let bobAgain = await restarted.device("bob", "b1")
        #expect(await bobAgain.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        let other = await restarted.device("bob", "b2")
        #expect(await other.request { .callAccept(CallRequest(id: $0, call: call)) }.errorCode == .callAlreadyAnswered)
    }

    @Test func endedCallsAreNotRestored() async throws {
        let h = try HubHarness()
        let (alice, _) = await activeCall(h)
        _ = await alice.request { .callHangup(CallHangup(id: $0, call: call)) }
        let restarted = try await h.restarted()
        let aliceAgain = await restarted.device("alice", "a1")
        #expect(try await restarted.store.unfinishedCalls().isEmpty)
        let state = try await aliceAgain.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(state.state == .ended)
    }
}

@Suite("Restarts: the real server", .timeLimit(.minutes(5)))
struct LiveRestartTests {
    let call: CallID = "0b8a5f3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"

    @Test(arguments: StoreKind.allCases)
    func aGracefulStopClosesWith1001EndsNoCallAndTheNextStartGoesOnWithIt(_ kind: StoreKind) async throws {
        guard TestDatabase.canRun(kind, "restart tests") else { return }
        let database = try await TestDatabase(kind)
        defer { database.close() }
        let path = database.setting
        let server = try await LiveServer.start(databasePath: path)
        let alice = try await server.device("alice", "a1")
        let bob = try await server.device("bob", "b1")
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }
        try await server.stop()
        #expect(await alice.closeCode() == 1001)
        #expect(await bob.closeCode() == 1001)
        for client in [alice, bob] {
            while let frame = try await client.next(timeout: .zero) {
                if case .callEnded = frame.message { Issue.record("a graceful stop ended the call") }
            }
        }

        let restarted = try await LiveServer.start(databasePath: path)
        let aliceAgain = try await restarted.device("alice", "a1")
        let bobAgain = try await restarted.device("bob", "b1")
        let state = try await aliceAgain.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(state.state == .active)
        #expect(try await bobAgain.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        let ended = try await aliceAgain.expect { if case .callEnded(let m) = $0.message { m } else { nil } }
        #expect(ended.reason == .hangup)
        try await restarted.stop()
        let again = try await LiveServer.start(databasePath: path)
        let calls = try await again.http("GET", "/v1/calls", token: again.token("alice")).decode(CallList.self).calls
        #expect(calls.map(\.call) == [call])
        #expect(calls.first?.reason == .hangup)
        #expect(calls.first?.answeredAt != nil)
        try await again.stop()
    }
}
