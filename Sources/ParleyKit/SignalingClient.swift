import Foundation
import Logging
import ParleyProtocol

/// Why a request failed.
public struct SignalingError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: Hashable, Sendable {
        /// The server answered with `error`; `serverCode` says which.
        case rejected
        /// No answer within the request timeout.
        case timeout
        /// The client was stopped (or replaced by another connection of the same device).
        case stopped
        /// The task waiting for the answer was cancelled; the request was forgotten.
        case cancelled
    }

    public var code: Code
    public var serverCode: ErrorCode?
    public var message: String

    public static func rejected(_ error: ErrorMessage) -> SignalingError {
        SignalingError(code: .rejected, serverCode: error.code, message: error.message)
    }

    public var description: String {
        serverCode.map { "\($0): \(message)" } ?? message
    }
}

/// What a signaling client tells its owner.
public enum SignalingEvent: Hashable, Sendable {
    /// A session is established: after every connect and reconnect. With `resumed: false` after an
    /// earlier session, every call and room needs a fresh look (`call.state`).
    case connected(Welcome)
    /// The connection ended; the client reconnects on its own unless it has stopped.
    case disconnected(closeCode: UInt16?)
    /// A frame the server sent of its own accord (`call.incoming`, `call.ended`, …), once each,
    /// in order, also across reconnects.
    case message(ServerMessage)
    /// An attempt to connect failed: why, and when the client tries again (with no `retryIn` it
    /// does not, and `.stopped` follows).
    case connectFailed(SignalingConnectFailure)
    /// The client will not reconnect: stopped by its owner, replaced (4009), or a first connection
    /// that failed for good (`Configuration.firstConnectFailsFast`).
    case stopped(reason: String)
}

/// A failed attempt to connect, and what the client does next.
public struct SignalingConnectFailure: Hashable, Sendable {
    public var error: SignalingConnectError
    /// Attempts since the last session, this one included.
    public var attempt: Int
    /// How long until the next attempt; nil when there is none (the client stops).
    public var retryIn: Duration?
    /// Whether no session was ever established: the first connection rather than a reconnect.
    public var firstConnection: Bool

    public init(error: SignalingConnectError, attempt: Int, retryIn: Duration?, firstConnection: Bool) {
        self.error = error
        self.attempt = attempt
        self.retryIn = retryIn
        self.firstConnection = firstConnection
    }
}

