import ArgumentParser
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ParleyKit
import ParleyNIOTransport
import ParleyProtocol
import ParleyServer
#if canImport(Glibc)
import Glibc
#endif

/// The chaos soak: many devices run random call flows through the SDK's signaling client against a
/// `parley serve` child process, through a proxy that delays frames and cuts connections, while the
/// server is killed (SIGKILL) and restarted, or stopped for a deploy (SIGTERM) and started again.
/// Then it settles and checks: every call a caller was told exists is in the store, nothing is in
/// the store that nobody asked for, every call ended once with a reason, nothing rings, no device was
/// told twice that a call ended, and the server's memory came back to its level.
struct BenchSoak: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "soak",
        abstract: "Chaos soak: random call flows while connections are cut, frames delayed and the server killed.",
        discussion: """
            Exits 1 when an invariant broke, printing which. --seed fixes the devices' choices and the chaos \
            schedule; the timing they meet (and so a run) is not reproducible.
            """
    )

    @Option(help: "Users; every third has two devices.")
    var users: Int = 12

    @Option(help: "Seconds of chaos (the settling and the checks come after).")
    var seconds: Int = 60

    @Option(help: "Mean seconds between server kills or restarts (0: never).")
    var killEvery: Double = 15

    @Option(help: "Mean seconds between connection cuts (0: never).")
    var cutEvery: Double = 1

    @Option(help: "The most a frame is held in the proxy, milliseconds.")
    var maxDelayMs: Int = 150

    @Option(help: "Seed of the devices' choices and the chaos schedule.")
    var seed: UInt64 = 1

    func validate() throws {
        guard users >= 2 else { throw ValidationError("--users must be at least 2") }
        guard seconds >= 5 else { throw ValidationError("--seconds must be at least 5") }
        guard killEvery >= 0, cutEvery >= 0, maxDelayMs >= 0 else { throw ValidationError("intervals and delays cannot be negative") }
    }

    func run() async throws {
        let started = ContinuousClock.now
        func log(_ line: String) {
            let elapsed = (ContinuousClock.now - started).components.seconds
            FileHandle.standardOutput.write(Data((String(format: "[%4ds] ", elapsed) + line + "\n").utf8))
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-soak-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = directory.appendingPathComponent("soak.sqlite").path
        let ringTimeout = 6

        let server = try SoakServer(database: database, ringTimeout: ringTimeout)
        let stopOnSignal = server.stopOnSignals()
        defer { server.stopNow(); _ = stopOnSignal }
        let proxy = try await ChaosProxy.start(target: server.port, maxDelayMs: maxDelayMs)
        log("server pid \(server.pid) on port \(server.port); proxy on port \(proxy.port); database \(database)")

        let random = SoakRandom(seed: seed)
        let ledger = SoakLedger()
        var devices: [SoakDevice] = []
        let names = (0..<users).map { UserID(rawValue: "soak\($0)")! }
        for (index, user) in names.enumerated() {
            let token = try await server.token(for: user)
            for device in index % 3 == 0 ? ["phone", "laptop"] : ["phone"] {
                devices.append(SoakDevice(user: user, device: DeviceID(rawValue: device)!, token: token, proxyPort: proxy.port,
                                          others: names.filter { $0 != user }, random: random.fork(), ledger: ledger))
            }
        }
        for device in devices { await device.start() }
        log("\(devices.count) devices of \(users) users connecting")
        try await Task.sleep(for: .seconds(2))

        // Chaos. The server is killed or restarted only in the first two thirds: the last third
        // runs one process, so its memory can be compared from there to the end.
        var kills = 0, restarts = 0, cuts = 0
        let chaosEnd = ContinuousClock.now + .seconds(seconds)
        let killsEnd = ContinuousClock.now + .seconds(seconds * 2 / 3)
        var baselineMiB: Int?
        let everyone = devices
        let actors = Task {
            await withTaskGroup(of: Void.self) { group in
                for device in everyone { group.addTask { await device.act(until: chaosEnd) } }
            }
        }
        var nextKill = killEvery > 0 ? ContinuousClock.now + .seconds(random.exponential(mean: killEvery)) : chaosEnd
        var nextCut = cutEvery > 0 ? ContinuousClock.now + .seconds(random.exponential(mean: cutEvery)) : chaosEnd
        while ContinuousClock.now < chaosEnd {
            let next = min(nextKill, nextCut, chaosEnd, baselineMiB == nil ? killsEnd + .seconds(3) : chaosEnd)
            try await Task.sleep(until: next)
            if baselineMiB == nil, ContinuousClock.now >= killsEnd + .seconds(3) {
                baselineMiB = server.residentMiB
                log("the last third: no more restarts; server memory \(baselineMiB ?? 0) MiB")
            }
            if ContinuousClock.now >= nextCut && cutEvery > 0 {
                cuts += proxy.cut(count: 1 + random.below(3))
                nextCut = ContinuousClock.now + .seconds(random.exponential(mean: cutEvery))
            }
            if ContinuousClock.now >= nextKill && killEvery > 0 {
                guard ContinuousClock.now < killsEnd else {
                    nextKill = chaosEnd
                    continue
                }
                let graceful = random.below(3) == 0
                let rss = server.residentMiB
                if graceful { await server.stop() } else { await server.kill() }
                await ledger.killed(graceful: graceful)
                graceful ? (restarts += 1) : (kills += 1)
                try await Task.sleep(for: .milliseconds(300 + random.below(1200)))
                try await server.restart()
                log("server \(graceful ? "stopped (SIGTERM)" : "killed (SIGKILL)") at \(rss) MiB and started again: pid \(server.pid)")
                nextKill = ContinuousClock.now + .seconds(random.exponential(mean: killEvery))
            }
        }
        await actors.value
        proxy.maxDelayMs = 0
        log("chaos over: \(cuts) connections cut, \(kills) kills, \(restarts) graceful restarts; \(proxy.framesDelayed) frames delayed")

        // Settle: everyone connected, every call hung up by whoever thinks it is in it, the ring
        // timeout passed; then every call any device still holds must be over on the server.
        for device in devices { await device.waitConnected(for: .seconds(30)) }
        for device in devices { await device.hangUpEverything() }
        try await Task.sleep(for: .seconds(ringTimeout + 3))
        for device in devices { await device.reconcile() }
        try await Task.sleep(for: .seconds(1))
        let metrics = try await server.metrics()
        let endMiB = server.residentMiB
        for device in devices { await device.stop() }
        await server.stop()   // graceful: every record written
        try? await proxy.close()

        // Check.
        let store = try SQLiteStore(path: database)
        var records: [CallRecord] = []
        for name in names { records += try await store.calls(of: name, limit: 100_000) }
        var unique: [CallID: CallRecord] = [:]
        for record in records { unique[record.call] = record }
        let summary = await ledger.summary()
        var broken: [String] = await ledger.violations()
        var lostToCrash = 0
        for (call, at) in summary.acknowledged where unique[call] == nil {
            // protocol.md: a crash loses at most the batch of records being written. A call
            // acknowledged in the last moments before a SIGKILL may be that batch; any other is lost.
            if summary.kills.contains(where: { $0 >= at && $0 - at < .seconds(1) }) {
                lostToCrash += 1
            } else {
                broken.append("call \(call): its caller was told it exists; it is not in the store")
            }
        }
        for call in unique.keys where !summary.sent.contains(call) { broken.append("call \(call) is in the store; nobody invited it") }
        for record in unique.values where record.endedAt == nil || record.reason == nil {
            broken.append("call \(record.call) is stored without an end: \(record)")
        }
        for state in ["ringing", "active"] {
            guard let count = metrics[#"parley_calls{state="\#(state)"}"#] else {
                broken.append("the server's metrics have no gauge of \(state) calls")
                continue
            }
            if count != 0 { broken.append("the server still counts \(Int(count)) \(state) calls") }
        }
        let reasons = Dictionary(grouping: unique.values, by: { $0.reason?.rawValue ?? "none" }).mapValues(\.count)
        log("""
            \(summary.sent.count) invites sent, \(summary.acknowledged.count) acknowledged, \(unique.count) calls stored\
            \(lostToCrash > 0 ? " (\(lostToCrash) acknowledged within a second before a SIGKILL and lost with it)" : ""); \
            ended by: \(reasons.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
            """)
        if let baselineMiB, baselineMiB > 0, endMiB > 0 {
            log("server memory: \(baselineMiB) MiB at the start of the last third, \(endMiB) MiB once every call had ended")
            if endMiB > baselineMiB * 5 / 4 + 16 { broken.append("server memory grew from \(baselineMiB) to \(endMiB) MiB") }
        } else {
            broken.append("the server's memory could not be read (\(baselineMiB ?? 0), \(endMiB) MiB)")
        }
        if broken.isEmpty {
            log("every check held")
        } else {
            for line in broken.prefix(20) { log("BROKEN: \(line)") }
            throw ExitCode(1)
        }
    }
}

