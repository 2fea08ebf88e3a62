import Foundation
import Logging
import ParleyServer
import ServiceLifecycle

/// A signaling server inside this process: development mode, loopback, a port picked by the system.
struct EmbeddedServer {
    let base: URL
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
        let (ports, portSink) = AsyncStream<Int>.makeStream()
        let server = try await SignalingServer(configuration: configuration, logger: logger) { port in
            portSink.yield(port)
            portSink.finish()
        }
        let group = server.makeServiceGroup(signals: [])
        let task = Task { try await group.run() }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else {
            task.cancel()
            throw fail("the embedded server did not start")
        }
        return EmbeddedServer(base: URL(string: "http://127.0.0.1:\(port)")!, group: group, task: task)
    }

    func stop() async {
        await group.triggerGracefulShutdown()
        _ = try? await task.value
    }
}