/// The client half of protocol v1's session: connect with a token, hello, requests answered by
/// ack or error, heartbeat, reconnect with backoff, resume without loss, and re-sending of
/// unanswered requests under the same id.
///
/// A failed attempt to connect is classified by the transport (`SignalingConnectError`), told as
/// `.connectFailed` with the wait before the next attempt, and tried again with backoff. Only the
/// first connection may give up, and only when its owner asks (`firstConnectFailsFast`).
public actor SignalingClient<C: Clock> where C.Duration == Duration {
    public struct Configuration: Sendable {
        public var url: URL
        public var device: DeviceID
        public var client: ClientInfo
        public var requestTimeout: Duration = .seconds(10)
        /// How long to wait for `welcome` after connecting.
        public var welcomeTimeout: Duration = .seconds(10)
        /// How long a connection attempt (TCP, TLS, the WebSocket upgrade) may take.
        public var connectTimeout: Duration = .seconds(10)
        public var backoff = Backoff()
        /// Whether the first connection gives up, and the client stops, at a failure that trying
        /// again in a moment cannot mend (`SignalingConnectError.isLasting`: refused, a name that
        /// does not resolve, TLS, an upgrade answered 4xx); timeouts and 5xx are tried again
        /// regardless. For a command someone waits on; an app keeps the default, to connect once
        /// the server or the network is back. Reconnects of an established session always keep
        /// trying: a refused connection then most likely means the server is restarting.
        public var firstConnectFailsFast = false

        public init(url: URL, device: DeviceID, client: ClientInfo = ClientInfo(name: "parley-swift", version: "0.1.0")) {
            self.url = url
            self.device = device
            self.client = client
        }
    }

    /// Exponential backoff with full jitter: attempt n waits random(0…min(maximum, initial·2ⁿ)).
    public struct Backoff: Hashable, Sendable {
        public var initial: Duration = .milliseconds(250)
        public var maximum: Duration = .seconds(30)

        public init(initial: Duration = .milliseconds(250), maximum: Duration = .seconds(30)) {
            self.initial = initial
            self.maximum = maximum
        }

        public func delay(attempt: Int, random: Double) -> Duration {
            let ceiling = min(maximum.seconds, initial.seconds * pow(2, Double(min(attempt, 30))))
            return .milliseconds(Int64(ceiling * 1000 * max(0, min(1, random))))
        }
    }

    public nonisolated let events: AsyncStream<SignalingEvent>
    private let eventSink: AsyncStream<SignalingEvent>.Continuation
    private let configuration: Configuration
    private let transport: any SignalingTransport
    private let tokens: @Sendable () async throws -> String
    private let clock: C
    private let random: @Sendable () -> Double
    private let logger: Logger
    private let codec = WireCodec()

    private struct Pending {
        var text: String
        var continuation: RequestAnswer
        /// When it fails with `.timeout` unless answered.
        var deadline: C.Instant
        /// Requests sent again after a reconnect (pings are not: a new connection needs new ones).
        var resend: Bool
        /// The connection it was last sent on.
        var sentOn: Int?
    }

    private var pending: [String: Pending] = [:]
    private var order: [String] = []
    private var nextRequest = 0
    private var connection: (any SignalingConnection)?
    private var welcome: Welcome?
    /// Whether the current connection has its welcome.
    private var greeted = false
    private var lastSeq = 0
    private var lastAckSent = 0
    /// The client's one task, from `start()` to `stop()` (which cancels it): its children are the
    /// connection loop and the loop that fails requests at their deadlines.
    private var running: Task<Void, Never>?
    /// Wakes the expiry loop when a request starts waiting.
    private let requestsWaiting: AsyncStream<Void>.Continuation
    private let waitingRequests: AsyncStream<Void>
    private var stopped = false
    private var reconnectNow = false
    /// Counts connections, to know which one a request went out on.
    private var generation = 0

    /// - Parameters:
    ///   - tokens: answers a valid access token; asked before every connection attempt.
    ///   - random: a number in 0..<1 for backoff jitter.
    public init(configuration: Configuration, transport: any SignalingTransport, clock: C, logger: Logger,
                random: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) },
                tokens: @escaping @Sendable () async throws -> String) {
        self.configuration = configuration
        self.transport = transport
        self.tokens = tokens
        self.clock = clock
        self.random = random
        self.logger = logger
        (events, eventSink) = AsyncStream.makeStream()
        (waitingRequests, requestsWaiting) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// The current session, while connected.
    public var session: Welcome? { connection == nil ? nil : welcome }

    /// Every session that starts from now on (its `welcome`), for a part of the app that must act on
    /// a new one (a voice room joins again) while the client's owner reads `events`. The stream ends
    /// when the client stops.
    public func sessionStarts() -> AsyncStream<Welcome> {
        let (stream, continuation) = AsyncStream<Welcome>.makeStream(bufferingPolicy: .bufferingNewest(1))
        if stopped { continuation.finish() } else { sessionWatchers.append(continuation) }
        return stream
    }

    /// The streams `sessionStarts()` gave, while their readers keep them.
    private var sessionWatchers: [AsyncStream<Welcome>.Continuation] = []

    /// The last failed attempt since the last session, as `.connectFailed` told it; nil once a
    /// session starts. For an owner that waits for the first connection while another reads `events`.
    public private(set) var lastConnectFailure: SignalingConnectFailure?

    /// Connects, and keeps connecting until `stop()`; fails requests at their deadlines meanwhile
    /// (a request's timeout counts from `submit`, and it fails once the client has started).
    public func start() {
        guard running == nil, !stopped else { return }
        running = Task {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await self.runLoop() }
                group.addTask { await self.expireRequests() }
            }
        }
    }

    /// Disconnects for good; pending requests fail with `.stopped`.
    public func stop() {
        finish(reason: "stopped")
    }

    /// The network changed (Wi-Fi to cellular, say): drop the connection and reconnect at once,
    /// resuming the session.
    public func networkChanged() {
        reconnectNow = true
        connection?.close()
    }

    /// Sends a request and waits for its answer. The request survives reconnects: it is re-sent with
    /// the same id until answered or timed out, and the server never runs it twice.
    /// Sends a request and waits for its answer. Cancelling the waiting task forgets the request:
    /// it is not sent again after a reconnect (if it already left, the server may still run it).
    public func request(_ make: (String) -> ClientMessage) async throws(SignalingError) -> Ack {
        try await submit(make).answer()
    }

    /// Queues a request (sent at once when connected, else after the next welcome) and returns
    /// without waiting for its answer: requests submitted one after another leave in that order.
    /// Its timeout counts from now; a client not yet started fails it only once started.
    public func submit(_ make: (String) -> ClientMessage) -> PendingRequest {
        nextRequest += 1
        let id = "c\(nextRequest)"
        let message = make(id)
        let isPing = if case .ping = message { true } else { false }
        let answer = RequestAnswer()
        guard !stopped else {
            answer.resolve(throwing: SignalingError(code: .stopped, message: "the signaling client has stopped"))
            return PendingRequest(id: id, answer: answer)
        }
        var request = Pending(text: String(decoding: codec.encode(message), as: UTF8.self), continuation: answer,
                              deadline: clock.now.advanced(by: configuration.requestTimeout), resend: !isPing)
        if greeted, let connection {
            connection.send(request.text)
            request.sentOn = generation
        }
        pending[id] = request
        order.append(id)
        requestsWaiting.yield()
        return PendingRequest(id: id, answer: answer)
    }

    /// Fails each request at its deadline: one loop for them all, not a timer each. Every request
    /// has the same timeout, so the oldest waiting is always the next due.
    private func expireRequests() async {
        for await _ in waitingRequests {
            while let next = order.first.flatMap({ pending[$0]?.deadline }) {
                do { try await clock.sleep(until: next, tolerance: nil) } catch { return }
                let now = clock.now
                while let id = order.first, let request = pending[id], request.deadline <= now { expire(id) }
            }
        }
    }

    private func expire(_ id: String) {
        guard let request = resolve(id) else { return }
        request.continuation.resolve(throwing: SignalingError(code: .timeout, message: "no answer within the request timeout"))
    }

    private func resolve(_ id: String) -> Pending? {
        guard let request = pending.removeValue(forKey: id) else { return nil }
        order.removeAll { $0 == id }
        return request
    }

    private func finish(reason: String) {
        guard !stopped else { return }
        stopped = true
        running?.cancel()
        requestsWaiting.finish()
        connection?.close()
        connection = nil
        for id in order {
            resolve(id)?.continuation.resolve(throwing: SignalingError(code: .stopped, message: "the signaling client has stopped"))
        }
        eventSink.yield(.stopped(reason: reason))
        eventSink.finish()
        for watcher in sessionWatchers { watcher.finish() }
        sessionWatchers = []
    }

    // MARK: The connection loop

    private func runLoop() async {
        var attempt = 0
        // The wait chosen when the last attempt failed (and told with the failure).
        var told: Duration?
        while !stopped, !Task.isCancelled {
            if attempt > 0, !reconnectNow {
                let delay = told ?? configuration.backoff.delay(attempt: attempt - 1, random: random())
                logger.debug("reconnecting after a delay", metadata: ["signaling.delay": "\(delay)", "signaling.attempt": "\(attempt)"])
                do { try await clock.sleep(for: delay) } catch { return }
            }
            told = nil
            reconnectNow = false
            attempt += 1
            let opened: any SignalingConnection
            do {
                opened = try await open()
            } catch {
                guard !stopped, !Task.isCancelled else { return }
                let firstConnection = welcome == nil
                let final = firstConnection && configuration.firstConnectFailsFast && error.isLasting
                let delay = final ? nil : configuration.backoff.delay(attempt: attempt - 1, random: random())
                let failure = SignalingConnectFailure(error: error, attempt: attempt, retryIn: delay, firstConnection: firstConnection)
                logger.debug("signaling connection failed", metadata: ["error": "\(error)", "signaling.attempt": "\(attempt)"])
                lastConnectFailure = failure
                eventSink.yield(.connectFailed(failure))
                guard let delay else {
                    finish(reason: "the first connection failed: \(error.message)")
                    return
                }
                told = delay
                continue
            }
            guard !stopped else { opened.close(); return }
            connection = opened
            generation += 1
            let closeCode = await serve(opened, onWelcome: { attempt = 0 })
            connection = nil
            greeted = false
            guard !stopped else { return }
            eventSink.yield(.disconnected(closeCode: closeCode))
            if closeCode == CloseCode.replaced.rawValue {
                finish(reason: "replaced by a newer connection of this device")
                return
            }
        }
    }

    private struct ConnectTimeout: Error {}

    /// One attempt: a token, then a connection within the connect timeout; every failure classified.
    private func open() async throws(SignalingConnectError) -> any SignalingConnection {
        let token: String
        do {
            token = try await tokens()
        } catch {
            throw SignalingConnectError(.other, message: "no access token: \(error)")
        }
        do {
            return try await connect(token: token)
        } catch let error as SignalingConnectError {
            throw error
        } catch is ConnectTimeout {
            throw SignalingConnectError(.timeout, message: "no connection within \(configuration.connectTimeout)")
        } catch {
            throw SignalingConnectError(.other, message: "\(error)")
        }
    }

    private func connect(token: String) async throws -> any SignalingConnection {
        let transport = self.transport
        let url = configuration.url
        let timeout = configuration.connectTimeout
        return try await withThrowingTaskGroup(of: (any SignalingConnection)?.self) { [clock] group in
            group.addTask { try await transport.connect(to: url, token: token) }
            group.addTask {
                try await clock.sleep(for: timeout)
                return nil
            }
            defer { group.cancelAll() }
            guard let first = try await group.next(), let connection = first else { throw ConnectTimeout() }
            return connection
        }
    }

    /// Runs one connection: hello, welcome, frames, heartbeat. Answers the close code.
    private func serve(_ connection: any SignalingConnection, onWelcome: () -> Void) async -> UInt16? {
        let resume = welcome.map { ResumeRequest(session: $0.session, lastSeq: lastSeq) }
        connection.send(String(decoding: codec.encode(.hello(Hello(id: "hello", device: configuration.device,
                                                                   client: configuration.client, resume: resume))), as: UTF8.self))
        // The welcome's heartbeat interval, for the child that keeps the connection alive.
        let (welcomes, welcomed) = AsyncStream.makeStream(of: Duration.self)
        return await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.keepAlive(connection, heartbeats: welcomes) }
            defer { group.cancelAll() }
            for await event in connection.events {
                switch event {
                case .closed(let code):
                    return code
                case .text(let text):
                    guard let frame = try? codec.decodeServerFrame(text) else {
                        logger.debug("ignoring a frame this client cannot read")
                        continue
                    }
                    if case .welcome(let welcome) = frame.message {
                        greeted = true
                        onWelcome()
                        welcomed.yield(.seconds(max(1, welcome.heartbeat)))
                        accept(welcome, on: connection)
                        continue
                    }
                    guard greeted else { continue }
                    receive(frame, on: connection)
                }
            }
            return nil
        }
    }

    /// Closes a connection whose welcome does not come within the welcome timeout; once it has
    /// come, pings at the interval the welcome asks for. Runs as long as the connection does.
    private func keepAlive(_ connection: any SignalingConnection, heartbeats: AsyncStream<Duration>) async {
        let timeout = configuration.welcomeTimeout
        let interval = await withTaskGroup(of: Duration?.self) { [clock] race in
            race.addTask { await heartbeats.first { _ in true } }
            race.addTask {
                try? await clock.sleep(for: timeout)
                return nil
            }
            defer { race.cancelAll() }
            return await race.next() ?? nil
        }
        guard let interval else {
            if !Task.isCancelled {
                logger.debug("no welcome in time; reconnecting")
                connection.close()
            }
            return
        }
        while true {
            do { try await clock.sleep(for: interval) } catch { return }
            await beat(connection)
        }
    }

    private func accept(_ welcome: Welcome, on connection: any SignalingConnection) {
        if !welcome.resumed {
            // A new session numbers frames from 1 again.
            lastSeq = 0
            lastAckSent = 0
        }
        self.welcome = welcome
        lastConnectFailure = nil
        eventSink.yield(.connected(welcome))
        sessionWatchers.removeAll { watcher in
            if case .terminated = watcher.yield(welcome) { true } else { false }
        }
        for id in order {
            guard let request = pending[id] else { continue }
            if request.continuation.isResolved {
                // Its waiter went away (`PendingRequest.answer()` was cancelled): forgotten, not re-sent.
                _ = resolve(id)
            } else if request.resend || request.sentOn == nil {
                connection.send(request.text)
                pending[id]?.sentOn = generation
            } else {
                resolve(id)?.continuation.resolve(throwing: SignalingError(code: .timeout, message: "the connection was lost"))
            }
        }
    }

    private func receive(_ frame: ServerFrame, on connection: any SignalingConnection) {
        if let seq = frame.seq {
            // Frames replayed on resume that already arrived are dropped: each is delivered once.
            guard seq > lastSeq else { return }
            lastSeq = seq
            if lastSeq - lastAckSent >= 32 { sendAck(on: connection) }
        }
        switch frame.message {
        case .ack(let ack):
            resolve(ack.re)?.continuation.resolve(returning: ack)
        case .error(let error):
            if let re = error.re, let request = resolve(re) {
                request.continuation.resolve(throwing: SignalingError.rejected(error))
            } else {
                logger.debug("server error", metadata: ["error.code": "\(error.code)", "error.message": "\(error.message)"])
            }
        case .welcome:
            break
        default:
            eventSink.yield(.message(frame.message))
        }
    }

    private func sendAck(on connection: any SignalingConnection) {
        guard lastSeq > lastAckSent else { return }
        lastAckSent = lastSeq
        connection.send(String(decoding: codec.encode(.ack(SeqAck(seq: lastSeq))), as: UTF8.self))
    }

    private func beat(_ connection: any SignalingConnection) async {
        sendAck(on: connection)
        do {
            _ = try await request { .ping(Ping(id: $0)) }
        } catch {
            // No answer to a ping within the request timeout: the connection is dead.
            if error.code == .timeout, self.connection != nil {
                logger.debug("heartbeat unanswered; reconnecting")
                connection.close()
            }
        }
    }
}

