import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
@_exported import ParleyLocalServices
import ParleyProtocol
import ParleyServer
import ServiceLifecycle

/// The real signaling server on an ephemeral loopback port, for tests: yours and Parley's own.
///
/// ```swift
/// let server = try await LiveServer.start()
/// let token = try await server.token("alice")
/// // … connect clients to server.signalURL …
/// try await server.stop()
/// ```
public final class LiveServer: Sendable {
    public let server: SignalingServer
    public let port: Int
    public let databasePath: String?
    private let task: Task<Void, any Error>
    private let group: ServiceGroup

    public static func start(databasePath: String? = nil, pushSender: (any PushSender)? = nil, configure: (inout ServerConfiguration) -> Void = { _ in }) async throws -> LiveServer {
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
        let task = Task {
            // A start that fails ends the run before it says a port: the wait ends too.
            defer { portContinuation.finish() }
            try await group.run()
        }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else {
            task.cancel()
            let why = if case .failure(let error) = await task.result { ": \(error)" } else { "" }
            throw TestFailure("the server did not start\(why)")
        }
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
    public func stop() async throws {
        await group.triggerGracefulShutdown()
        try await task.value
    }

    public var baseURL: String { "http://127.0.0.1:\(port)" }
    public var signalURL: String { "ws://127.0.0.1:\(port)/v1/signal" }

    public func token(_ user: UserID, name: String? = nil, lifetime: Duration = .seconds(3600)) async throws -> String {
        try await server.mintToken(user: user, name: name, lifetime: lifetime)
    }

    // MARK: HTTP

    public struct HTTPResult: Sendable {
        public var status: Int
        public var headers: [String: String]
        public var body: Data

        public func decode<T: Decodable>(_ type: T.Type) throws -> T { try JSONDecoder().decode(T.self, from: body) }
    }

    public func http(_ method: String, _ path: String, token: String? = nil, json: String? = nil,
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

