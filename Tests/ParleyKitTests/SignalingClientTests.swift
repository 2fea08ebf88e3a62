import Foundation
import Logging
@testable import ParleyKit
import ParleyNIOTransport
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

/// Collects a client's events for assertions.
final class EventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var events: [SignalingEvent] = []
    private var task: Task<Void, Never>?

    init(_ stream: AsyncStream<SignalingEvent>) {
        task = Task { [weak self] in
            for await event in stream { self?.lock.withLock { self?.events.append(event) } }
        }
    }

    var all: [SignalingEvent] { lock.withLock { events } }
    var messages: [ServerMessage] { all.compactMap { if case .message(let m) = $0 { m } else { nil } } }
    var welcomes: [Welcome] { all.compactMap { if case .connected(let w) = $0 { w } else { nil } } }

    func waitFor(timeout: Duration = .seconds(10), _ condition: ([SignalingEvent]) -> Bool) async throws {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if condition(all) { return }
            try await Task.sleep(for: .milliseconds(5))
        }
        throw TestFailure("events never matched: \(all)")
    }
}

func makeClient(_ server: LiveServer, user: UserID, device: DeviceID, backoff: Duration = .milliseconds(50),
                tokenLifetime: Duration = .seconds(3600),
                transport: any SignalingTransport = WebSocketSignalingTransport()) -> SignalingClient<ContinuousClock> {
    var configuration = SignalingClient<ContinuousClock>.Configuration(url: URL(string: server.signalURL)!, device: device)
    configuration.backoff = .init(initial: backoff, maximum: .milliseconds(500))
    configuration.requestTimeout = .seconds(5)
    configuration.connectTimeout = .seconds(2)
    return SignalingClient(configuration: configuration, transport: transport, clock: ContinuousClock(),
                           logger: Logger(label: "test.client")) {
        try await server.token(user, lifetime: tokenLifetime)
    }
}

/// The real transport, whose connections can be held back: while the gate is closed, a connect waits.
struct GatedTransport: SignalingTransport {
    private let base = WebSocketSignalingTransport()
    let gate = Gate()

    func connect(to url: URL, token: String) async throws -> any SignalingConnection {
        await gate.pass()
        return try await base.connect(to: url, token: token)
    }
}

@Suite("Signaling client against the real server")
struct SignalingClientTests {
    let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"