/// A seeded generator shared by the soak's tasks (splitmix64).
final class SoakRandom: @unchecked Sendable {
    private let lock = NIOLock()
    private var state: UInt64

    init(seed: UInt64) { state = seed &+ 0x9E37_79B9_7F4A_7C15 }

    func next() -> UInt64 {
        lock.withLock {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    func fork() -> SoakRandom { SoakRandom(seed: next()) }
    func below(_ bound: Int) -> Int { bound <= 0 ? 0 : Int(next() % UInt64(bound)) }
    func chance(_ probability: Double) -> Bool { unit() < probability }
    func unit() -> Double { Double(next() >> 11) / Double(1 << 53) }
    func exponential(mean: Double) -> Double { -mean * log(1 - unit()) }
}

/// What every device saw, for the checks.
actor SoakLedger {
    struct Summary {
        var sent: Set<CallID> = []
        /// When each caller saw its invite acknowledged.
        var acknowledged: [CallID: ContinuousClock.Instant] = [:]
        /// When the server was killed or stopped.
        var kills: [ContinuousClock.Instant] = []
    }

    private var summaryValue = Summary()
    private var broken: [String] = []

    func sent(_ call: CallID) { summaryValue.sent.insert(call) }
    func acknowledged(_ call: CallID) { summaryValue.acknowledged[call] = summaryValue.acknowledged[call] ?? .now }
    /// Only SIGKILLs can lose records; a graceful stop writes them all.
    func killed(graceful: Bool) { if !graceful { summaryValue.kills.append(.now) } }
    func violation(_ text: String) { broken.append(text) }
    func summary() -> Summary { summaryValue }
    func violations() -> [String] { broken }
}

/// One device: the SDK's signaling client (reconnect, resume, requests re-sent under their ids)
/// and a random user on top of it.
actor SoakDevice {
    enum Role { case caller, callee }
    struct Call {
        var role: Role
        var peer: UserID
        var answered = false
        var held = false
    }

    let user: UserID
    let device: DeviceID
    let others: [UserID]
    let random: SoakRandom
    let ledger: SoakLedger
    let client: SignalingClient<ContinuousClock>
    private var calls: [CallID: Call] = [:]
    private var endedHere: Set<CallID> = []
    /// The calls a `call.ended` frame was received for. Apart from `endedHere`: an answer that
    /// says a call is over (a hangup's ack, `call.state`) and the `call.ended` frame sent just
    /// before it reach this actor in either order (the SDK orders events among themselves only).
    private var toldEnded: Set<CallID> = []
    private var connected = false
    private var events: Task<Void, Never>?

    var name: String { "\(user)/\(device)" }

    init(user: UserID, device: DeviceID, token: String, proxyPort: Int, others: [UserID], random: SoakRandom, ledger: SoakLedger) {
        self.user = user
        self.device = device
        self.others = others
        self.random = random
        self.ledger = ledger
        var configuration = SignalingClient<ContinuousClock>.Configuration(
            url: URL(string: "ws://127.0.0.1:\(proxyPort)/v1/signal")!, device: device,
            client: ClientInfo(name: "parley-soak", version: "1", platform: .linux))
        configuration.backoff = .init(initial: .milliseconds(100), maximum: .seconds(2))
        configuration.requestTimeout = .seconds(30)
        client = SignalingClient(configuration: configuration, transport: WebSocketSignalingTransport(), clock: ContinuousClock(),
                                 logger: Logger(label: "soak", factory: { _ in SwiftLogNoOpLogHandler() }), tokens: { token })
    }

    func start() async {
        let stream = client.events
        events = Task { for await event in stream { await self.handle(event) } }
        await client.start()
    }

    func stop() async {
        await client.stop()
        events?.cancel()
    }

    func waitConnected(for limit: Duration) async {
        let deadline = ContinuousClock.now + limit
        while !connected, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
        if !connected { await ledger.violation("\(name) did not reconnect after the chaos") }
    }

    /// A user's random actions until `end`.
    func act(until end: ContinuousClock.Instant) async {
        while ContinuousClock.now < end {
            try? await Task.sleep(for: .milliseconds(100 + random.below(700)))
            guard connected else { continue }
            if random.chance(0.03) {
                await client.networkChanged()   // drop and resume, as on a network change
                continue
            }
            if calls.isEmpty, random.chance(0.35) {
                let call = CallID(rawValue: UUID().uuidString.lowercased())!
                let peer = others[random.below(others.count)]
                calls[call] = Call(role: .caller, peer: peer)
                await ledger.sent(call)
                let client = client
                Task {
                    do {
                        _ = try await client.request { .callInvite(CallInvite(id: $0, call: call, to: peer)) }
                        await self.ledger.acknowledged(call)
                    } catch {
                        // Given up (the server was away too long): whether the call exists is the
                        // server's to say, as after a lost session.
                        await self.checkState(of: call)
                    }
                }
                continue
            }
            let ids = calls.keys.sorted { $0.rawValue < $1.rawValue }
            guard !ids.isEmpty else { continue }
            let id = ids[random.below(ids.count)]
            guard let call = calls[id] else { continue }
            if call.answered {
                if random.chance(0.3) {
                    calls[id]?.held.toggle()
                    let held = calls[id]?.held ?? false
                    send { .callUpdate(CallUpdate(id: $0, call: id, held: held)) }
                } else if random.chance(0.25) {
                    hangUp(id)
                }
            } else if call.role == .caller, random.chance(0.2) {
                hangUp(id)   // cancel before an answer
            }
        }
    }

    private func over(_ call: CallID) {
        if calls.removeValue(forKey: call) != nil { endedHere.insert(call) }
    }

    private func send(_ make: @escaping @Sendable (String) -> ClientMessage) {
        let client = client
        Task { _ = try? await client.submit(make).answer() }
    }

    private func hangUp(_ call: CallID) {
        finish(call) { .callHangup(CallHangup(id: $0, call: call)) }
    }

    /// Sends what ends the call for this device (a hangup, a decline); once the server took it, or
    /// says the call is over or unknown, the device is out of it (nobody tells it so: the server
    /// sends `call.ended` to the others).
    private func finish(_ call: CallID, _ make: @escaping @Sendable (String) -> ClientMessage) {
        let client = client
        Task {
            do {
                _ = try await client.request(make)
                self.over(call)
            } catch let error as SignalingError where error.serverCode == .callEnded || error.serverCode == .callNotFound {
                self.over(call)
            } catch {}
        }
    }

    func hangUpEverything() {
        for call in calls.keys { hangUp(call) }
    }

    /// After the settling: what this device still thinks is going on must be over on the server too.
    func reconcile() async {
        for id in calls.keys.sorted(by: { $0.rawValue < $1.rawValue }) {
            do {
                let state = try await client.request { .callState(CallRequest(id: $0, call: id)) }
                let result = try state.decodeResult(CallStateResult.self)
                if result.state != .ended { await ledger.violation("\(name): call \(id) is still \(result.state) after everyone hung up") }
            } catch {
                await ledger.violation("\(name): call.state for call \(id), which it holds, answered \(error)")
            }
        }
    }

    private func handle(_ event: SignalingEvent) async {
        switch event {
        case .connected(let welcome):
            connected = true
            if !welcome.resumed {
                // A new session: what happened meanwhile is asked for, as the SDK's CallManager does.
                for id in calls.keys {
                    Task { await self.checkState(of: id) }
                }
            }
        case .disconnected:
            connected = false
        case .connectFailed:
            break
        case .stopped:
            connected = false
        case .message(let message):
            await handle(message)
        }
    }

    private func checkState(of id: CallID) async {
        do {
            let state = try await client.request { .callState(CallRequest(id: $0, call: id)) }
            if let result = try? state.decodeResult(CallStateResult.self), result.state == .ended { over(id) }
        } catch where error.serverCode == .callNotFound {
            over(id)
        } catch {}
    }

    private func handle(_ message: ServerMessage) async {
        switch message {
        case .callIncoming(let incoming):
            guard calls[incoming.call] == nil, !endedHere.contains(incoming.call) else { return }
            calls[incoming.call] = Call(role: .callee, peer: incoming.from.user)
            send { .callRinging(CallRingingRequest(id: $0, call: incoming.call)) }
            let choice = random.unit()
            let delay = Duration.milliseconds(100 + random.below(1500))
            Task {
                try? await Task.sleep(for: delay)
                self.answerIncoming(incoming.call, choice: choice)
            }
        case .callAccepted(let accepted):
            calls[accepted.call]?.answered = true
        case .callEnded(let ended):
            endedHere.insert(ended.call)
            if !toldEnded.insert(ended.call).inserted {
                await ledger.violation("\(name) was told twice that call \(ended.call) ended (\(ended.reason))")
            }
            calls[ended.call] = nil
        default:
            break
        }
    }

    private func answerIncoming(_ call: CallID, choice: Double) {
        guard calls[call] != nil, calls[call]?.answered == false else { return }
        if choice < 0.65 {
            calls[call]?.answered = true
            send { .callAccept(CallRequest(id: $0, call: call)) }
        } else if choice < 0.85 {
            finish(call) { .callDecline(CallDecline(id: $0, call: call)) }
        }   // else: let it ring out
    }
}

/// `parley serve` as a child process with a file database, on a port kept across restarts.
final class SoakServer: @unchecked Sendable {
    private let database: String
    private let ringTimeout: Int
    private var process: Process
    private(set) var port: Int = 0

    init(database: String, ringTimeout: Int) throws {
        self.database = database
        self.ringTimeout = ringTimeout
        process = Process()
        try launch(port: 0)
    }

    var pid: Int32 { process.processIdentifier }
    var residentMiB: Int { residentBytes(pid: pid) >> 20 }

    private func launch(port requested: Int) throws {
        (process, port) = try ChildServer.launch(["--port", "\(requested)", "--database", database, "--log-level", "error",
                                                  "--http-rate-limit", "0", "--ring-timeout", "\(ringTimeout)"])
    }

    func restart() async throws {
        try await Self.offThePool { try self.launch(port: self.port) }
    }

    /// SIGKILL, and wait for it to be gone.
    func kill() async {
        await Self.offThePool { [process] in
            guard process.isRunning else { return }
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    /// SIGTERM (the graceful path), and wait for it to be gone.
    func stop() async {
        await Self.offThePool { [self] in stopNow() }
    }

    func stopNow() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }

    /// Runs blocking work (a child's start, its exit) on a thread of its own, not Swift's few.
    static func offThePool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try work() }) }.start()
        }
    }

    static func offThePool(_ work: @escaping @Sendable () -> Void) async {
        await withCheckedContinuation { continuation in
            Thread {
                work()
                continuation.resume()
            }.start()
        }
    }

    func stopOnSignals() -> [any DispatchSourceSignal] {
        ChildServer.onSignals { [self] in stopNow() }
    }

    func token(for user: UserID) async throws -> String {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/dev/tokens")!)
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = try JSONEncoder().encode(DevTokenRequest(user: user, name: user.rawValue))
        let (data, _) = try await URLSession.shared.data(for: request)
        return try JSONDecoder().decode(DevTokenResponse.self, from: data).token
    }

    /// The metrics' samples, by name and labels as exposed.
    func metrics() async throws -> [String: Double] { try await metricSamples(port: port) }
}

