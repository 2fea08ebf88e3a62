import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import NIOCore
import ParleyProtocol
@testable import ParleyServer
import ServiceLifecycle
import WSClient

/// The real server on an ephemeral loopback port, with a SQLite file of its own.
final class LiveServer: Sendable {
    let server: SignalingServer
    let port: Int
    let databasePath: String?
    private let task: Task<Void, any Error>
    private let group: ServiceGroup

    static func start(databasePath: String? = nil, pushSender: (any VoIPPushSender)? = nil, configure: (inout ServerConfiguration) -> Void = { _ in }) async throws -> LiveServer {
        var configuration = ServerConfiguration()
        configuration.port = 0
        configuration.databasePath = databasePath
        configure(&configuration)
        var logger = Logger(label: "test.server")
        logger.logLevel = ProcessInfo.processInfo.environment["PARLEY_TEST_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .critical
        let (ports, portContinuation) = AsyncStream<Int>.makeStream()
        let server = try await SignalingServer(configuration: configuration, logger: logger, pushSender: pushSender) { port in
            portContinuation.yield(port)
            portContinuation.finish()
        }
        let group = server.makeServiceGroup(signals: [])
        let task = Task { try await group.run() }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else { throw TestFailure("the server did not start") }
        return LiveServer(server: server, port: port, databasePath: databasePath, task: task, group: group)
    }

    private init(server: SignalingServer, port: Int, databasePath: String?, task: Task<Void, any Error>, group: ServiceGroup) {
        self.server = server
        self.port = port
        self.databasePath = databasePath
        self.task = task
        self.group = group
    }

    /// Graceful shutdown, as on SIGTERM; returns when the server has stopped.
    func stop() async throws {
        await group.triggerGracefulShutdown()
        try await task.value
    }

    var baseURL: String { "http://127.0.0.1:\(port)" }
    var signalURL: String { "ws://127.0.0.1:\(port)/v1/signal" }

    func token(_ user: UserID, name: String? = nil, lifetime: Duration = .seconds(3600)) async throws -> String {
        try await server.tokens.mint(user: user, name: name, lifetime: lifetime).token
    }

    /// Connects a device and completes hello.
    func device(_ user: UserID, _ device: DeviceID, name: String? = nil) async throws -> WSTestClient {
        let client = try await WSTestClient.connect(url: signalURL, token: token(user, name: name))
        _ = try await client.hello(device: device)
        return client
    }

    // MARK: HTTP

    struct HTTPResult {
        var status: Int
        var headers: [String: String]
        var body: Data

        func decode<T: Decodable>(_ type: T.Type) throws -> T { try JSONDecoder().decode(T.self, from: body) }
    }

    func http(_ method: String, _ path: String, token: String? = nil, json: String? = nil,
              headers: [String: String] = [:]) async throws -> HTTPResult {
        var request = URLRequest(url: URL(string: baseURL + path)!)
        request.httpMethod = method
        if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        if let json {
            request.httpBody = Data(json.utf8)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, response) = try await URLSession.shared.data(for: request)
        let http = response as! HTTPURLResponse
        var fields: [String: String] = [:]
        for (key, value) in http.allHeaderFields { fields["\(key)".lowercased()] = "\(value)" }
        return HTTPResult(status: http.statusCode, headers: fields, body: data)
    }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

