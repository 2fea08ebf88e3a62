import Foundation
import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

/// The real server on a loopback port, driven by real WebSocket clients.
@Suite("Live server over WebSocket", .timeLimit(.minutes(5)))
struct LiveServerTests {
    let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"

    @Test func aCallRingsTwoDevicesAndTheSecondHearsAnsweredElsewhere() async throws {
        let server = try await LiveServer.start()
        let alice = try await server.device("alice", "a1", name: "Alice")
        let phone = try await server.device("bob", "phone")
        let laptop = try await server.device("bob", "laptop")

        #expect(try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
        for device in [phone, laptop] {
            let incoming = try await device.expect { if case .callIncoming(let m) = $0.message { m } else { nil } }
            #expect(incoming.from.name == "Alice")
        }
        #expect(try await laptop.request { .callRinging(CallRingingRequest(id: $0, call: call)) }.isSuccess)
        _ = try await alice.expect { if case .callRinging = $0.message { true } else { nil } }
        #expect(try await laptop.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        let accepted = try await alice.expect { if case .callAccepted(let m) = $0.message { m } else { nil } }
        #expect(accepted.device == "laptop")
        let elsewhere = try await phone.expect { if case .callEnded(let m) = $0.message { m } else { nil } }
        #expect(elsewhere.reason == .answeredElsewhere)

        let offer = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\n"))
        #expect(try await alice.request { .callSignal(CallSignal(id: $0, call: call, signal: offer)) }.isSuccess)
        let relayed = try await laptop.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
        #expect(relayed.signal == offer)
        #expect(relayed.from == Party(user: "alice", device: "a1"))
        let candidate = SignalPayload(candidate: .candidate(IceCandidate(candidate: "candidate:1 1 udp 2122260223 127.0.0.1 5000 typ host", sdpMid: "0", sdpMLineIndex: 0)))
        #expect(try await laptop.request { .callSignal(CallSignal(id: $0, call: call, signal: candidate)) }.isSuccess)
        #expect(try await alice.expect { if case .callSignal(let m) = $0.message { m } else { nil } }.signal == candidate)

        #expect(try await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        let ended = try await laptop.expect { if case .callEnded(let m) = $0.message { m } else { nil } }
        #expect(ended.reason == .hangup)
        #expect(ended.duration != nil)

        let history = try await server.http("GET", "/v1/calls", token: server.token("bob")).decode(CallList.self)
        #expect(history.calls.map(\.call) == [call])
        #expect(history.calls.first?.calleeDevice == "laptop")
        #expect(history.calls.first?.reason == .hangup)
        try await server.stop()
    }

    @Test func aDroppedConnectionResumesWithNothingLostAndRequestsAreNotRunTwice() async throws {
        let server = try await LiveServer.start()
        let alice = try await server.device("alice", "a1")
        let bob = try await server.device("bob", "b1")
        let session = try #require(bob.welcome?.session)
        let pong = try await bob.request { .ping(Ping(id: $0)) }
        #expect(pong.isSuccess)
        let lastSeq = 1
        await bob.close()

        // While bob is away, alice calls him: the invite waits in his session.
        let invite = ClientMessage.callInvite(CallInvite(id: "invite-1", call: call, to: "bob"))
        alice.send(invite)
        let first = try await alice.answer(to: "invite-1")
        #expect(first.isSuccess)

        let back = try await WSTestClient.connect(url: server.signalURL, token: server.token("bob"))
        let welcome = try await back.hello(device: "b1", resume: ResumeRequest(session: session, lastSeq: lastSeq))
        #expect(welcome.resumed)
        let replayed = try #require(try await back.next())
        #expect(replayed.seq == lastSeq + 1)
        guard case .callIncoming(let incoming) = replayed.message else { Issue.record("missed invite not replayed: \(replayed)"); return }
        #expect(incoming.call == call)

        // Alice's client re-sends the same request after a reconnect of its own: same answer, no second call.
        alice.send(invite)
        #expect(try await alice.answer(to: "invite-1") == first)
        #expect(try await back.next(timeout: .milliseconds(300)) == nil, "the callee was not rung twice")
        // An invite run again would answer the same and ring no one; a signal run again is relayed again.
        // (An id of its own: this client's first, "q1", is the session's ping's, answered from memory.)
        back.send(.callAccept(CallRequest(id: "accept-1", call: call)))
        #expect(try await back.answer(to: "accept-1").isSuccess)
        _ = try await alice.expect { if case .callAccepted(let m) = $0.message { m } else { nil } }
        let signal = ClientMessage.callSignal(CallSignal(id: "signal-1", call: call, signal: SignalPayload(restartIce: true)))
        alice.send(signal)
        let signalled = try await alice.answer(to: "signal-1")
        _ = try await back.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
        alice.send(signal)
        #expect(try await alice.answer(to: "signal-1") == signalled)
        #expect(try await back.next(timeout: .milliseconds(300)) == nil, "the signal was relayed once")
        try await server.stop()
    }

