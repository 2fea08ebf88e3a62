import Foundation
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import Testing

/// What a WebSocket upgrade of `/v1/signal` is answered, as browsers and libraries send it.
@Suite("WebSocket upgrade answers", .timeLimit(.minutes(5)))
struct UpgradeTests {
    @Test func tokenFailuresAre401AndAShuttingDownServerIs503() async throws {
        let server = try await LiveServer.start()
        let expired = try await server.token("alice", lifetime: .seconds(-60))
        let forged = try await server.token("alice") + "x"
        for (headers, why) in [([:], "no token"), (["Authorization": "Bearer \(forged)"], "forged"),
                               (["Authorization": "Bearer \(expired)"], "expired")] as [([String: String], String)] {
            let (socket, status, head) = try await RawWebSocket.upgrade(port: server.port, headers: headers)
            #expect(status == 401, "\(why): \(head)")
            #expect(try await socket.refusal(head: head).error.code == .unauthorized, "protocol v1's error body")
        }
        let (_, queryStatus, _) = try await RawWebSocket.upgrade(port: server.port, path: "/v1/signal?access_token=\(forged)", headers: [:])
        #expect(queryStatus == 401)
        let (_, okStatus, _) = try await RawWebSocket.upgrade(port: server.port, headers: ["Authorization": "Bearer \(try await server.token("alice"))"])
        #expect(okStatus == 101)
        try await server.stop()
    }
}

@Suite("Safe defaults", .timeLimit(.minutes(5)))
struct SafeDefaultsTests {
    @Test func aShuttingDownServerAnswersUpgradesWith503() async throws {
        let server = try await LiveServer.start()
        await server.server.hub.shutdown()
        let (socket, status, head) = try await RawWebSocket.upgrade(port: server.port, headers: ["Authorization": "Bearer \(try await server.token("alice"))"])
        #expect(status == 503)
        #expect(try await socket.refusal(head: head).error.code == .unavailable)
        try await server.stop()
    }

    @Test func browserPagesConnectFromTheServersOwnOriginTheAllowListOrLocalPagesInDevelopment() async throws {
        let production = try await LiveServer.start {
            $0.developmentMode = false
            $0.allowedOrigins = ["https://app.example.com"]
        }
        let token = try await production.token("alice")
        func status(_ server: LiveServer, origin: String?) async throws -> Int {
            var headers = ["Authorization": "Bearer \(token)"]
            headers["Origin"] = origin
            return try await RawWebSocket.upgrade(port: server.port, headers: headers).status
        }
        #expect(try await status(production, origin: nil) == 101, "native clients send no Origin")
        #expect(try await status(production, origin: "http://127.0.0.1:\(production.port)") == 101, "the server's own page")
        #expect(try await status(production, origin: "https://app.example.com") == 101)
        #expect(try await status(production, origin: "https://evil.example.net") == 403)
        let (evil, _, evilHead) = try await RawWebSocket.upgrade(port: production.port, headers: ["Authorization": "Bearer \(token)",
                                                                                                   "Origin": "https://evil.example.net"])
        #expect(try await evil.refusal(head: evilHead).error.code == .forbidden)
        #expect(try await status(production, origin: "http://127.0.0.1:9999") == 403, "another local page, outside development mode")
        // swift-websocket (Parley's own CLI) sends Origin: ws://host, without the port; no browser does.
        #expect(try await status(production, origin: "ws://198.51.100.2") == 101, "a native WebSocket library")
        #expect(try await status(production, origin: "wss://parley.example.com") == 101)
        try await production.stop()

        let development = try await LiveServer.start()
        #expect(try await status(development, origin: "http://localhost:5173") == 101)
        #expect(try await status(development, origin: "https://evil.example.net") == 403)
        try await development.stop()
    }

    @Test func metricsNeedTheirTokenWhenOneIsConfigured() async throws {
        let open = try await LiveServer.start()
        #expect(try await open.http("GET", "/metrics").status == 200, "loopback scrapers")
        try await open.stop()
        let guarded = try await LiveServer.start { $0.metricsToken = "scrape-token-0123456789" }
        #expect(try await guarded.http("GET", "/metrics").status == 401)
        #expect(try await guarded.http("GET", "/metrics", token: "wrong").status == 401)
        #expect(try await guarded.http("GET", "/metrics", token: "scrape-token-0123456789").status == 200)
        try await guarded.stop()
    }

    @Test func offLoopbackTheServerRefusesThePublicOrAShortSecret() throws {
        var configuration = ServerConfiguration()
        configuration.host = "0.0.0.0"
        #expect(throws: ConfigurationError.self) { try configuration.validate() }
        configuration.tokenKey = .hs256(secret: "short")
        #expect(throws: ConfigurationError.self) { try configuration.validate() }
        configuration.tokenKey = .hs256(secret: String(repeating: "k", count: 32))
        #expect(throws: Never.self) { try configuration.validate() }
        configuration.host = "127.0.0.1"
        configuration.tokenKey = .hs256(secret: ServerConfiguration.developmentSecret)
        #expect(throws: Never.self) { try configuration.validate() }
    }
}
