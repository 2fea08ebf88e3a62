import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import ParleyLocalServices
import ParleyProtocol
import ParleyServer
#if canImport(Glibc)
import Glibc
#endif

/// Several `parley serve` nodes on one PostgreSQL, as a deployment runs them: connections held on
/// every node by load generators of their own (one process cannot open more than its file limit),
/// and call setups whose two parties sit on different nodes.
struct BenchNodes: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "nodes",
        abstract: "Measure several server nodes on one PostgreSQL: connections held, cross-node call setups, relay latency, memory, CPU.",
        discussion: """
            Starts a private PostgreSQL (unless --database names one), --nodes `parley serve` processes on it, and \
            one load generator process per node holding its share of --connections (authenticated, with heartbeats). \
            Then runs --calls complete call setups, each between a device on one node and a device on the next. \
            With --nodes 1 --store sqlite, the same run on one node and SQLite, for comparison. With --compare, \
            one run starts one node, and --nodes on each bus (direct: node-to-node WebSockets, the default; \
            postgres: NOTIFY), each on a private PostgreSQL of its own and holding --connections, then runs \
            --calls setups on each in turn, --rounds times (every other round in reverse order, so that the \
            default bus always runs next to one node), and prints each round's ratios to one node and their \
            medians (a machine's speed drifts over minutes, so a ratio is taken within a round, whose runs \
            follow each other within seconds).
            """
    )

    enum Store: String, ExpressibleByArgument { case postgres, sqlite }

    @Option(help: "Server nodes to start.")
    var nodes: Int = 2

    @Option(help: "Connections to hold open in all, spread evenly over the nodes.")
    var connections: Int = 10_000

    @Option(help: "Call setups to run in all, each across two nodes (on one node with --nodes 1).")
    var calls: Int = 2000

    @Option(help: "Call setups running at once.")
    var concurrency: Int = 32

    @Option(help: "postgres (shared by the nodes) or sqlite (one node only, in memory).")
    var store: Store = .postgres

    @Option(help: "A PostgreSQL URL to use instead of starting a private server (its database is used as is).")
    var database: String?

    @Option(help: "How the nodes send each other messages: direct (node-to-node WebSockets) or postgres (NOTIFY).")
    var bus: NodeBus = .direct

    @Flag(help: "Measure one node, then --nodes on each bus, in one run (a private PostgreSQL each), and print the ratios.")
    var compare = false

    @Option(help: "With --compare: rounds, each measuring every deployment in turn (default 5).")
    var rounds: Int?

    @Flag(help: "Print the statements that took the private PostgreSQL's time during the setups (pg_stat_statements).")
    var statements = false

    func validate() throws {
        guard nodes >= 1 else { throw ValidationError("--nodes must be at least 1") }
        guard store == .postgres || nodes == 1 else { throw ValidationError("several nodes share PostgreSQL: --store sqlite takes --nodes 1") }
        guard !compare || (store == .postgres && database == nil && nodes >= 2) else {
            throw ValidationError("--compare starts its own PostgreSQL (no --database, no --store sqlite) and needs --nodes 2 or more")
        }
        guard rounds == nil || compare else { throw ValidationError("--rounds goes with --compare") }
        guard (rounds ?? 1) >= 1 else { throw ValidationError("--rounds must be at least 1") }
        guard !statements || (store == .postgres && database == nil) else {
            throw ValidationError("--statements reads the private PostgreSQL the bench starts (no --database, no --store sqlite)")
        }
        guard connections >= nodes else { throw ValidationError("--connections must be at least --nodes") }
        guard concurrency >= 1, calls >= 1 else { throw ValidationError("--calls and --concurrency must be at least 1") }
        // One process may open 20,000 files here. A node needs about 26 of its own (up to 8 pooled
        // PostgreSQL connections and its LISTEN connection, the listening socket, event loops,
        // timers, standard streams), counted on a running node with /proc/PID/fd.
        // --compare's first run holds every connection on one node.
        guard compare ? connections <= 19_960 : (connections + nodes - 1) / nodes <= 19_960 else {
            throw ValidationError("\((connections + nodes - 1) / nodes) connections a node is past one process's file limit: use more --nodes")
        }
    }

    /// What one deployment measured.
    struct Figures {
        var label: String
        var nodes: Int
        var held: Int
        var openSeconds: Double
        var memoryPerConnection: Double
        var perNode: String
        var postgresMemory: String
        var setups: Int
        var callSeconds: Double
        var pairs: Int
        var setup: [Duration]
        var ring: [Duration]
        var relay: [Duration]
        var cpu: Double
        var postgresCPU: Double?
        /// Messages the nodes sent each other a setup, by kind (`parley_node_messages_sent_total`).
        var nodeMessages: [String: Double]

        var setupsPerSecond: Double { Double(setups) / callSeconds }
        var nodeCPUPerSetup: Double { cpu * 1000 / Double(setups) }
        var postgresCPUPerSetup: Double? { postgresCPU.map { $0 * 1000 / Double(setups) } }
        /// Nodes and PostgreSQL together: what a setup costs the deployment.
        var cpuPerSetup: Double { nodeCPUPerSetup + (postgresCPUPerSetup ?? 0) }
        var relayMedian: Duration { percentile(relay, 0.5) }
        var nodeMessagesPerSetup: Double { nodeMessages.values.reduce(0, +) }

        var report: String {
            """

            Parley nodes benchmark (\(ProcessInfo.processInfo.activeProcessorCount) cores): \(label)
              connections held       \(held + 2 * pairs) (\(held) by \(nodes) generator process(es), opened in \(format(openSeconds)) s = \(format(Double(held) / openSeconds)) per second)
              server memory          \(format(memoryPerConnection / 1024)) KiB per connection held (nodes: \(perNode))
              PostgreSQL memory      \(postgresMemory)
              call setups            \(setups) in \(format(callSeconds)) s = \(format(setupsPerSecond)) per second (\(pairs) at a time\(nodes > 1 ? ", every one across two nodes" : ""))
              setup latency          p50 \(ms(percentile(setup, 0.5))) ms, p99 \(ms(percentile(setup, 0.99))) ms (invite → ended)
              invite → incoming      p50 \(ms(percentile(ring, 0.5))) ms, p99 \(ms(percentile(ring, 0.99))) ms
              relay latency          p50 \(ms(percentile(relay, 0.5))) ms, p99 \(ms(percentile(relay, 0.99))) ms (call.signal sent → received, \(relay.count) samples)
              server CPU             \(format(nodeCPUPerSetup)) ms per call setup, all nodes together
              PostgreSQL CPU         \(postgresCPUPerSetup.map { "\(format($0)) ms per call setup" } ?? "—")
            """ + (nodes > 1 ? "\n  across nodes           \(format(nodeMessagesPerSetup)) messages per call setup (\(nodeMessages.sorted { $0.key < $1.key }.map { "\($0.key) \(format($0.value))" }.joined(separator: ", ")))" : "")
        }
    }

    func run() async throws {
        guard compare else {
            let label = "\(nodes) node(s) on \(store == .postgres ? "PostgreSQL" : "SQLite")\(store == .postgres && nodes > 1 ? ", bus \(bus.rawValue)" : "")"
            return print(try await measure(label: label, nodes: nodes, bus: bus, database: database).report)
        }
        let rounds = self.rounds ?? 5
        // Every deployment is started (a PostgreSQL of its own each) and held through the rounds,
        // which then take seconds rather than minutes each: the machine drifts less between the
        // runs a ratio compares. The others idle meanwhile (their connections' heartbeats only).
        var deployments: [Deployment] = []
        let stops = NIOLockedValueBox<[@Sendable () -> Void]>([])
        let signals = ChildServer.onSignals {
            for stop in stops.withLockedValue({ $0 }) { stop() }
        }
        defer {
            signals.forEach { $0.cancel() }
            for deployment in deployments { deployment.stop() }
        }
        // The default bus second: next to one node in either order, so its ratio, the one a
        // deployment meets, spans the least drift.
        for (count, bus) in [(1, NodeBus.direct), (nodes, .direct), (nodes, .postgres)] {
            let label = count == 1 ? "1 node on PostgreSQL" : "\(count) nodes on PostgreSQL, bus \(bus.rawValue)"
            benchLog("starting \(label)")
            deployments.append(try await start(label: label, nodes: count, bus: bus, database: nil))
            stops.withLockedValue { $0.append(deployments[deployments.count - 1].stopNow) }
        }
        var table: [[Figures]] = []
        for round in 1...rounds {
            var runs: [Figures?] = Array(repeating: nil, count: deployments.count)
            // Every other round in the reverse order: a drift one way weighs on each deployment alike.
            let order = round % 2 == 1 ? Array(deployments.indices) : deployments.indices.reversed()
            for index in order {
                benchLog("round \(round)/\(rounds): \(deployments[index].label)")
                let figures = try await run(calls, on: deployments[index])
                print(figures.report)
                runs[index] = figures
            }
            let figures = runs.compactMap { $0 }
            print(Self.sideBySide(figures, title: "Round \(round) of \(rounds) (\(connections) connections, \(calls) setups, \(concurrency) at a time): each ÷ one node"))
            table.append(figures)
        }
        guard rounds > 1 else { return }
        // Each deployment's medians, and the medians of its ratios to one node within a round.
        func median(_ values: [Double]) -> Double {
            let sorted = values.sorted()
            return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
        }
        let columns = ["", "setups/s", "CPU per setup (nodes + PostgreSQL)", "PostgreSQL CPU per setup", "relay p50", "messages across nodes per setup"]
        var lines = ["", "Medians of \(rounds) rounds: each, and its ratio to one node in the same round"]
        lines.append("  " + columns.map { $0.padding(toLength: 36, withPad: " ", startingAt: 0) }.joined())
        for index in deployments.indices {
            let runs = table.map { $0[index] }
            func cell(_ unit: String, _ value: (Figures) -> Double) -> String {
                "\(format(median(runs.map(value))))\(unit) (\(format(median(table.map { value($0[index]) / value($0[0]) })))×)"
            }
            let cells = [runs[0].label, cell("", \.setupsPerSecond), cell(" ms", \.cpuPerSetup),
                         "\(format(median(runs.map { $0.postgresCPUPerSetup ?? 0 }))) ms",
                         cell(" ms") { seconds($0.relayMedian) * 1000 }, format(median(runs.map(\.nodeMessagesPerSetup)))]
            lines.append("  " + cells.map { $0.padding(toLength: 36, withPad: " ", startingAt: 0) }.joined())
        }
        print(lines.joined(separator: "\n"))
    }

    /// One round's deployments side by side, each ÷ the first (one node).
    static func sideBySide(_ runs: [Figures], title: String) -> String {
        let one = runs[0]
        var lines = ["", title]
        lines.append("  " + ["", "setups/s", "CPU per setup (nodes + PostgreSQL)", "PostgreSQL CPU per setup", "relay p50"].map { $0.padding(toLength: 36, withPad: " ", startingAt: 0) }.joined())
        for figures in runs {
            let cells = [
                figures.label,
                "\(format(figures.setupsPerSecond)) (\(format(figures.setupsPerSecond / one.setupsPerSecond))×)",
                "\(format(figures.cpuPerSetup)) ms (\(format(figures.cpuPerSetup / one.cpuPerSetup))×)",
                "\(format(figures.postgresCPUPerSetup ?? 0)) ms",
                "\(ms(figures.relayMedian)) ms (\(format(seconds(figures.relayMedian) / seconds(one.relayMedian)))×)",
            ]
            lines.append("  " + cells.map { $0.padding(toLength: 36, withPad: " ", startingAt: 0) }.joined())
        }
        return lines.joined(separator: "\n")
    }

    /// One deployment: `nodes` nodes on `database` (a private PostgreSQL when nil), measured.
    func measure(label: String, nodes: Int, bus: NodeBus, database: String?) async throws -> Figures {
        let deployment = try await start(label: label, nodes: nodes, bus: bus, database: database)
        let signals = ChildServer.onSignals(deployment.stopNow)
        defer {
            signals.forEach { $0.cancel() }
            deployment.stop()
        }
        return try await run(calls, on: deployment)
    }

    /// A deployment started and holding its connections, its pairs of callers and callees
    /// connected: setups run on it as often as asked, until it stops.
    struct Deployment {
        var label: String
        var nodes: Int
        var servers: [ChildServer]
        var postgres: PostgresServer?
        var statementsDatabase: String
        var generators: Children
        var callers: [BenchClient]
        var callees: [BenchClient]
        var heartbeat: Task<Void, Never>?
        var held: Int
        var openSeconds: Double
        var memoryPerConnection: Double
        var perNode: String
        var postgresMemory: String
        /// Stops its processes from any thread (a signal's handler).
        var stopNow: @Sendable () -> Void

        var pairs: Int { callers.count }

        /// Closes the pairs' connections and stops the generators, the nodes and the private PostgreSQL.
        func stop() {
            heartbeat?.cancel()
            for client in callers + callees { client.close() }
            generators.stop()
            for server in servers { server.stop() }
            postgres?.stop()
        }
    }

    /// Starts `nodes` nodes on `database` (a private PostgreSQL when nil), their generators holding
    /// the connections, and the pairs the setups run between.
    func start(label: String, nodes: Int, bus: NodeBus, database: String?) async throws -> Deployment {
        let generators = Children()
        var deployment = Deployment(label: label, nodes: nodes, servers: [], postgres: nil, statementsDatabase: "",
                                    generators: generators, callers: [], callees: [], heartbeat: nil, held: 0, openSeconds: 0,
                                    memoryPerConnection: 0, perNode: "", postgresMemory: "—", stopNow: { generators.stop() })
        do {
            try await start(&deployment, bus: bus, database: database)
            return deployment
        } catch {
            deployment.stop()
            throw error
        }
    }

    private func start(_ deployment: inout Deployment, bus: NodeBus, database: String?) async throws {
        let nodes = deployment.nodes
        var setting = ":memory:"
        if store == .postgres {
            if let database {
                setting = database
            } else {
                benchLog("starting a private PostgreSQL")
                let server = try await PostgresServer.start(
                    maxConnections: 20 * nodes + 20,
                    settings: statements ? ["shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_planning=on"] : [])
                deployment.postgres = server
                deployment.statementsDatabase = try server.createDatabase()
                setting = server.url(database: deployment.statementsDatabase)
            }
        }
        let postgresPID = deployment.postgres?.process.processIdentifier
        for index in 0..<nodes {
            deployment.servers.append(try ChildServer.start(database: setting, arguments: ["--node-bus", bus.rawValue]))
            benchLog("node \(index + 1) on port \(deployment.servers[index].port) (pid \(deployment.servers[index].pid))")
        }
        let servers = deployment.servers
        let pids = servers.map(\.pid)
        let (generators, privatePostgres) = (deployment.generators, deployment.postgres)
        deployment.stopNow = {
            generators.stop()
            for pid in pids { kill(pid, SIGTERM) }
            privatePostgres?.stop()
        }
        try await Task.sleep(for: .seconds(1))
        let idle = servers.map { residentBytes(pid: $0.pid) }
        let postgresIdle = postgresPID.map(Self.treeResident) ?? 0

        // The callers and callees of the setups: pairs across neighbouring nodes, opened here.
        let pairs = min(concurrency, max(1, connections / 4))
        let held = connections - 2 * pairs
        benchLog("holding \(held) connections over \(nodes) node(s), one generator process each")
        let openStart = ContinuousClock.now
        var ready: [AsyncStream<String>] = []
        for (index, server) in servers.enumerated() {
            let share = held / nodes + (index < held % nodes ? 1 : 0)
            let (process, lines) = try Self.generator(port: server.port, count: share, first: index * 100_000)
            generators.add(process)
            ready.append(lines)
        }
        for (index, lines) in ready.enumerated() {
            var reported = false
            for await line in lines {
                if line.hasPrefix("held ") { reported = true; break }
                if line.hasPrefix("failed") { throw ValidationError("generator \(index + 1): \(line)") }
            }
            guard reported else { throw ValidationError("generator \(index + 1) stopped before holding its connections") }
        }
        let openSeconds = seconds(ContinuousClock.now - openStart)
        benchLog("\(held) connections held after \(format(openSeconds)) s")
        try await Task.sleep(for: .seconds(2))
        let holding = servers.map { residentBytes(pid: $0.pid) }
        let postgresHolding = postgresPID.map(Self.treeResident) ?? 0

        let authority = try await TokenAuthority(key: .hs256(secret: ServerConfiguration.developmentSecret))
        for pair in 0..<pairs {
            let from = servers[pair % nodes], to = servers[(pair + 1) % nodes]
            let caller = try await authority.mint(user: UserID(rawValue: "caller\(pair)")!, name: nil, lifetime: .seconds(3600)).token
            let callee = try await authority.mint(user: UserID(rawValue: "callee\(pair)")!, name: nil, lifetime: .seconds(3600)).token
            deployment.callers.append(try await BenchClient.connect(host: "127.0.0.1", port: from.port, token: caller, device: "c\(pair)"))
            deployment.callees.append(try await BenchClient.connect(host: "127.0.0.1", port: to.port, token: callee, device: "d\(pair)"))
        }
        try await Task.sleep(for: .milliseconds(500))   // every node has heard where the callees are
        let talking = deployment.callers + deployment.callees
        deployment.heartbeat = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(10))
                for client in talking { client.send(#"{"type":"ping","id":"hb"}"#) }
            }
        }
        deployment.held = held
        deployment.openSeconds = openSeconds
        deployment.memoryPerConnection = Double(zip(holding, idle).map { $0 - $1 }.reduce(0, +)) / Double(held)
        deployment.perNode = servers.indices.map { "\(mib(holding[$0])) MiB" }.joined(separator: ", ")
        if store == .postgres, postgresPID != nil {
            deployment.postgresMemory = "\(mib(postgresIdle)) → \(mib(postgresHolding)) MiB (all its processes)"
        }
    }

    /// Runs `calls` setups on a started deployment, and measures them.
    func run(_ calls: Int, on deployment: Deployment) async throws -> Figures {
        let (servers, postgres, pairs) = (deployment.servers, deployment.postgres, deployment.pairs)
        let postgresPID = postgres?.process.processIdentifier
        benchLog("running \(calls) call setups\(deployment.nodes > 1 ? " across nodes" : ""), \(pairs) at a time")
        if statements, let postgres {
            _ = try postgres.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()",
                                  database: deployment.statementsDatabase)
        }
        let messagesBefore = try await Self.nodeMessages(of: servers)
        let cpuBefore = servers.map { cpuSeconds(pid: $0.pid) }
        let postgresBefore = postgresPID.map(Self.treeCPU) ?? 0
        let callStart = ContinuousClock.now
        // A frame that never comes would hold the run forever: past a generous limit, it says so.
        let limit = Duration.seconds(max(120, calls / 5))
        let results = try await withThrowingTaskGroup(of: [BenchSignaling.CallTiming]?.self) { group in
            for pair in 0..<pairs {
                let share = calls / pairs + (pair < calls % pairs ? 1 : 0)
                let (caller, callee) = (deployment.callers[pair], deployment.callees[pair])
                group.addTask { try await BenchSignaling.runCalls(share, caller: caller, callee: callee, callee: "callee\(pair)") }
            }
            group.addTask {
                try await Task.sleep(for: limit)
                return nil
            }
            var all: [BenchSignaling.CallTiming] = []
            var finished = 0
            for try await timings in group {
                guard let timings else {
                    throw ValidationError("the call setups stalled: \(finished) of \(pairs) pairs done after \(limit) (a frame never came)")
                }
                all += timings
                finished += 1
                if finished == pairs { break }
            }
            group.cancelAll()
            return all
        }
        let callSeconds = seconds(ContinuousClock.now - callStart)
        let cpu = zip(servers, cpuBefore).map { cpuSeconds(pid: $0.pid) - $1 }.reduce(0, +)
        let postgresCPU = (postgresPID.map(Self.treeCPU) ?? 0) - postgresBefore
        let messages = try await Self.nodeMessages(of: servers).merging(messagesBefore, uniquingKeysWith: -)
            .filter { $0.value > 0 }.mapValues { $0 / Double(max(1, results.count)) }
        if statements, let postgres {
            try Self.printStatements(of: postgres, database: deployment.statementsDatabase, setups: results.count, label: deployment.label)
        }
        return Figures(label: deployment.label, nodes: deployment.nodes, held: deployment.held, openSeconds: deployment.openSeconds,
                       memoryPerConnection: deployment.memoryPerConnection, perNode: deployment.perNode,
                       postgresMemory: deployment.postgresMemory,
                       setups: results.count, callSeconds: callSeconds, pairs: pairs,
                       setup: results.map(\.setup).sorted(), ring: results.map(\.invitedToIncoming).sorted(),
                       relay: results.flatMap(\.relays).sorted(),
                       cpu: cpu, postgresCPU: postgresPID != nil ? postgresCPU : nil, nodeMessages: messages)
    }

    /// The messages the nodes have sent each other so far, by kind, all nodes together.
    static func nodeMessages(of servers: [ChildServer]) async throws -> [String: Double] {
        var byKind: [String: Double] = [:]
        for server in servers {
            for (name, value) in try await server.metrics() where name.hasPrefix("parley_node_messages_sent_total{") {
                let kind = name.split(separator: "\"").dropFirst().first.map(String.init) ?? name
                byKind[kind, default: 0] += value
            }
        }
        return byKind
    }

    /// The statements PostgreSQL spent the setups on, most time first: how many ran a setup, and
    /// the planning and execution time they took a setup (pg_stat_statements, reset before them).
    static func printStatements(of postgres: PostgresServer, database: String, setups: Int, label: String) throws {
        let rows = try postgres.psql("""
            SELECT calls, total_plan_time, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g')
            FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
            ORDER BY total_plan_time + total_exec_time DESC LIMIT 12
            """, database: database)
        var lines = ["PostgreSQL's statements during the setups, \(label) (per setup: runs, plan + exec ms):"]
        for row in rows.split(separator: "\n") {
            let fields = row.split(separator: "|", maxSplits: 3, omittingEmptySubsequences: false).map(String.init)
            guard fields.count == 4, let calls = Double(fields[0]), let plan = Double(fields[1]), let exec = Double(fields[2]) else { continue }
            let perSetup = Double(max(1, setups))
            lines.append("  \(format(calls / perSetup)) × \(format(plan / perSetup)) + \(format(exec / perSetup)) ms  \(fields[3].prefix(110))")
        }
        print(lines.joined(separator: "\n"))
    }

    /// A load generator: `parley bench hold` holding `count` connections to one node.
    static func generator(port: Int, count: Int, first: Int) throws -> (Process, AsyncStream<String>) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        process.arguments = ["bench", "hold", "--port", "\(port)", "--count", "\(count)", "--first", "\(first)"]
        let output = Pipe()
        process.standardOutput = output
        let (lines, continuation) = AsyncStream<String>.makeStream()
        let handle = output.fileHandleForReading
        Thread {
            var buffer = ""
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                buffer += String(decoding: chunk, as: UTF8.self)
                while let newline = buffer.firstIndex(of: "\n") {
                    continuation.yield(String(buffer[..<newline]))
                    buffer = String(buffer[buffer.index(after: newline)...])
                }
            }
            continuation.finish()
        }.start()
        try process.run()
        return (process, lines)
    }

    /// Resident memory of a process and its children (PostgreSQL runs a process per connection).
    static func treeResident(_ pid: Int32) -> Int {
        ([pid] + children(of: pid)).map(residentBytes(pid:)).reduce(0, +)
    }

    static func treeCPU(_ pid: Int32) -> Double {
        ([pid] + children(of: pid)).map(cpuSeconds(pid:)).reduce(0, +)
    }

    static func children(of pid: Int32) -> [Int32] {
        let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(pid)/children", encoding: .utf8)) ?? ""
        return text.split(separator: " ").compactMap { Int32($0) }
    }
}