/// A request on its way: `answer()` waits for the server's ack or error.
public struct PendingRequest: Sendable {
    public let id: String
    fileprivate let answer: RequestAnswer

    fileprivate init(id: String, answer: RequestAnswer) {
        self.id = id
        self.answer = answer
    }

    /// The ack, or the error (`rejected` with the server's code, `timeout`, `stopped`); a cancelled
    /// waiter gets `cancelled` at once and the request is forgotten.
    public func answer() async throws(SignalingError) -> Ack {
        let answer = self.answer
        // The client forgets a request answered this way when it next looks at it (a reconnect,
        // its deadline), so a cancellation handler, which cannot await, has nothing to tell it.
        let result = await withTaskCancellationHandler {
            await answer.value()
        } onCancel: {
            answer.resolve(throwing: SignalingError(code: .cancelled, message: "the request was cancelled"))
        }
        return try result.get()
    }
}

/// A request's answer, resolved once (later resolutions are ignored), awaited by at most one waiter.
final class RequestAnswer: @unchecked Sendable {
    private let lock = NSLock()
    private var result: Result<Ack, SignalingError>?
    private var waiter: CheckedContinuation<Result<Ack, SignalingError>, Never>?

    /// Whether it has its outcome (an answer, an error, or its waiter's cancellation).
    var isResolved: Bool { lock.withLock { result != nil } }

    func resolve(returning ack: Ack) { resolve(.success(ack)) }
    func resolve(throwing error: SignalingError) { resolve(.failure(error)) }

    private func resolve(_ outcome: Result<Ack, SignalingError>) {
        let waiter: CheckedContinuation<Result<Ack, SignalingError>, Never>? = lock.withLock {
            guard result == nil else { return nil }
            result = outcome
            defer { self.waiter = nil }
            return self.waiter
        }
        waiter?.resume(returning: outcome)
    }

    func value() async -> Result<Ack, SignalingError> {
        await withCheckedContinuation { continuation in
            let ready: Result<Ack, SignalingError>? = lock.withLock {
                if let result { return result }
                waiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}
