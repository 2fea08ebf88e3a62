import Foundation
import Logging
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

/// The signaling client against a scripted server: the edge cases a real server rarely produces.
@Suite("Signaling client with the in-memory transport")
struct InMemoryTransportTests {
    func makeClient(_ transport: InMemorySignalingTransport) -> SignalingClient<ContinuousClock> {
        var configuration = SignalingClient<ContinuousClock>.Configuration(url: URL(string: "ws://in-memory/v1/signal")!, device: "d1")
        configuration.backoff = .init(initial: .milliseconds(10), maximum: .milliseconds(20))
        configuration.requestTimeout = .seconds(2)
        let tokens = Locked(0)
        return SignalingClient(configuration: configuration, transport: transport, clock: ContinuousClock(),
                               logger: Logger(label: "test")) {
            tokens.set(tokens.value + 1)
            return "token-\(tokens.value)"
        }
    }

    func welcome(_ resumed: Bool) -> ServerFrame {
        ServerFrame(seq: nil, message: .welcome(Welcome(re: "hello", session: "s1", user: "alice", device: "d1",
                                                         resumed: resumed, heartbeat: 20, iceServers: [])))
    }

    /// The client tells the server what it has every 32 numbered frames (and with each heartbeat),
    /// so that the server lets them go from its resume buffer.
    @Test func everyThirtySecondFrameIsAcknowledged() async throws {
        let transport = InMemorySignalingTransport()
        let client = makeClient(transport)
        var connections = transport.connections.makeAsyncIterator()
        await client.start()
        let connection = try #require(await connections.next())
        var sent = connection.sent.makeAsyncIterator()
        guard case .hello? = await sent.next() else { Issue.record("no hello"); return }
        connection.serverSend(welcome(false))
        let ringing = ServerMessage.callRinging(CallRinging(call: "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"))
        for seq in 1...31 { connection.serverSend(ServerFrame(seq: seq, message: ringing)) }
        // Not yet: the next thing the client sends is a request of its own.
        let ping = await client.submit { .ping(Ping(id: $0)) }
        guard case .ping? = await sent.next() else { Issue.record("acknowledged before the 32nd frame"); return }
        // The 32nd answers the ping: once the client has the answer, it has read the frame.
        connection.serverSend(ServerFrame(seq: 32, message: .ack(Ack(re: ping.id))))
        _ = try await ping.answer()
        let after = await client.submit { .ping(Ping(id: $0)) }
        #expect(await sent.next() == .ack(SeqAck(seq: 32)), "acknowledged as the 32nd came, before anything after it")
        withExtendedLifetime(after) {}
        await client.stop()
    }

    @Test func replayedFramesAreDeliveredOnceAndUnansweredRequestsResent() async throws {
        let transport = InMemorySignalingTransport()
        let client = makeClient(transport)
        let log = EventLog(client.events)
        var connections = transport.connections.makeAsyncIterator()
        await client.start()

        let first = try #require(await connections.next())
        var sent = first.sent.makeAsyncIterator()
        guard case .hello(let hello)? = await sent.next() else { Issue.record("no hello"); return }
        #expect(hello.resume == nil)
        first.serverSend(welcome(false))
        let ringing = ServerMessage.callRinging(CallRinging(call: "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"))
        first.serverSend(ServerFrame(seq: 1, message: ringing))

        // A request goes out; the connection drops before its answer.
        let answer = Task { try await client.request { .ping(Ping(id: $0)) } }
        let state = Task { try await client.request { .callState(CallRequest(id: $0, call: "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21")) } }
        _ = await sent.next()
        _ = await sent.next()
        first.serverClose(code: 1001)

        let second = try #require(await connections.next())
        var resent = second.sent.makeAsyncIterator()
        guard case .hello(let again)? = await resent.next() else { Issue.record("no second hello"); return }
        #expect(again.resume == ResumeRequest(session: "s1", lastSeq: 1))
        second.serverSend(welcome(true))
        // The server replays frame 1 (already seen) and sends frame 2.
        second.serverSend(ServerFrame(seq: 1, message: ringing))
        second.serverSend(ServerFrame(seq: 2, message: ringing))
        guard case .callState(let request)? = await resent.next() else { Issue.record("the request was not re-sent"); return }
        second.serverSend(ServerFrame(seq: 3, message: .ack(Ack(re: request.id, result: .callState(CallStateResult(call: request.call, state: .ringing))))))

        #expect(try await state.value.decodeResult(CallStateResult.self).state == .ringing)
        await #expect(throws: SignalingError.self, "a ping is not re-sent on a new connection") { try await answer.value }
        try await log.waitFor { _ in log.messages.count == 2 }
        try await Task.sleep(for: .milliseconds(50))
        #expect(log.messages.count == 2, "frame 1 once, frame 2 once")
        #expect(transport.tokensSeen == ["token-1", "token-2"], "a fresh token for each connection")
        await client.stop()
    }