    @Test func anOutsiderCannotSignalIntoOrHangUpSomeoneElsesCall() async throws {
        let server = try await LiveServer.start()
        let alice = try await server.device("alice", "a1")
        let bob = try await server.device("bob", "b1")
        let mallory = try await server.device("mallory", "m1")
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        _ = try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }
        let offer = SignalPayload(description: SessionDescription(type: "offer", sdp: "v=0\r\n"))
        #expect(try await mallory.request { .callSignal(CallSignal(id: $0, call: call, signal: offer)) }.errorCode == .callNotFound)
        #expect(try await mallory.request { .callHangup(CallHangup(id: $0, call: call)) }.errorCode == .callNotFound)
        #expect(try await mallory.request { .callUpdate(CallUpdate(id: $0, call: call, muted: true)) }.errorCode == .callNotFound)
        #expect(try await alice.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self).state == .active)
        try await server.stop()
    }

    @Test func badFramesGetTheDocumentedErrorsWhileOthersAreServed() async throws {
        let server = try await LiveServer.start { $0.limits.maxFrameSize = 64 * 1024 }
        let bystander = try await server.device("carol", "c1")
        let client = try await server.device("alice", "a1")

        client.sendRaw("{not json")
        #expect(try await client.next()?.message == .error(ErrorMessage(code: .badRequest, message: "the frame is not valid JSON")))
        client.sendRaw("[1,2]")
        guard case .error(let notObject)? = try await client.next()?.message else { Issue.record("no error"); return }
        #expect(notObject.code == .badRequest)
        client.sendRaw(#"{"id":"x1"}"#)
        guard case .error(let noType)? = try await client.next()?.message else { Issue.record("no error"); return }
        #expect(noType.code == .badRequest)
        #expect(noType.re == "x1")
        client.sendRaw(#"{"type":"call.teleport","id":"x2"}"#)
        guard case .error(let unknown)? = try await client.next()?.message else { Issue.record("no error"); return }
        #expect(unknown.code == .unsupported)
        #expect(unknown.re == "x2")
        client.sendRaw(#"{"type":"call.invite","id":"x3","call":"not-a-uuid","to":"bob","media":{"audio":true,"video":false}}"#)
        guard case .error(let invalid)? = try await client.next()?.message else { Issue.record("no error"); return }
        #expect(invalid.code == .badRequest)
        #expect(invalid.re == "x3")
        #expect(try await client.request { .ping(Ping(id: $0)) }.isSuccess, "the connection stays open")

        let big = try await server.device("bob", "b1")
        big.sendRaw(#"{"type":"ping","id":"big","pad":""# + String(repeating: "x", count: 70 * 1024) + #""}"#)
        #expect(await big.closeCode() == 1009)

        let binary = try await server.device("dave", "d1")
        binary.sendBinary([1, 2, 3])
        #expect(await binary.closeCode() == 1003)

        #expect(try await bystander.request { .ping(Ping(id: $0)) }.isSuccess)
        try await server.stop()
    }

    @Test func aFloodIsRefusedThenClosedWhileOthersAreServed() async throws {
        let server = try await LiveServer.start()
        let bystander = try await server.device("carol", "c1")
        let flooder = try await server.device("mallory", "m1")
        // Far more than the burst and the refusals allowed, so a loaded machine (whose slower reading
        // lets the bucket refill) still reaches the close.
        for index in 0..<700 { flooder.send(.ping(Ping(id: "f\(index)"))) }
        var acked: Set<String> = [], refused: Set<String> = []
        var limited = 0
        while let frame = try await flooder.next(timeout: .seconds(2)) {
            switch frame.message {
            case .ack(let ack): acked.insert(ack.re)
            case .error(let error) where error.code == .rateLimited:
                limited += 1
                if let re = error.re { refused.insert(re) }
            default: break
            }
        }
        // The burst is 200 frames, the hello one of them; the bucket refills at 50 a second, so a
        // slower read gets more (a fast machine read all 700 before one more came: 199 acks).
        #expect(acked.count >= 199, "the burst is served")
        #expect(limited == 100, "more than 100 refusals within 2 s close the connection")
        #expect(refused.count == limited, "each refusal names its request")
        #expect(refused.isDisjoint(with: acked), "a refused request is not run")
        #expect(await flooder.closeCode() == 4008)
        #expect(try await bystander.request { .ping(Ping(id: $0)) }.isSuccess)
        try await server.stop()
    }

    @Test func badTokensAreRefusedBeforeTheUpgrade() async throws {
        let server = try await LiveServer.start()
        await #expect(throws: (any Error).self) { try await WSTestClient.connect(url: server.signalURL, token: nil) }
        await #expect(throws: (any Error).self) { try await WSTestClient.connect(url: server.signalURL, token: "not.a.jwt") }
        let expired = try await server.token("alice", lifetime: .seconds(-10))
        await #expect(throws: (any Error).self) { try await WSTestClient.connect(url: server.signalURL, token: expired) }
        let forged = try await TokenAuthority(key: .hs256(secret: String(repeating: "k", count: 40)))
            .mint(user: "alice", name: nil, lifetime: .seconds(60)).token
        await #expect(throws: (any Error).self) { try await WSTestClient.connect(url: server.signalURL, token: forged) }

        #expect(try await server.http("GET", "/v1/signal").status == 401)
        #expect(try await server.http("GET", "/v1/signal", token: expired).status == 401)
        #expect(try await server.http("GET", "/v1/calls", token: forged).status == 401)
        #expect(try await server.http("GET", "/v1/ice-servers").status == 401)

        // Browsers pass the token in the query; the subprotocol is echoed when offered.
        let browser = try await WSTestClient.connect(url: server.signalURL, token: server.token("alice"), inQuery: true, subprotocol: "parley.v1")
        #expect(try await browser.hello(device: "web").user == "alice")
        try await server.stop()
    }

    @Test func aTokenThatExpiresDuringTheConnectionClosesWith4003() async throws {
        let server = try await LiveServer.start()
        let client = try await WSTestClient.connect(url: server.signalURL, token: server.token("alice", lifetime: .seconds(2)))
        _ = try await client.hello(device: "a1")
        #expect(await client.closeCode(timeout: .seconds(6)) == 4003)
        try await server.stop()
    }

    @Test func aSecondConnectionOfADeviceReplacesTheFirstWith4009() async throws {
        let server = try await LiveServer.start()
        let first = try await server.device("alice", "a1")
        let second = try await server.device("alice", "a1")
        #expect(await first.closeCode() == 4009)
        #expect(try await second.request { .ping(Ping(id: $0)) }.isSuccess)
        try await server.stop()
    }

    @Test func aConnectionWithoutHelloIsClosedWith4001() async throws {
        let server = try await LiveServer.start { $0.helloTimeout = .seconds(1) }
        let client = try await WSTestClient.connect(url: server.signalURL, token: server.token("alice"))
        client.send(.ping(Ping(id: "early")))
        guard case .error(let error)? = try await client.next()?.message else { Issue.record("no error"); return }
        #expect(error.code == .badRequest)
        #expect(await client.closeCode() == 4001)
        try await server.stop()
    }
}

@Suite("Live server: heartbeat", .timeLimit(.minutes(5)))
struct HeartbeatTests {
    @Test func webSocketPingsKeepAConnectionAliveAndSilenceClosesIt() async throws {
        let server = try await LiveServer.start { $0.heartbeat = 1 }
        let pinging = try await WSTestClient.connect(url: server.signalURL, token: server.token("alice"), webSocketPings: .milliseconds(500))
        _ = try await pinging.hello(device: "a1")
        let silent = try await WSTestClient.connect(url: server.signalURL, token: server.token("bob"))
        let session = try await silent.hello(device: "b1").session
        #expect(await silent.closeCode(timeout: .seconds(20)) == 4002, "silence (3 heartbeats) closes with 4002; generous under a loaded machine")
        #expect(!pinging.isClosed, "WebSocket pings count as heartbeats")
        #expect(try await pinging.request { .ping(Ping(id: $0)) }.isSuccess)

        let back = try await WSTestClient.connect(url: server.signalURL, token: server.token("bob"))
        #expect(try await back.hello(device: "b1", resume: ResumeRequest(session: session, lastSeq: 0)).resumed, "the session was kept")
        try await server.stop()
    }
}

@Suite("Live server: idempotent requests across a reconnect", .timeLimit(.minutes(5)))
struct ResentRequestTests {
    @Test func aRequestResentUnderItsIDAfterReconnectAndResumeRunsOnce() async throws {
        let server = try await LiveServer.start()
        let bob = try await server.device("bob", "b1")
        let alice = try await WSTestClient.connect(url: server.signalURL, token: server.token("alice"))
        let session = try await alice.hello(device: "a1").session
        let call: CallID = "5e4d3c2b-1a09-4f8e-8d7c-6b5a4f3e2d1c"
        let invite = ClientMessage.callInvite(CallInvite(id: "invite-1", call: call, to: "bob"))
        // The connection drops before alice reads the answer.
        alice.send(invite)
        _ = try await bob.expect { if case .callIncoming(let m) = $0.message { m } else { nil } }
        await alice.close()

        let back = try await WSTestClient.connect(url: server.signalURL, token: server.token("alice"))
        #expect(try await back.hello(device: "a1", resume: ResumeRequest(session: session, lastSeq: 0)).resumed)
        back.send(invite)
        var answers: [Ack] = []
        while answers.count < 2 {
            answers.append(try await back.expect { if case .ack(let ack) = $0.message, ack.re == "invite-1" { ack } else { nil } })
        }
        #expect(answers[0] == answers[1], "the replayed answer and the answer to the re-sent request are the same")
        #expect(try await bob.next(timeout: .milliseconds(300)) == nil, "bob's phone rang once")

        // The same with a request whose every run shows (an invite run again answers as the first
        // did and rings no one): a signal, relayed each time it runs.
        #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        let accepted = try await back.expect { frame in if case .callAccepted = frame.message { frame.seq } else { nil } }
        let signal = ClientMessage.callSignal(CallSignal(id: "signal-1", call: call, signal: SignalPayload(restartIce: true)))
        back.send(signal)
        _ = try await bob.expect { if case .callSignal(let m) = $0.message { m } else { nil } }
        await back.close()
        let third = try await WSTestClient.connect(url: server.signalURL, token: server.token("alice"))
        #expect(try await third.hello(device: "a1", resume: ResumeRequest(session: session, lastSeq: accepted)).resumed)
        third.send(signal)
        var signalAnswers: [Ack] = []
        while signalAnswers.count < 2 {
            signalAnswers.append(try await third.expect { if case .ack(let ack) = $0.message, ack.re == "signal-1" { ack } else { nil } })
        }
        #expect(signalAnswers[0] == signalAnswers[1])
        #expect(try await bob.next(timeout: .milliseconds(300)) == nil, "the signal ran once")
        try await server.stop()
    }
}
