import Foundation
import Logging
import ParleyProtocol
import ParleyServer
import ServiceLifecycle

/// A signaling server inside this process: development mode on loopback for the demo, or a LAN
/// listener's own hub on every interface (`parley listen --lan`).
struct EmbeddedServer {
    let base: URL
    let port: Int
    let server: SignalingServer
    private let group: ServiceGroup
    private let task: Task<Void, any Error>

    static func start(database: String?, janus: JanusSettings? = nil, logger: Logger) async throws -> EmbeddedServer {
        var configuration = ServerConfiguration()
        configuration.janus = janus
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.developmentMode = true
        configuration.databasePath = database
        configuration.tokenKey = .hs256(secret: ServerConfiguration.developmentSecret)
        return try await start(configuration, logger: logger)
    }

    /// The call part of protocol v1 for callers on the local network: tokens only with the PIN (when
    /// set), calls only to `user`, a secret of this run's own, nothing kept after it.
    static func startLAN(user: UserID, pin: String?, port: Int, logger: Logger) async throws -> EmbeddedServer {
        var configuration = ServerConfiguration()
        configuration.host = "0.0.0.0"
        configuration.port = port
        configuration.developmentMode = false
        configuration.databasePath = nil
        configuration.lan = LANSettings(host: user, pin: pin)
        var secret = [UInt8](repeating: 0, count: 32)
        for index in secret.indices { secret[index] = UInt8.random(in: 0...255) }
        configuration.tokenKey = .hs256(secret: secret.map { String(format: "%02x", $0) }.joined())
        return try await start(configuration, logger: logger)
    }

    private static func start(_ configuration: ServerConfiguration, logger: Logger) async throws -> EmbeddedServer {
        let (ports, portSink) = AsyncStream<Int>.makeStream()
        let server = try await SignalingServer(configuration: configuration, logger: logger) { port in
            portSink.yield(port)
            portSink.finish()
        }
        let group = server.makeServiceGroup(signals: [])
        // Owned by the server: `stop()` awaits it.
        let task = Task {
            // A port taken, or an address not ours, ends the run before it says a port: the wait ends too.
            defer { portSink.finish() }
            try await group.run()
        }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else {
            task.cancel()
            let why = if case .failure(let error) = await task.result { ": \(error)" } else { "" }
            throw fail("the embedded server did not start\(why)")
        }
        return EmbeddedServer(base: URL(string: "http://127.0.0.1:\(port)")!, port: port, server: server, group: group, task: task)
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}