/// A TCP proxy in front of the server: delays what passes (in order) and cuts connections on demand.
final class ChaosProxy: @unchecked Sendable {
    private let channel: any Channel
    private let pairs = NIOLockedValueBox([ObjectIdentifier: (any Channel, any Channel)]())
    private let delayed = NIOLockedValueBox(0)
    private let maximumDelay: NIOLockedValueBox<Int>
    let port: Int

    var framesDelayed: Int { delayed.withLockedValue { $0 } }
    var maxDelayMs: Int {
        get { maximumDelay.withLockedValue { $0 } }
        set { maximumDelay.withLockedValue { $0 = newValue } }
    }

    private init(channel: any Channel, maxDelayMs: Int) {
        self.channel = channel
        self.port = channel.localAddress?.port ?? 0
        maximumDelay = NIOLockedValueBox(maxDelayMs)
    }

    static func start(target: Int, maxDelayMs: Int) async throws -> ChaosProxy {
        let box = NIOLockedValueBox<ChaosProxy?>(nil)
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { inbound in
                guard let proxy = box.withLockedValue({ $0 }) else { return inbound.close() }
                return proxy.attach(inbound, target: target)
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let proxy = ChaosProxy(channel: channel, maxDelayMs: maxDelayMs)
        box.withLockedValue { $0 = proxy }
        return proxy
    }

    private func attach(_ inbound: any Channel, target: Int) -> EventLoopFuture<Void> {
        let loop = inbound.eventLoop
        return ClientBootstrap(group: loop)
            .connectTimeout(.seconds(2))
            .connect(host: "127.0.0.1", port: target)
            .flatMap { outbound in
                let key = ObjectIdentifier(inbound)
                self.pairs.withLockedValue { $0[key] = (inbound, outbound) }
                // Each side's relay closes the other once what it holds for it is written.
                let forget: @Sendable (Result<Void, any Error>) -> Void = { _ in
                    _ = self.pairs.withLockedValue { $0.removeValue(forKey: key) }
                }
                inbound.closeFuture.whenComplete(forget)
                outbound.closeFuture.whenComplete(forget)
                return inbound.pipeline.addHandler(Relay(partner: outbound, proxy: self)).flatMap {
                    outbound.pipeline.addHandler(Relay(partner: inbound, proxy: self))
                }
            }
            .flatMapError { _ in inbound.close() }   // the server is down: so is this connection
    }

    /// Cuts up to `count` connections; answers how many.
    func cut(count: Int) -> Int {
        let chosen = pairs.withLockedValue { Array($0.values.shuffled().prefix(count)) }
        for (inbound, outbound) in chosen {
            inbound.close(promise: nil)
            outbound.close(promise: nil)
        }
        return chosen.count
    }

    func close() async throws {
        _ = cut(count: Int.max)
        try await channel.close()
    }

    func delay() -> TimeAmount {
        let most = maxDelayMs
        guard most > 0 else { return .zero }
        delayed.withLockedValue { $0 += 1 }
        return .milliseconds(Int64.random(in: 0...Int64(most)))
    }

    /// Writes what one side reads to the other, each chunk after a random delay, never out of order:
    /// chunks wait in a queue in the order they came, each due no earlier than the one before. When
    /// this side closes, the other is closed once the queue is written (a server's last frames and
    /// its close reach the client, as they would without the proxy).
    final class Relay: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        private let partner: any Channel
        private let proxy: ChaosProxy
        private var queue: [(due: NIODeadline, bytes: ByteBuffer)] = []
        private var lastDue = NIODeadline.uptimeNanoseconds(0)
        private var closing = false

        init(partner: any Channel, proxy: ChaosProxy) {
            self.partner = partner
            self.proxy = proxy
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let bytes = unwrapInboundIn(data)
            let due = max(lastDue, .now() + proxy.delay())
            lastDue = due
            if queue.isEmpty, due <= .now() {
                partner.writeAndFlush(bytes, promise: nil)
                return
            }
            queue.append((due, bytes))
            context.eventLoop.scheduleTask(deadline: due) { self.drain() }
        }

        func channelInactive(context: ChannelHandlerContext) {
            closing = true
            drain()
            context.fireChannelInactive()
        }

        /// Writes every chunk that is due, in order; closes the partner after the last once closing.
        private func drain() {
            let now = NIODeadline.now()
            while let first = queue.first, first.due <= now || (closing && !partner.isActive) {
                queue.removeFirst()
                partner.writeAndFlush(first.bytes, promise: nil)
            }
            if closing, queue.isEmpty { partner.close(promise: nil) }
        }
    }
}
