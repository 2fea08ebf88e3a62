import Foundation
import Logging
import ParleyKit
import ParleyLocalServices
import ParleyNIOTransport
import ParleyProtocol
import ParleyServerTesting
import Testing

/// How a failed connection is classified (by the NIO transport) and what the client makes of it:
/// a first connection that asked to fail fast gives up at once on what will not pass; everything
/// else, and every reconnect, is tried again.
@Suite("Signaling connection failures")
struct SignalingConnectFailureTests {
    /// A name that never resolves and whose lookup never leaves the machine: `.invalid` is reserved
    /// (RFC 6761), but glibc with `hosts: files dns` would still ask the configured resolver for
    /// `parley.invalid`; a label of 64 characters cannot be put in a DNS query at all, so
    /// getaddrinfo answers EAI_NONAME without sending one (checked with strace).
    static let unresolvable = String(repeating: "p", count: 64) + ".invalid"

    static func client(_ url: String, failFast: Bool, transport: any SignalingTransport = WebSocketSignalingTransport(),
                       token: @escaping @Sendable () async throws -> String = { "token" }) -> SignalingClient<ContinuousClock> {
        var configuration = SignalingClient<ContinuousClock>.Configuration(url: URL(string: url)!, device: "d1")
        configuration.backoff = .init(initial: .milliseconds(50), maximum: .milliseconds(200))
        configuration.connectTimeout = .seconds(2)
        configuration.firstConnectFailsFast = failFast
        return SignalingClient(configuration: configuration, transport: transport, clock: ContinuousClock(),
                               logger: Logger(label: "test.client"), tokens: token)
    }

    static func failures(_ log: EventLog) -> [SignalingConnectFailure] {
        log.all.compactMap { if case .connectFailed(let failure) = $0 { failure } else { nil } }
    }

    static func stopped(_ log: EventLog) -> Bool {
        log.all.contains { if case .stopped = $0 { true } else { false } }
    }

    @Test func theTransportCallsAClosedPortRefused() async throws {
        let url = URL(string: "ws://127.0.0.1:\(try freeTCPPort())/v1/signal")!
        do {
            _ = try await WebSocketSignalingTransport().connect(to: url, token: "token")
            Issue.record("connected to a closed port")
        } catch let error as SignalingConnectError {
            #expect(error.code == .refused)
            #expect(error.isLasting)
        }
    }

    @Test func aFirstConnectionToAClosedPortStopsAtOnce() async throws {
        let client = Self.client("ws://127.0.0.1:\(try freeTCPPort())/v1/signal", failFast: true)
        let log = EventLog(client.events)
        let started = ContinuousClock.now
        await client.start()
        try await log.waitFor(timeout: .seconds(5)) { _ in Self.stopped(log) }
        // Generous: a refused connect on loopback takes milliseconds; before, the client never gave up.
        #expect(ContinuousClock.now - started < .seconds(5))
        let failures = Self.failures(log)
        #expect(failures.count == 1)
        #expect(failures.first?.error.code == .refused)
        #expect(failures.first?.retryIn == nil)
        #expect(failures.first?.firstConnection == true)
        #expect(await client.lastConnectFailure == failures.first)
    }

    @Test func aFirstConnectionToANameThatDoesNotResolveStopsAtOnce() async throws {
        let client = Self.client("ws://\(Self.unresolvable):8080/v1/signal", failFast: true)
        let log = EventLog(client.events)
        let started = ContinuousClock.now
        await client.start()
        try await log.waitFor(timeout: .seconds(5)) { _ in Self.stopped(log) }
        #expect(ContinuousClock.now - started < .seconds(5))
        #expect(Self.failures(log).map(\.error.code) == [.nameNotFound])
        #expect(Self.failures(log).first?.error.message.contains(Self.unresolvable) == true)
    }

    @Test func withoutFailingFastARefusedFirstConnectionIsTriedAgain() async throws {
        let client = Self.client("ws://127.0.0.1:\(try freeTCPPort())/v1/signal", failFast: false)
        let log = EventLog(client.events)
        await client.start()
        try await log.waitFor { _ in Self.failures(log).count >= 3 }
        await client.stop()
        #expect(Self.failures(log).prefix(3).allSatisfy { $0.error.code == .refused && $0.retryIn != nil })
        #expect(Self.failures(log).prefix(3).map(\.attempt) == [1, 2, 3])
    }