    @Test func aRequestWhoseWaiterWentAwayIsNotSentAgainAfterAReconnect() async throws {
        let transport = InMemorySignalingTransport()
        let client = makeClient(transport)
        var connections = transport.connections.makeAsyncIterator()
        await client.start()
        let first = try #require(await connections.next())
        var sent = first.sent.makeAsyncIterator()
        _ = await sent.next()
        first.serverSend(welcome(false))
        let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"
        let forgotten = Task { try await client.request { .callState(CallRequest(id: $0, call: call)) } }
        guard case .callState(let abandoned)? = await sent.next() else { Issue.record("the first request did not leave"); return }
        forgotten.cancel()
        await #expect(throws: SignalingError.self) { try await forgotten.value }
        let kept = Task { try await client.request { .callState(CallRequest(id: $0, call: call)) } }
        guard case .callState(let waiting)? = await sent.next() else { Issue.record("the second request did not leave"); return }
        first.serverClose(code: 1001)

        let second = try #require(await connections.next())
        var resent = second.sent.makeAsyncIterator()
        _ = await resent.next()
        second.serverSend(welcome(true))
        guard case .callState(let again)? = await resent.next() else { Issue.record("nothing was re-sent"); return }
        #expect(again.id == waiting.id, "only the request still waited for is sent again, not \(abandoned.id)")
        second.serverSend(ServerFrame(seq: 1, message: .ack(Ack(re: again.id, result: .callState(CallStateResult(call: call, state: .ringing))))))
        #expect(try await kept.value.decodeResult(CallStateResult.self).state == .ringing)
        await client.stop()
    }

    @Test func refusedConnectionsAreRetriedWithBackoff() async throws {
        let transport = InMemorySignalingTransport()
        transport.refuseNext(3)
        let client = makeClient(transport)
        var connections = transport.connections.makeAsyncIterator()
        await client.start()
        let connection = try #require(await connections.next())
        #expect(transport.tokensSeen.count == 4)
        connection.serverSend(welcome(false))
        try await eventually("connected") { await client.session != nil }
        await client.stop()
    }
}

@Suite("Signaling client timeouts on a manual clock")
struct SignalingClientClockTests {
    func makeClient(_ transport: InMemorySignalingTransport, clock: ManualClock) -> SignalingClient<ManualClock> {
        var configuration = SignalingClient<ManualClock>.Configuration(url: URL(string: "ws://in-memory/v1/signal")!, device: "d1")
        configuration.requestTimeout = .seconds(10)
        configuration.welcomeTimeout = .seconds(10)
        configuration.backoff = .init(initial: .seconds(4), maximum: .seconds(60))
        return SignalingClient(configuration: configuration, transport: transport, clock: clock,
                               logger: Logger(label: "test"), random: { 0 }) { "token" }
    }

    @Test func aConnectionWithoutAWelcomeIsClosedAtTheWelcomeTimeoutAndTriedAgain() async throws {
        let clock = ManualClock()
        let transport = InMemorySignalingTransport()
        let client = makeClient(transport, clock: clock)
        var connections = transport.connections.makeAsyncIterator()
        let started = clock.now
        await client.start()
        let silent = try #require(await connections.next())
        var sent = silent.sent.makeAsyncIterator()
        guard case .hello? = await sent.next() else { Issue.record("no hello"); return }
        try await eventually("the welcome deadline is running") { clock.hasSleeper(until: started.advanced(by: .seconds(10))) }
        clock.advance(by: .seconds(9))
        try await Task.sleep(for: .milliseconds(30))
        #expect(transport.tokensSeen.count == 1, "still waiting for the welcome")
        clock.advance(by: .seconds(1))
        try await eventually("the client closes the silent connection") { silent.isClosed }
        let next = try #require(await connections.next())
        #expect(next !== silent)
        await client.stop()
    }

