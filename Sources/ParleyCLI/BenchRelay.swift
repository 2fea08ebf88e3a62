import ArgumentParser
import Foundation
import Hummingbird
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import ParleyProtocol

/// The relay path against the same stack's limit: a bare WebSocket echo on Hummingbird, measured
/// beside Parley's relay in the same run, frames per second per server core and memory per idle
/// connection.
struct BenchRelay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "relay",
        abstract: "Parley's relay against a bare Hummingbird WebSocket echo: frames per second per core, memory per connection.",
        discussion: """
            Starts `parley serve` and a bare WebSocket echo server on Hummingbird (`parley bench echo-server`, \
            the same WebSocket stack and settings with nothing behind it) as child processes on loopback. \
            For each: holds --idle idle connections and reads the server's resident growth per connection; \
            then for --seconds keeps --pairs connections busy with a window of --window frames each and \
            counts the frames delivered against the server's own CPU time. On Parley a frame is a \
            `call.signal` (a 110-byte ICE candidate) from caller to callee in an answered call: one frame in, \
            the relayed frame and the sender's ack out, acks from the clients every 32 frames, as the SDK does. \
            On the echo server it is the same text, echoed back. The rounds alternate between the two.
            """
    )

    @Option(help: "Idle connections held on each server to measure memory per connection.")
    var idle: Int = 5000

    @Option(help: "Busy connection pairs (calls on Parley; senders on the echo server).")
    var pairs: Int = 32

    @Option(help: "Frames in flight per pair.")
    var window: Int = 16

    @Option(help: "Seconds each throughput round runs.")
    var seconds: Int = 10

    @Option(help: "Rounds of echo then Parley; the report gives each side's median.")
    var rounds: Int = 3

    func validate() throws {
        guard idle >= 0, pairs >= 1, window >= 1, seconds >= 1, rounds >= 1 else {
            throw ValidationError("--idle must be 0 or more; --pairs, --window, --seconds and --rounds at least 1")
        }
    }

    func run() async throws {
        raiseFileLimit(needing: 2 * idle + 4 * pairs + 100)
        let parley = try ChildServer.start()
        let echoStarted = NIOLockedValueBox<ChildServer?>(nil)
        let signals = ChildServer.onSignals { parley.stop(); echoStarted.withLockedValue { $0 }?.stop() }
        defer { signals.forEach { $0.cancel() }; parley.stop(); echoStarted.withLockedValue { $0 }?.stop() }
        let echo = try ChildServer.startEchoServer()
        echoStarted.withLockedValue { $0 = echo }
        benchLog("parley serve on 127.0.0.1:\(parley.port) (pid \(parley.pid)), echo server on 127.0.0.1:\(echo.port) (pid \(echo.pid))")
        let base = "http://127.0.0.1:\(parley.port)"

        // Memory: idle connections, authenticated and said hello to on Parley.
        benchLog("holding \(idle) idle connections on each server")
        let (echoIdle, echoPerConnection) = try await Self.holdIdle(idle, pid: echo.pid) { _ in
            try await BenchClient.connectRaw(host: "127.0.0.1", port: echo.port, path: "/", token: nil)
        }
        // Every Parley connection stays within its heartbeat from the moment it is open.
        let sessions = NIOLockedValueBox<[BenchClient]>([])
        let heartbeat = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(10))
                for client in sessions.withLockedValue({ $0 }) { client.send(#"{"type":"ping","id":"hb-\#(UUID().uuidString.prefix(8))"}"#) }
            }
        }
        defer { heartbeat.cancel() }
        let (parleyIdle, parleyPerConnection) = try await Self.holdIdle(idle, pid: parley.pid) { index in
            let token = try await BenchClient.devToken(base: base, user: "idle\(index)")
            let client = try await BenchClient.connect(host: "127.0.0.1", port: parley.port, token: token, device: "d\(index)")
            sessions.withLockedValue { $0.append(client) }
            return client
        }

        // Throughput: answered calls on Parley, plain connections on the echo server.
        benchLog("setting up \(pairs) calls on Parley and \(pairs) connections on the echo server")
        var calls: [(caller: BenchClient, callee: BenchClient, call: String)] = []
        for index in 0..<pairs {
            let caller = try await BenchClient.connect(host: "127.0.0.1", port: parley.port,
                                                       token: try await BenchClient.devToken(base: base, user: "caller\(index)"), device: "c")
            let callee = try await BenchClient.connect(host: "127.0.0.1", port: parley.port,
                                                       token: try await BenchClient.devToken(base: base, user: "callee\(index)"), device: "c")
            let call = CallID.random().rawValue
            try await caller.request("call.invite", #""call":"\#(call)","to":"callee\#(index)","media":{"audio":true,"video":false}"#)
            _ = try await callee.expect(type: "call.incoming", call: call)
            try await callee.request("call.accept", #""call":"\#(call)""#)
            _ = try await caller.expect(type: "call.accepted", call: call)
            calls.append((caller, callee, call))
            sessions.withLockedValue { $0 += [caller, callee] }
        }
        var senders: [BenchClient] = []
        for _ in 0..<pairs { senders.append(try await BenchClient.connectRaw(host: "127.0.0.1", port: echo.port, path: "/", token: nil)) }

        let candidate = #"{"candidate":"candidate:1 1 udp 2122260223 127.0.0.1 50000 typ host","sdpMid":"0","sdpMLineIndex":0}"#
        var echoRounds: [Round] = [], parleyRounds: [Round] = []
        for round in 1...rounds {
            benchLog("round \(round)/\(rounds): echo server")
            let echoRound = try await Self.measure(pid: echo.pid, seconds: seconds, workers: senders.map { sender in
                { [window] in
                    let frame = #"{"type":"call.signal","id":"e","call":"00000000-0000-4000-8000-000000000000","candidate":\#(candidate)}"#
                    for _ in 0..<window { sender.send(frame) }
                    for _ in 0..<window { _ = try await sender.expect(type: "call.signal", call: nil) }
                    return window
                }
            })
            echoRounds.append(echoRound)
            benchLog("round \(round)/\(rounds): Parley")
            let parleyRound = try await Self.measure(pid: parley.pid, seconds: seconds, workers: calls.map { pair in
                { [window] in
                    var ids: [String] = []
                    for _ in 0..<window { ids.append(pair.caller.sendRequest("call.signal", #""call":"\#(pair.call)","candidate":\#(candidate)"#)) }
                    // Answers first: a refused frame fails the run instead of leaving the callee waiting.
                    for id in ids { try await pair.caller.awaitAnswer(to: id) }
                    for _ in 0..<window { _ = try await pair.callee.expect(type: "call.signal", call: pair.call) }
                    return window
                }
            })
            parleyRounds.append(parleyRound)
        }
        for client in senders + parleyIdle + echoIdle + calls.flatMap({ [$0.caller, $0.callee] }) { client.close() }

        let echoMedian = Round.median(echoRounds), parleyMedian = Round.median(parleyRounds)
        var report = """

            Relay against a bare Hummingbird WebSocket echo (\(ProcessInfo.processInfo.activeProcessorCount) cores, \(pairs) pairs, window \(window), \(rounds) rounds of \(seconds) s, medians)
              frames delivered        echo \(format(echoMedian.framesPerSecond))/s, Parley \(format(parleyMedian.framesPerSecond))/s
              server CPU              echo \(format(echoMedian.cpuShare * 100)) %, Parley \(format(parleyMedian.cpuShare * 100)) % of one core
              frames per core-second  echo \(format(echoMedian.framesPerCoreSecond)), Parley \(format(parleyMedian.framesPerCoreSecond)) (Parley/echo \(format(parleyMedian.framesPerCoreSecond / echoMedian.framesPerCoreSecond)))
              each round              echo \(echoRounds.map { format($0.framesPerCoreSecond) }.joined(separator: ", ")); Parley \(parleyRounds.map { format($0.framesPerCoreSecond) }.joined(separator: ", "))
            """
        if idle > 0 {
            report += """

                  memory per idle connection  echo \(format(echoPerConnection / 1024)) KiB, Parley \(format(parleyPerConnection / 1024)) KiB (\(idle) each)
                """
        }
        print(report)
    }

    /// Opens `count` connections 100 at a time and answers them with the server's resident growth per connection.
    static func holdIdle(_ count: Int, pid: Int32, open: @escaping @Sendable (Int) async throws -> BenchClient) async throws -> ([BenchClient], Double) {
        guard count > 0 else { return ([], 0) }
        let before = residentBytes(pid: pid)
        var clients: [BenchClient] = []
        clients.reserveCapacity(count)
        var next = 0
        while next < count {
            let batch = next..<min(count, next + 100)
            clients += try await withThrowingTaskGroup(of: BenchClient.self) { group in
                for index in batch { group.addTask { try await open(index) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            next = batch.upperBound
        }
        try await Task.sleep(for: .milliseconds(500))
        return (clients, Double(residentBytes(pid: pid) - before) / Double(count))
    }

    struct Round {
        var frames: Int
        var seconds: Double
        var cpuSeconds: Double

        var framesPerSecond: Double { Double(frames) / seconds }
        var cpuShare: Double { cpuSeconds / seconds }
        var framesPerCoreSecond: Double { Double(frames) / max(cpuSeconds, 0.001) }

        /// The round with the median frames per core-second.
        static func median(_ rounds: [Round]) -> Round {
            rounds.sorted { $0.framesPerCoreSecond < $1.framesPerCoreSecond }[rounds.count / 2]
        }
    }

    /// Runs every worker (one burst per call: the frames it delivered) again and again for
    /// `seconds`, and counts the frames against the server's CPU time.
    static func measure(pid: Int32, seconds: Int, workers: [@Sendable () async throws -> Int]) async throws -> Round {
        let cpuBefore = cpuSeconds(pid: pid)
        let start = ContinuousClock.now
        let deadline = start + .seconds(seconds)
        let frames = try await withThrowingTaskGroup(of: Int.self) { group in
            for worker in workers {
                group.addTask {
                    var frames = 0
                    while ContinuousClock.now < deadline { frames += try await worker() }
                    return frames
                }
            }
            return try await group.reduce(0, +)
        }
        return Round(frames: frames, seconds: ParleyCLI.seconds(ContinuousClock.now - start), cpuSeconds: cpuSeconds(pid: pid) - cpuBefore)
    }
}

/// `parley bench echo-server`: a bare WebSocket echo on Hummingbird, the peer of Parley's relay.
/// The same WebSocket stack and settings as `parley serve`, and nothing behind them.
struct BenchEchoServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "echo-server",
        abstract: "A bare WebSocket echo server on Hummingbird (the peer `parley bench relay` measures against).",
        shouldDisplay: false
    )

    @Option(help: "Loopback port to listen on (0 picks a free one).")
    var port: Int = 0

    func run() async throws {
        let app = Application(
            router: Router(),
            server: .http1WebSocketUpgrade(
                configuration: .init(ws: .init(maxFrameSize: 1 << 16, autoPing: .disabled)),
                shouldUpgrade: { _, _, _ in
                    .upgrade([:]) { inbound, outbound, _ in
                        for try await message in inbound.messages(maxSize: 1 << 16) {
                            if case .text(let text) = message { try await outbound.write(.text(text)) }
                        }
                    }
                }
            ),
            configuration: .init(address: .hostname("127.0.0.1", port: port), serverName: "echo"),
            onServerRunning: { channel in
                // Unbuffered: the parent reads the port from a pipe.
                FileHandle.standardOutput.write(Data("echo server on 127.0.0.1:\(channel.localAddress?.port ?? 0)\n".utf8))
            },
            logger: Logger(label: "echo", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        try await app.runService()
    }
}