    /// A token the server does not take is final on a first connection: the transport learns the
    /// upgrade's status (swift-websocket does not say it).
    @Test func aRefusedTokenIsAFinal401() async throws {
        let server = try await LiveServer.start()
        let client = Self.client(server.signalURL, failFast: true, token: { "forged.token.value" })
        let log = EventLog(client.events)
        await client.start()
        try await log.waitFor { _ in Self.stopped(log) }
        let failure = Self.failures(log).first
        #expect(failure?.error.code == .upgradeRefused)
        #expect(failure?.error.httpStatus == 401)
        #expect(failure?.retryIn == nil)
        try await server.stop()
    }

    /// What may pass is tried again even on a first connection that fails fast: no answer in time,
    /// a 503 from a server shutting down, and failures no transport could name.
    @Test(arguments: [
        SignalingConnectError(.timeout, message: "no answer"),
        SignalingConnectError(.upgradeRefused, httpStatus: 503, message: "shutting down"),
        SignalingConnectError(.upgradeRefused, message: "no status"),
        SignalingConnectError(.other, message: "connection reset"),
    ])
    func transientFailuresAreTriedAgain(_ error: SignalingConnectError) async throws {
        let client = Self.client("ws://example.test/v1/signal", failFast: true, transport: FailingTransport(error: error))
        let log = EventLog(client.events)
        await client.start()
        try await log.waitFor { _ in Self.failures(log).count >= 2 }
        await client.stop()
        #expect(Self.failures(log).prefix(2).allSatisfy { $0.error == error && $0.retryIn != nil })
    }

    @Test func aConnectionThatHangsTimesOutAndIsTriedAgain() async throws {
        var configuration = SignalingClient<ContinuousClock>.Configuration(url: URL(string: "ws://example.test/v1/signal")!, device: "d1")
        configuration.connectTimeout = .milliseconds(100)
        configuration.backoff = .init(initial: .milliseconds(20), maximum: .milliseconds(50))
        configuration.firstConnectFailsFast = true
        let client = SignalingClient(configuration: configuration, transport: HangingTransport(), clock: ContinuousClock(),
                                     logger: Logger(label: "test.client")) { "token" }
        let log = EventLog(client.events)
        await client.start()
        try await log.waitFor { _ in Self.failures(log).count >= 2 }
        await client.stop()
        #expect(Self.failures(log).prefix(2).allSatisfy { $0.error.code == .timeout && $0.retryIn != nil })
    }

    /// A reconnect keeps trying on a refused connection, failing fast or not: the server that
    /// went away is most likely restarting.
    @Test func aReconnectKeepsTryingWhenRefused() async throws {
        let server = try await LiveServer.start()
        var configuration = SignalingClient<ContinuousClock>.Configuration(url: URL(string: server.signalURL)!, device: "a1")
        configuration.backoff = .init(initial: .milliseconds(50), maximum: .milliseconds(200))
        configuration.firstConnectFailsFast = true
        let client = SignalingClient(configuration: configuration, transport: WebSocketSignalingTransport(), clock: ContinuousClock(),
                                     logger: Logger(label: "test.client")) { try await server.token("alice") }
        let log = EventLog(client.events)
        await client.start()
        try await log.waitFor { events in events.contains { if case .connected = $0 { true } else { false } } }
        try await server.stop()
        // While it shuts down the server may still answer 503; then nothing listens.
        try await log.waitFor { _ in Self.failures(log).filter { $0.error.code == .refused }.count >= 2 }
        await client.stop()
        #expect(Self.failures(log).allSatisfy { $0.retryIn != nil && !$0.firstConnection }, "\(Self.failures(log))")
        #expect(!log.all.contains { if case .stopped(let reason) = $0 { reason != "stopped" } else { false } }, "only its owner stopped it")
    }
}

/// Fails every attempt the same way.
struct FailingTransport: SignalingTransport {
    var error: SignalingConnectError
    func connect(to url: URL, token: String) async throws -> any SignalingConnection { throw error }
}

/// Never connects: only the client's connect timeout ends an attempt.
struct HangingTransport: SignalingTransport {
    func connect(to url: URL, token: String) async throws -> any SignalingConnection {
        try await Task.sleep(for: .seconds(3600))
        throw CancellationError()
    }
}