/// A load generator process: holds `--count` authenticated connections to one node within their
/// heartbeat until it is stopped. Prints `held N` once they are all open (or `failed: …`).
struct BenchHold: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "hold",
        abstract: "Hold connections open to one server (a load generator of `parley bench nodes`).",
        shouldDisplay: false
    )

    @Option var port: Int
    @Option var count: Int
    @Option(help: "The first user's number (users are hold<N>).") var first: Int = 0
    @Option var host: String = "127.0.0.1"

    /// A line for `bench nodes`, at once (not held in a buffer).
    static func say(_ line: String) {
        try? FileHandle.standardOutput.write(contentsOf: Data((line + "\n").utf8))
    }

    func run() async throws {
        // Started by `bench nodes` after it took SIGTERM and SIGINT for itself (ignored, for its
        // dispatch sources), which a child inherits across exec: stopped by SIGTERM again here.
        var stopSignals = sigset_t()
        sigemptyset(&stopSignals)
        for number in [SIGTERM, SIGINT] {
            signal(number, SIG_DFL)
            sigaddset(&stopSignals, number)
        }
        sigprocmask(SIG_UNBLOCK, &stopSignals, nil)
        raiseFileLimit(needing: count + 50)
        let authority = try await TokenAuthority(key: .hs256(secret: ServerConfiguration.developmentSecret))
        var tokens: [String] = []
        for index in 0..<count {
            tokens.append(try await authority.mint(user: UserID(rawValue: "hold\(first + index)")!, name: nil, lifetime: .seconds(7200)).token)
        }
        let (host, port, allTokens) = (self.host, self.port, tokens)
        let clients: [BenchClient]
        do {
            clients = try await withThrowingTaskGroup(of: BenchClient.self) { group in
                var clients: [BenchClient] = []
                var next = 0
                func add() {
                    let index = next
                    group.addTask { try await BenchClient.connect(host: host, port: port, token: allTokens[index], device: "h\(index)") }
                    next += 1
                }
                while next < min(100, count) { add() }
                while let client = try await group.next() {
                    clients.append(client)
                    if next < count { add() }
                }
                return clients
            }
        } catch {
            Self.say("failed: \(error)")
            throw ExitCode.failure
        }
        Self.say("held \(clients.count)")
        // Each client reads what it is sent and acknowledges it, as a real one does.
        for client in clients {
            Task {
                do { try await client.drain() } catch { Self.say("\(error)") }
            }
        }
        // One heartbeat per connection every 15 s (the server allows 60 s of silence), spread evenly.
        let batch = 500
        let pause = Duration.seconds(15) / max(1, clients.count / batch)
        while !Task.isCancelled {
            for (index, client) in clients.enumerated() {
                client.send(#"{"type":"ping","id":"hb"}"#)
                if index % batch == batch - 1 { try? await Task.sleep(for: pause) }
            }
            if clients.count < batch { try? await Task.sleep(for: .seconds(15)) }
        }
    }
}

/// Child processes to stop together, from any thread (a signal handler's too).
final class Children: @unchecked Sendable {
    private let lock = NSLock()
    private var processes: [Process] = []

    func add(_ process: Process) { lock.withLock { processes.append(process) } }

    /// SIGTERM, then SIGKILL to those still running 3 s later: a child that does not stop must not
    /// hold the run (a generator once ignored SIGTERM it inherited ignored, and `--compare` waited
    /// for it forever).
    func stop() {
        let all = lock.withLock { processes }
        for process in all where process.isRunning { process.terminate() }
        let deadline = Date().addingTimeInterval(3)
        while all.contains(where: \.isRunning), Date() < deadline { usleep(20_000) }
        for process in all where process.isRunning { kill(process.processIdentifier, SIGKILL) }
        for process in all { process.waitUntilExit() }
    }
}