    @Test func aWelcomedConnectionPingsAtItsHeartbeatAndAnUnansweredPingReconnects() async throws {
        let clock = ManualClock()
        let transport = InMemorySignalingTransport()
        let client = makeClient(transport, clock: clock)
        var connections = transport.connections.makeAsyncIterator()
        await client.start()
        let first = try #require(await connections.next())
        var sent = first.sent.makeAsyncIterator()
        _ = await sent.next()
        first.serverSend(ServerFrame(seq: nil, message: .welcome(Welcome(re: "hello", session: "s1", user: "alice", device: "d1",
                                                                         resumed: false, heartbeat: 5, iceServers: []))))
        try await eventually("connected") { await client.session != nil }
        let welcomed = clock.now
        try await eventually("the heartbeat is running") { clock.hasSleeper(until: welcomed.advanced(by: .seconds(5))) }
        #expect(!clock.hasSleeper(until: welcomed.advanced(by: .seconds(10))), "the welcome deadline ended with the welcome")
        clock.advance(by: .seconds(5))
        guard case .ping(let ping)? = await sent.next() else { Issue.record("no ping at the heartbeat"); return }
        first.serverSend(ServerFrame(seq: nil, message: .ack(Ack(re: ping.id))))
        try await eventually("the next beat is due") { clock.hasSleeper(until: welcomed.advanced(by: .seconds(10))) }
        clock.advance(by: .seconds(5))
        guard case .ping? = await sent.next() else { Issue.record("no second ping"); return }
        // This one is never answered: at the request timeout (10 s) the connection counts as dead.
        // (The expiry loop wakes at the answered first ping's deadline first, and goes on sleeping.)
        clock.advance(by: .seconds(5))
        try await eventually("the ping's timeout is running") { clock.hasSleeper(until: welcomed.advanced(by: .seconds(20))) }
        #expect(transport.tokensSeen.count == 1, "still connected before the ping's timeout")
        clock.advance(by: .seconds(5))
        try await eventually("the client closes the connection whose ping went unanswered") { first.isClosed }
        let second = try #require(await connections.next())
        #expect(second !== first)
        await client.stop()
    }

    @Test func requestsTimeOutAndReconnectsBackOffOnTheInjectedClock() async throws {
        let clock = ManualClock()
        let transport = InMemorySignalingTransport()
        var configuration = SignalingClient<ManualClock>.Configuration(url: URL(string: "ws://in-memory/v1/signal")!, device: "d1")
        configuration.requestTimeout = .seconds(10)
        configuration.backoff = .init(initial: .seconds(4), maximum: .seconds(60))
        let client = SignalingClient(configuration: configuration, transport: transport, clock: clock,
                                     logger: Logger(label: "test"), random: { 1 }) { "token" }
        var connections = transport.connections.makeAsyncIterator()
        await client.start()
        let first = try #require(await connections.next())
        first.serverSend(ServerFrame(seq: nil, message: .welcome(Welcome(re: "hello", session: "s1", user: "alice", device: "d1",
                                                                         resumed: false, heartbeat: 3600, iceServers: []))))
        try await eventually("connected") { await client.session != nil }

        let sent = clock.now
        let pending = Task { try await client.request { .callState(CallRequest(id: $0, call: "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21")) } }
        try await eventually("the request's timeout is running") { clock.hasSleeper(until: sent.advanced(by: .seconds(10))) }
        clock.advance(by: .seconds(9))
        try await Task.sleep(for: .milliseconds(20))
        #expect(transport.tokensSeen.count == 1)
        clock.advance(by: .seconds(1))
        do {
            _ = try await pending.value
            Issue.record("the request should have timed out")
        } catch let error as SignalingError {
            #expect(error.code == .timeout)
        }

        // Lost connection: the first retry comes at once, the next after the (jitter-free) backoff.
        first.serverClose(code: 1006)
        let second = try #require(await connections.next())
        second.serverClose(code: 1006)
        let third = Task { await connections.next() }
        try await eventually("the backoff is running") { clock.hasSleeper(until: clock.now.advanced(by: .seconds(4))) }
        #expect(transport.tokensSeen.count == 2, "waiting for the backoff")
        clock.advance(by: .seconds(4))
        #expect(await third.value !== second)
        #expect(transport.tokensSeen.count == 3)
        await client.stop()
    }
}
