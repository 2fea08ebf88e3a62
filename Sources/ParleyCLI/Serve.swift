import ArgumentParser
import Foundation
import Logging
import ParleyAPNs
import ParleyProtocol
import ParleyServer

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the signaling server (protocol v1 over WebSocket at /v1/signal).",
        discussion: "Every option can also come from the environment variable named after it (PARLEY_…)."
    )

    @Option(help: "Address to listen on. [PARLEY_HOST]")
    var host: String = env("PARLEY_HOST") ?? "127.0.0.1"

    @Option(help: "Port to listen on; 0 picks a free one. [PARLEY_PORT]")
    var port: Int = env("PARLEY_PORT").flatMap(Int.init) ?? 8080

    @Option(help: "Where devices and calls are kept: a SQLite file, ':memory:' for nothing kept, or PostgreSQL (postgres://user:password@host:port/database, or postgres://user@/database?host=/socket/dir), which several nodes can share. [PARLEY_DATABASE]")
    var database: String = env("PARLEY_DATABASE") ?? "parley.sqlite"

    @Option(help: "Development mode serves POST /v1/dev/tokens: on by default on loopback, off elsewhere. [PARLEY_DEV]")
    var dev: Bool?

    @Option(help: "Secret that signs access tokens (HS256). [PARLEY_TOKEN_SECRET]")
    var tokenSecret: String?

    @Option(help: "Shared secret of the TURN server (coturn use-auth-secret). [PARLEY_TURN_SECRET]")
    var turnSecret: String?

    @Option(help: "TURN URLs handed to clients, comma-separated, e.g. turn:host:3478?transport=udp. [PARLEY_TURN_URLS]")
    var turnUrls: String = env("PARLEY_TURN_URLS") ?? ""

    @Option(help: "STUN URLs handed to clients, comma-separated. [PARLEY_STUN_URLS]")
    var stunUrls: String = env("PARLEY_STUN_URLS") ?? ""

    @Option(help: "Janus WebSocket API for group rooms (every room becomes an AudioBridge room), e.g. ws://127.0.0.1:8188. [PARLEY_JANUS]")
    var janus: String = env("PARLEY_JANUS") ?? ""

    @Option(help: "The Janus URL as clients reach it, when it differs from --janus. [PARLEY_JANUS_CLIENT_URL]")
    var janusClientUrl: String = env("PARLEY_JANUS_CLIENT_URL") ?? ""

    @Option(help: "Seconds a call rings before it ends with no-answer. [PARLEY_RING_TIMEOUT]")
    var ringTimeout: Int = env("PARLEY_RING_TIMEOUT").flatMap(Int.init) ?? 45

    @Option(help: "Seconds between the heartbeats clients send (told them in welcome); a connection silent for three is closed and its session kept for resume. [PARLEY_HEARTBEAT]")
    var heartbeat: Int = env("PARLEY_HEARTBEAT").flatMap(Int.init) ?? 20

    @Option(help: "Browser origins allowed to open signaling connections besides the server's own, comma-separated, e.g. https://app.example.com. [PARLEY_ALLOWED_ORIGINS]")
    var allowedOrigins: String = env("PARLEY_ALLOWED_ORIGINS") ?? ""

    @Option(help: "Bearer token for GET /metrics; without one, metrics are served to loopback only. [PARLEY_METRICS_TOKEN]")
    var metricsToken: String?

    @Option(help: "HTTP requests and WebSocket upgrades one address may make per second, sustained (bursts of ten times that pass); 0 for no limit, as a load generator on one address needs. [PARLEY_HTTP_RATE_LIMIT]")
    var httpRateLimit: Double = env("PARLEY_HTTP_RATE_LIMIT").flatMap(Double.init) ?? ServerConfiguration.Limits().httpRequestsPerSecond

    @Option(help: "Frames one connection may send per second, sustained (bursts of four times that pass); 0 for no limit, as a relay benchmark needs. [PARLEY_FRAME_RATE_LIMIT]")
    var frameRateLimit: Double = env("PARLEY_FRAME_RATE_LIMIT").flatMap(Double.init) ?? ServerConfiguration.Limits().framesPerSecond

    @Option(help: "Addresses of the reverse proxies in front of the server, comma-separated: the per-address limit counts the client their X-Forwarded-For names. [PARLEY_TRUSTED_PROXIES]")
    var trustedProxies: String = env("PARLEY_TRUSTED_PROXIES") ?? ""

    @Option(help: "How this node's messages reach the other nodes on one PostgreSQL: direct (a WebSocket to each, at the address it publishes; NOTIFY to one that publishes none) or postgres (NOTIFY). [PARLEY_NODE_BUS]")
    var nodeBus: NodeBus = env("PARLEY_NODE_BUS").flatMap(NodeBus.init(rawValue:)) ?? .direct

    @Option(help: "host:port at which the other nodes reach this one directly (not through a load balancer); by default --host and the port listened on, unless --host is a wildcard (0.0.0.0, ::), which names no address. [PARLEY_NODE_ADDRESS]")
    var nodeAddress: String?

    @OptionGroup(title: "Push (APNs)") var apns: APNsOptions

    @Option(help: "Log level: trace, debug, info, notice, warning, error. [PARLEY_LOG_LEVEL]")
    var logLevel: String = env("PARLEY_LOG_LEVEL") ?? "info"

    func validate() throws {
        guard (0...65535).contains(port) else { throw ValidationError("--port must be from 0 to 65535") }
        guard ringTimeout > 0 else { throw ValidationError("--ring-timeout must be at least 1 second") }
        guard (1...300).contains(heartbeat) else { throw ValidationError("--heartbeat must be 1 to 300 seconds") }
        guard httpRateLimit >= 0, httpRateLimit.isFinite else { throw ValidationError("--http-rate-limit must be 0 (no limit) or more") }
        guard frameRateLimit >= 0, frameRateLimit.isFinite else { throw ValidationError("--frame-rate-limit must be 0 (no limit) or more") }
        guard Logger.Level(rawValue: logLevel) != nil else { throw ValidationError("--log-level \(logLevel) is not a log level") }
        if let raw = Self.env("PARLEY_NODE_BUS"), NodeBus(rawValue: raw) == nil {
            throw ValidationError("PARLEY_NODE_BUS must be direct or postgres, not '\(raw)'")
        }
        if let address = nodeAddress ?? Self.env("PARLEY_NODE_ADDRESS"), !ServerConfiguration.isNodeAddress(address) {
            throw ValidationError("--node-address takes host:port (e.g. 10.0.0.5:8080 or [2001:db8::5]:8080), not '\(address)'")
        }
        if !turnUrls.isEmpty, turnSecret ?? Self.env("PARLEY_TURN_SECRET") == nil { throw ValidationError("--turn-urls needs --turn-secret") }
    }

    func run() async throws {
        var configuration = ServerConfiguration()
        configuration.host = host
        let loopback = configuration.isLoopback
        let development = dev ?? Self.env("PARLEY_DEV").map { ["1", "true", "yes"].contains($0.lowercased()) } ?? loopback
        let secret = tokenSecret ?? Self.env("PARLEY_TOKEN_SECRET")
        if secret == nil, !development {
            throw ValidationError("outside development mode the server needs --token-secret (or PARLEY_TOKEN_SECRET)")
        }
        configuration.tokenKey = .hs256(secret: secret ?? ServerConfiguration.developmentSecret)
        do { try configuration.validate() } catch { throw ValidationError(error.description) }
        var logger = Logger(label: "parley.server")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info

        configuration.port = port
        configuration.allowedOrigins = Self.list(allowedOrigins)
        configuration.metricsToken = metricsToken ?? Self.env("PARLEY_METRICS_TOKEN")
        configuration.databasePath = database == ":memory:" ? nil : database
        configuration.developmentMode = development
        if !janus.isEmpty {
            guard janus.hasPrefix("ws://") || janus.hasPrefix("wss://") else { throw ValidationError("--janus takes a ws:// or wss:// URL") }
            configuration.janus = JanusSettings(url: janus, clientURL: janusClientUrl.isEmpty ? nil : janusClientUrl)
        }
        configuration.apns = try apns.settings()
        configuration.ringTimeout = .seconds(ringTimeout)
        configuration.heartbeat = heartbeat
        configuration.trustedProxies = Self.list(trustedProxies)
        configuration.nodeBus = nodeBus
        configuration.nodeAddress = nodeAddress ?? Self.env("PARLEY_NODE_ADDRESS")
        configuration.limits.httpRequestsPerSecond = httpRateLimit
        configuration.limits.httpBurst = max(1, httpRateLimit * 10)
        configuration.limits.framesPerSecond = frameRateLimit
        configuration.limits.burst = max(1, frameRateLimit * 4)
        configuration.iceServers = IceServerProvider(stunURLs: Self.list(stunUrls), turnURLs: Self.list(turnUrls),
                                                     turnSecret: turnSecret ?? Self.env("PARLEY_TURN_SECRET"))

        let host = self.host
        let databaseLabel = configuration.databasePath.map { path in
            (try? PostgresLocation(url: path)).map { "PostgreSQL \($0)" } ?? "SQLite \(path)"
        } ?? "in memory"
        let janusLabel = configuration.janus?.url
        let pushLabel = configuration.apns.map(APNsOptions.describe) ?? "no pushes (no APNs key: see --apns-key-file)"
        let server: SignalingServer
        do {
            server = try await SignalingServer(configuration: configuration, logger: logger) { port in
                let base = "http://\(host.contains(":") ? "[\(host)]" : host):\(port)"
                var lines = ["parley: signaling server listening on \(base) (WebSocket \(base.replacingOccurrences(of: "http", with: "ws"))/v1/signal)"]
                lines.append("parley: database \(databaseLabel)")
                if let janusLabel { lines.append("parley: rooms on Janus AudioBridge at \(janusLabel)") }
                lines.append("parley: \(pushLabel)")
                lines.append("parley: browser client at \(base)/ (two windows, two names, one calls the other)")
                if development {
                    if !loopback {
                        lines.append("parley: WARNING: development mode on \(host), which is not loopback: anyone who reaches it can mint a token for any user (docs/threat-model.md)")
                    }
                    lines.append("parley: development mode: get a token with")
                    lines.append("  curl -s -X POST \(base)/v1/dev/tokens -H 'content-type: application/json' -d '{\"user\":\"alice\",\"name\":\"Alice\"}'")
                }
                try? FileHandle.standardOutput.write(contentsOf: Data((lines.joined(separator: "\n") + "\n").utf8))
            }
        } catch let error as APNsConfigurationError {
            throw ValidationError(error.description)
        }
        try await server.run()
    }

    static func env(_ name: String) -> String? {
        ProcessInfo.processInfo.environment[name].flatMap { $0.isEmpty ? nil : $0 }
    }

    static func list(_ text: String) -> [String] {
        text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }
}

private func env(_ name: String) -> String? { Serve.env(name) }

extension NodeBus: ExpressibleByArgument {}
