import ArgumentParser
import Foundation
import HTTPTypes
import Logging
import NIOCore
import NIOPosix
import ParleyProtocol
import ParleyWebSocket
#if canImport(Glibc)
import Glibc
#endif

/// Load generator for the signaling server: many authenticated connections held open, and complete
/// call setups between pairs of them. Prints numbers; asserts nothing.
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Benchmarks that print numbers: the signaling server, and calls against headless Chromium.",
        subcommands: [BenchSignaling.self, BenchNodes.self, BenchHold.self, BenchRelay.self, BenchEchoServer.self, BenchCalls.self,
                      BenchRooms.self, BenchSoak.self],
        defaultSubcommand: BenchSignaling.self
    )
}

struct BenchSignaling: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "signaling",
        abstract: "Measure the signaling server: connections held, call setups per second, relay latency, memory.",
        discussion: """
            Starts `parley serve` as a child process on a loopback port (or uses --server) and drives it over \
            loopback. A call setup is the whole cycle: invite → incoming → ringing → accept → offer and answer \
            relayed → two candidates each way and end-of-candidates → hangup → ended.
            """
    )

    @Option(help: "Concurrent authenticated connections to hold open.")
    var connections: Int = 2000

    @Option(help: "Call setups to run in all.")
    var calls: Int = 4000

    @Option(help: "Call setups running at once (pairs of connections busy at a time).")
    var concurrency: Int = 64

    @Option(help: "A running server's base URL (http://host:port) in development mode; by default one is started.")
    var server: String?

    func validate() throws {
        guard connections >= 2 else { throw ValidationError("--connections must be at least 2") }
        guard concurrency >= 1, concurrency * 2 <= connections else {
            throw ValidationError("--concurrency needs two connections per call: at most --connections / 2")
        }
        guard calls >= 1 else { throw ValidationError("--calls must be at least 1") }
    }

    func run() async throws {
        raiseFileLimit(needing: connections * 2 + 100)
        var child: ChildServer?
        let base: String
        if let server {
            base = server
        } else {
            let started = try ChildServer.start()
            child = started
            base = "http://127.0.0.1:\(started.port)"
        }
        defer { child?.stop() }
        // Interrupted (Ctrl-C, a timeout's SIGTERM): stop the server we started before going.
        let signals = child.map { ChildServer.stopOnSignals($0) } ?? []
        defer { signals.forEach { $0.cancel() } }
        let host = URL(string: base)!.host!
        let port = URL(string: base)!.port!
        benchLog("server \(base)\(child.map { " (pid \($0.pid))" } ?? "")")
        let rssBefore = child.map { residentBytes(pid: $0.pid) }

        // Tokens come from the server's development endpoint, as a real client's would.
        benchLog("minting \(connections) tokens")
        var tokens: [String] = []
        tokens.reserveCapacity(connections)
        for index in 0..<connections { tokens.append(try await BenchClient.devToken(base: base, user: "bench\(index)")) }
        let allTokens = tokens

        benchLog("opening \(connections) connections")
        let openStart = ContinuousClock.now
        let clients = try await withThrowingTaskGroup(of: (Int, BenchClient).self) { group in
            var clients = [BenchClient?](repeating: nil, count: connections)
            var next = 0
            // At most 200 handshakes in flight: a connection storm is not what this measures.
            while next < min(200, connections) {
                let index = next
                let token = allTokens[index]
                group.addTask { (index, try await BenchClient.connect(host: host, port: port, token: token, device: "d\(index)")) }
                next += 1
            }
            while let (index, client) = try await group.next() {
                clients[index] = client
                if next < connections {
                    let index = next
                    let token = allTokens[index]
                    group.addTask { (index, try await BenchClient.connect(host: host, port: port, token: token, device: "d\(index)")) }
                    next += 1
                }
            }
            return clients.map { $0! }
        }
        let openSeconds = seconds(ContinuousClock.now - openStart)
        try await Task.sleep(for: .milliseconds(500))
        let rssHeld = child.map { residentBytes(pid: $0.pid) }
        benchLog("\(clients.count) connections open in \(format(openSeconds)) s")

        // Keep every connection inside its heartbeat while the calls run.
        let heartbeat = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(10))
                for client in clients { client.send(#"{"type":"ping","id":"hb-\#(UUID().uuidString.prefix(8))"}"#) }
            }
        }
        defer { heartbeat.cancel() }

        benchLog("running \(calls) call setups, \(concurrency) at a time")
        let cpuBefore = child.map { cpuSeconds(pid: $0.pid) }
        let callStart = ContinuousClock.now
        let results = try await withThrowingTaskGroup(of: [CallTiming].self) { group in
            for worker in 0..<concurrency {
                let caller = clients[worker * 2]
                let callee = clients[worker * 2 + 1]
                let share = calls / concurrency + (worker < calls % concurrency ? 1 : 0)
                group.addTask { try await Self.runCalls(share, caller: caller, callee: callee, callee: "bench\(worker * 2 + 1)") }
            }
            var all: [CallTiming] = []
            for try await timings in group { all += timings }
            return all
        }
        let callSeconds = seconds(ContinuousClock.now - callStart)
        let cpuDuringCalls = child.map { cpuSeconds(pid: $0.pid) - (cpuBefore ?? 0) }
        let rssAfter = child.map { residentBytes(pid: $0.pid) }
        for client in clients { client.close() }

        let setup = results.map(\.setup).sorted()
        let ring = results.map(\.invitedToIncoming).sorted()
        let relay = results.flatMap(\.relays).sorted()
        var report = """

            Parley signaling benchmark (\(ProcessInfo.processInfo.activeProcessorCount) cores)
              connections held       \(clients.count) (opened in \(format(openSeconds)) s, \(format(Double(clients.count) / openSeconds)) per second)
              call setups            \(results.count) in \(format(callSeconds)) s = \(format(Double(results.count) / callSeconds)) per second (\(concurrency) at a time)
              setup latency          p50 \(ms(percentile(setup, 0.5))) ms, p99 \(ms(percentile(setup, 0.99))) ms (invite → ended, 13 relayed frames)
              invite → incoming      p50 \(ms(percentile(ring, 0.5))) ms, p99 \(ms(percentile(ring, 0.99))) ms
              relay latency          p50 \(ms(percentile(relay, 0.5))) ms, p99 \(ms(percentile(relay, 0.99))) ms (call.signal sent → received, \(relay.count) samples)
              client acks            \(clients.map(\.acknowledged).reduce(0, +)) (every 32nd frame a client read, as the SDK does)
            """
        if let rssBefore, let rssHeld, let rssAfter {
            let perConnection = Double(rssHeld - rssBefore) / Double(clients.count)
            report += """

              server CPU             \(format(cpuDuringCalls ?? 0)) s for the calls = \(format((cpuDuringCalls ?? 0) * 1000 / Double(results.count))) ms per call setup, \(format(100 * (cpuDuringCalls ?? 0) / callSeconds)) % of one core
              server memory          \(mib(rssBefore)) MiB idle, \(mib(rssHeld)) MiB with the connections held (\(format(perConnection / 1024)) KiB per connection), \(mib(rssAfter)) MiB after the calls
            """
        }
        print(report)
    }

    struct CallTiming {
        var setup: Duration
        var invitedToIncoming: Duration
        var relays: [Duration]
    }

    static func runCalls(_ count: Int, caller: BenchClient, callee: BenchClient, callee calleeUser: String) async throws -> [CallTiming] {
        var timings: [CallTiming] = []
        let offer = #"{"type":"offer","sdp":"v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n"}"#
        let answer = offer.replacingOccurrences(of: "\"offer\"", with: "\"answer\"")
        let candidate = #"{"candidate":"candidate:1 1 udp 2122260223 127.0.0.1 50000 typ host","sdpMid":"0","sdpMLineIndex":0}"#
        for _ in 0..<count {
            let call = CallID.random().rawValue
            let start = ContinuousClock.now
            var relays: [Duration] = []

            try await caller.request("call.invite", #""call":"\#(call)","to":"\#(calleeUser)","media":{"audio":true,"video":false}"#)
            _ = try await callee.expect(type: "call.incoming", call: call)
            let incoming = ContinuousClock.now - start
            try await callee.request("call.ringing", #""call":"\#(call)""#)
            _ = try await caller.expect(type: "call.ringing", call: call)
            try await callee.request("call.accept", #""call":"\#(call)""#)
            _ = try await caller.expect(type: "call.accepted", call: call)

            func relay(_ from: BenchClient, _ to: BenchClient, _ fields: String) async throws {
                let sent = ContinuousClock.now
                from.sendRequest("call.signal", #""call":"\#(call)",\#(fields)"#)
                _ = try await to.expect(type: "call.signal", call: call)
                relays.append(ContinuousClock.now - sent)
            }
            try await relay(caller, callee, #""description":\#(offer)"#)
            try await relay(callee, caller, #""description":\#(answer)"#)
            for _ in 0..<2 {
                try await relay(caller, callee, #""candidate":\#(candidate)"#)
                try await relay(callee, caller, #""candidate":\#(candidate)"#)
            }
            try await relay(caller, callee, #""candidate":null"#)
            try await relay(callee, caller, #""candidate":null"#)
            try await caller.request("call.hangup", #""call":"\#(call)""#)
            _ = try await callee.expect(type: "call.ended", call: call)
            timings.append(CallTiming(setup: ContinuousClock.now - start, invitedToIncoming: incoming, relays: relays))
        }
        return timings
    }
}

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Raises this process's open-file limit to its hard limit (children inherit it), and warns when
/// even that is below what the run needs.
func raiseFileLimit(needing needed: Int) {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
    limit.rlim_cur = limit.rlim_max
    _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    if UInt(limit.rlim_cur) < UInt(needed) {
        benchLog("warning: the open-file limit (\(limit.rlim_cur)) is below the \(needed) this run needs")
    }
}

func benchLog(_ text: String) {
    try? FileHandle.standardError.write(contentsOf: Data("bench: \(text)\n".utf8))
}

func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

func percentile(_ sorted: [Duration], _ fraction: Double) -> Duration {
    guard !sorted.isEmpty else { return .zero }
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
}

func ms(_ duration: Duration) -> String { format(seconds(duration) * 1000) }
func format(_ value: Double) -> String { String(format: "%.2f", value) }
func mib(_ bytes: Int) -> String { format(Double(bytes) / 1_048_576) }

/// User plus system CPU time of a process, in seconds.
func cpuSeconds(pid: Int32) -> Double {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return 0 }
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    // After the command: state is field 3, utime field 14, stime field 15 (1-based, man 5 proc).
    guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// VmRSS of a process, in bytes.
func residentBytes(pid: Int32) -> Int {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
          let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    else { return 0 }
    return kib * 1024
}

/// A server's metrics' samples on loopback (`GET /metrics`), by name and labels as exposed.
func metricSamples(port: Int) async throws -> [String: Double] {
    let (data, _) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(port)/metrics")!)
    var samples: [String: Double] = [:]
    for line in String(decoding: data, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
        let parts = line.split(separator: " ")
        if parts.count == 2, let value = Double(parts[1]) { samples[String(parts[0])] = value }
    }
    return samples
}

/// `parley serve` (or `parley bench echo-server`) as a child process on a free loopback port.
struct ChildServer {
    let process: Process
    let port: Int
    var pid: Int32 { process.processIdentifier }

    func metrics() async throws -> [String: Double] { try await metricSamples(port: port) }

    /// The per-address and per-connection rate limits are off: a load generator runs every client
    /// from one address, and its pairs send far faster than a person's device (the limits
    /// themselves are tested, in `LimitTests`, not measured).
    static func start(database: String = ":memory:", arguments: [String] = []) throws -> ChildServer {
        let (process, port) = try launch(["--port", "0", "--database", database, "--log-level", "warning",
                                          "--http-rate-limit", "0", "--frame-rate-limit", "0"] + arguments)
        return ChildServer(process: process, port: port)
    }

    /// The bare WebSocket echo server `parley bench relay` measures against.
    static func startEchoServer() throws -> ChildServer {
        let (process, port) = try launch([], command: ["bench", "echo-server"])
        return ChildServer(process: process, port: port)
    }

    /// Starts `parley <command> <arguments>` and answers once it says where it listens. What it
    /// prints afterwards is read and dropped, so a full pipe never blocks it.
    static func launch(_ arguments: [String], command: [String] = ["serve"]) throws -> (Process, port: Int) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        process.arguments = command + arguments
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let handle = output.fileHandleForReading
        var text = ""
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            let chunk = handle.availableData
            if chunk.isEmpty { break }
            text += String(decoding: chunk, as: UTF8.self)
            if let range = text.range(of: #"127\.0\.0\.1:(\d+)"#, options: .regularExpression),
               let port = Int(text[range].split(separator: ":").last ?? "") {
                // Stop at its end (an empty read), or the handler would be called again and again.
                handle.readabilityHandler = { handle in
                    if handle.availableData.isEmpty { handle.readabilityHandler = nil }
                }
                return (process, port)
            }
        }
        process.terminate()
        throw BenchFailure("the server did not start: \(text)")
    }

    static func stopOnSignals(_ child: ChildServer) -> [any DispatchSourceSignal] {
        onSignals { child.stop() }
    }

    /// On SIGINT or SIGTERM (Ctrl-C, a timeout's kill): `stop`, then exit as the signal would.
    static func onSignals(_ stop: @escaping @Sendable () -> Void) -> [any DispatchSourceSignal] {
        [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                stop()
                exit(128 + number)
            }
            source.resume()
            return source
        }
    }

    func stop() {
        guard process.isRunning else { return }
        process.terminate()   // SIGTERM: the graceful path
        process.waitUntilExit()
    }
}

/// A benchmark that could not go on: the server did not start, or answered what it should not
/// have. Said as it is (not as a mistake in the command line, with its usage).
struct BenchFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// One benchmark connection: frames in through a stream consumed by one task at a time.
final class BenchClient: @unchecked Sendable {
    private let socket: TextWebSocket
    private var inbound: AsyncStream<TextWebSocket.Event>.Iterator
    private var counter = 0
    private var received = 0
    /// Acks this client sent (one every 32 frames read).
    private(set) var acknowledged = 0
    private init(_ socket: TextWebSocket) {
        self.socket = socket
        inbound = socket.events.makeAsyncIterator()
    }

    /// A token from the server's development endpoint, as a real client's would come.
    static func devToken(base: String, user: String) async throws -> String {
        var request = URLRequest(url: URL(string: base + "/v1/dev/tokens")!)
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = Data(#"{"user":"\#(user)"}"#.utf8)
        let (data, response) = try await URLSession.shared.data(for: request)
        guard (response as? HTTPURLResponse)?.statusCode == 200 else {
            throw BenchFailure("the server did not mint a token (is it in development mode?)")
        }
        return try JSONDecoder().decode(DevTokenResponse.self, from: data).token
    }

    /// An authenticated Parley session: connected, said hello to, welcomed.
    static func connect(host: String, port: Int, token: String, device: String) async throws -> BenchClient {
        let client = try await connectRaw(host: host, port: port, path: "/v1/signal", token: token)
        client.send(#"{"type":"hello","id":"h","device":"\#(device)"}"#)
        _ = try await client.expect(type: "welcome", call: nil)
        return client
    }

    /// A WebSocket connection, nothing said on it yet.
    static func connectRaw(host: String, port: Int, path: String, token: String?) async throws -> BenchClient {
        var headers = HTTPFields()
        if let token { headers[.authorization] = "Bearer \(token)" }
        return BenchClient(try await TextWebSocket.connect(to: "ws://\(host):\(port)\(path)", headers: headers, maxFrameSize: 1 << 16))
    }

    func send(_ text: String) { socket.send(text) }

    func close() { socket.close() }

    @discardableResult
    func sendRequest(_ type: String, _ fields: String) -> String {
        counter += 1
        let id = "b\(counter)"
        send(#"{"type":"\#(type)","id":"\#(id)",\#(fields)}"#)
        return id
    }

    /// Acknowledges server frames now and then, as a real client does, so the server can drop
    /// them from its resume buffer. An error that answers no request (the server could not read a
    /// frame the bench sent) fails the run: the bench would measure the server refusing it.
    private func next() async throws -> String? {
        guard case .text(let text)? = await inbound.next() else { return nil }
        received += 1
        if received % 32 == 0, let range = text.range(of: #""seq":(\d+)"#, options: .regularExpression) {
            send(#"{"type":"ack",\#(text[range])}"#)
            acknowledged += 1
        }
        if text.contains(#""type":"error""#), !text.contains(#""re":"#) {
            throw BenchFailure("the server refused a frame the bench sent: \(text)")
        }
        return text
    }

    /// Reads (and acknowledges) every frame until the connection ends, or the server refuses one.
    func drain() async throws {
        while try await next() != nil {}
    }

    /// Sends a request and waits for its ack; an error answer fails the run.
    func request(_ type: String, _ fields: String) async throws {
        try await awaitAnswer(to: sendRequest(type, fields), of: type)
    }

    /// Waits for the answer to request `id`; an error answer fails the run.
    func awaitAnswer(to id: String, of type: String = "request") async throws {
        while let text = try await next() {
            guard text.contains(#""re":"\#(id)""#) else { continue }
            if text.contains(#""type":"error""#) { throw BenchFailure("\(type) failed: \(text)") }
            return
        }
        throw BenchFailure("the connection closed")
    }

    /// Waits for a frame of `type` (about `call`, when given), skipping others.
    func expect(type: String, call: String?) async throws -> String {
        while let text = try await next() {
            guard text.contains(#""type":"\#(type)""#) else { continue }
            if let call, !text.contains(call) { continue }
            return text
        }
        throw BenchFailure("the connection closed while waiting for \(type)")
    }
}