    @Test func connectsAndAnswersRequests() async throws {
        let server = try await LiveServer.start()
        let client = makeClient(server, user: "alice", device: "a1")
        let log = EventLog(client.events)
        await client.start()
        _ = try await client.request { .ping(Ping(id: $0)) }
        try await log.waitFor { events in events.contains { if case .connected = $0 { true } else { false } } }
        #expect(log.welcomes.first?.user == "alice")
        await #expect(throws: SignalingError.self) {
            try await client.request { .callState(CallRequest(id: $0, call: self.call)) }
        }
        do {
            _ = try await client.request { .callState(CallRequest(id: $0, call: call)) }
        } catch {
            #expect(error.serverCode == .callNotFound)
        }
        await client.stop()
        try await server.stop()
    }

    @Test func aNetworkChangeResumesAndEveryFrameArrivesOnce() async throws {
        let server = try await LiveServer.start()
        let alice = makeClient(server, user: "alice", device: "a1")
        let transport = GatedTransport()
        let bob = makeClient(server, user: "bob", device: "b1", transport: transport)
        let bobLog = EventLog(bob.events)
        await alice.start()
        await bob.start()
        _ = try await bob.request { .ping(Ping(id: $0)) }
        _ = try await alice.request { .ping(Ping(id: $0)) }

        // Bob's connection goes and his reconnect is held until the server has seen him go: what
        // alice sends meanwhile waits in his session.
        transport.gate.close()
        await bob.networkChanged()
        try await eventually("bob's reconnect waits, and the server saw him go") {
            let connections = await server.server.hub.connectionCount
            return transport.gate.waiting == 1 && connections == 1
        }
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }
        transport.gate.open()
        try await bobLog.waitFor { _ in bobLog.welcomes.count == 2 && !bobLog.messages.isEmpty }
        #expect(bobLog.welcomes.last?.resumed == true)
        #expect(bobLog.welcomes.first?.session == bobLog.welcomes.last?.session)
        // Answered after whatever the resume replayed.
        _ = try await bob.request { .ping(Ping(id: $0)) }
        let incoming = bobLog.messages.filter { if case .callIncoming = $0 { true } else { false } }
        #expect(incoming.count == 1)

        // A request made while disconnected (the reconnect held again) waits, and is sent after the
        // reconnect and answered.
        transport.gate.close()
        await bob.networkChanged()
        try await eventually("bob is away again") {
            let connections = await server.server.hub.connectionCount
            return transport.gate.waiting == 1 && connections == 1
        }
        let accepting = Task { try await bob.request { .callAccept(CallRequest(id: $0, call: call)) } }
        let ringing = try await alice.request { .callState(CallRequest(id: $0, call: call)) }.decodeResult(CallStateResult.self)
        #expect(ringing.state == .ringing, "not sent while bob is away")
        transport.gate.open()
        _ = try await accepting.value
        let state = try await alice.request { .callState(CallRequest(id: $0, call: call)) }.decodeResult(CallStateResult.self)
        #expect(state.state == .active)
        await alice.stop()
        await bob.stop()
        try await server.stop()
    }

    @Test func aServerRestartStartsANewSession() async throws {
        let first = try await LiveServer.start()
        let port = first.port
        let client = makeClient(first, user: "alice", device: "a1")
        let log = EventLog(client.events)
        await client.start()
        _ = try await client.request { .ping(Ping(id: $0)) }
        try await first.stop()
        let second = try await LiveServer.start { $0.port = port }
        try await log.waitFor { _ in log.welcomes.count == 2 }
        #expect(log.welcomes.last?.resumed == false)
        #expect(log.all.contains { if case .disconnected(closeCode: 1001) = $0 { true } else { false } }, "told the server is going away")
        _ = try await client.request { .ping(Ping(id: $0)) }
        await client.stop()
        try await second.stop()
    }

    @Test func anotherConnectionOfTheSameDeviceStopsTheOldClient() async throws {
        let server = try await LiveServer.start()
        let old = makeClient(server, user: "alice", device: "a1")
        let log = EventLog(old.events)
        await old.start()
        _ = try await old.request { .ping(Ping(id: $0)) }
        let new = makeClient(server, user: "alice", device: "a1")
        await new.start()
        _ = try await new.request { .ping(Ping(id: $0)) }
        try await log.waitFor { events in events.contains { if case .stopped = $0 { true } else { false } } }
        await #expect(throws: SignalingError.self) { try await old.request { .ping(Ping(id: $0)) } }
        await new.stop()
        try await server.stop()
    }

    @Test func anExpiredTokenIsReplacedAndTheSessionResumed() async throws {
        let server = try await LiveServer.start()
        let client = makeClient(server, user: "alice", device: "a1", tokenLifetime: .seconds(2))
        let log = EventLog(client.events)
        await client.start()
        try await log.waitFor(timeout: .seconds(8)) { _ in log.welcomes.count >= 2 }
        #expect(log.all.contains { if case .disconnected(closeCode: 4003) = $0 { true } else { false } })
        #expect(log.welcomes[1].resumed)
        await client.stop()
        try await server.stop()
    }
}

@Suite("Backoff")
struct BackoffTests {
    @Test func growsExponentiallyWithFullJitterUpToTheMaximum() {
        let backoff = SignalingClient<ContinuousClock>.Backoff(initial: .milliseconds(250), maximum: .seconds(30))
        #expect(backoff.delay(attempt: 0, random: 1) == .milliseconds(250))
        #expect(backoff.delay(attempt: 3, random: 1) == .seconds(2))
        #expect(backoff.delay(attempt: 3, random: 0.5) == .seconds(1))
        #expect(backoff.delay(attempt: 20, random: 1) == .seconds(30))
        #expect(backoff.delay(attempt: 5, random: 0) == .zero)
    }
}
