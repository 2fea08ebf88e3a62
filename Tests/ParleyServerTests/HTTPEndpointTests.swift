import Foundation
import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

@Suite("HTTP endpoints", .timeLimit(.minutes(5)))
struct HTTPEndpointTests {
    /// The page at `/` and every module it imports, found by following the imports: all served,
    /// typed, and under a policy that lets the page load nothing from anywhere else.
    @Test func theBrowserClientIsServedWhole() async throws {
        let server = try await LiveServer.start()
        let page = try await server.http("GET", "/")
        #expect(page.status == 200)
        #expect(page.headers["content-type"] == "text/html; charset=utf-8")
        let html = String(decoding: page.body, as: UTF8.self)
        #expect(html.contains(#"<script type="module" src="/app/app.js">"#))
        var pending = ["app.js", "style.css"], seen: Set<String> = []
        while let name = pending.popLast() {
            guard seen.insert(name).inserted else { continue }
            let asset = try await server.http("GET", "/app/\(name)")
            #expect(asset.status == 200, "\(name)")
            #expect(asset.headers["content-type"]?.hasPrefix(name.hasSuffix(".js") ? "text/javascript" : "text/css") == true, "\(name)")
            #expect(asset.headers["content-security-policy"]?.contains("default-src 'self'") == true)
            #expect(asset.headers["x-content-type-options"] == "nosniff")
            let text = String(decoding: asset.body, as: UTF8.self)
            #expect(!text.contains("http://") && !text.contains("https://"), "\(name) fetches nothing from elsewhere")
            for match in text.matches(of: /from '\.\/([a-z]+\.js)'/) { pending.append(String(match.1)) }
        }
        #expect(seen.count >= 8, "app.js imports the other modules: \(seen.sorted())")
        #expect(try await server.http("GET", "/app/missing.js").status == 404)
        #expect(try await server.http("GET", "/app/..%2FPackage.swift").status == 404)
        try await server.stop()
    }

    @Test func devTokensOnlyInDevelopmentModeWithCORS() async throws {
        let server = try await LiveServer.start()
        let minted = try await server.http("POST", "/v1/dev/tokens", json: #"{"user":"alice","name":"Alice"}"#, headers: ["Origin": "http://example.test"])
        #expect(minted.status == 200)
        #expect(minted.headers["access-control-allow-origin"] == "*")
        let body = try minted.decode(DevTokenResponse.self)
        #expect(body.expiresAt > Int64(Date().timeIntervalSince1970 * 1000))
        let client = try await WSTestClient.connect(url: server.signalURL, token: body.token)
        #expect(try await client.hello(device: "a1").user == "alice")

        let preflight = try await server.http("OPTIONS", "/v1/dev/tokens", headers: ["Origin": "http://example.test",
                                                                                  "Access-Control-Request-Method": "POST",
                                                                                  "Access-Control-Request-Headers": "content-type"])
        #expect(preflight.status == 204)
        #expect(preflight.headers["access-control-allow-origin"] == "*")
        #expect(preflight.headers["access-control-allow-methods"]?.contains("POST") == true)
        #expect(try await server.http("GET", "/healthz").headers["access-control-allow-origin"] == nil, "no other endpoint sends CORS headers")

        #expect(try await server.http("POST", "/v1/dev/tokens", json: #"{"user":"not a valid id!"}"#).status == 400)
        #expect(try await server.http("POST", "/v1/dev/tokens", json: "{").status == 400)
        try await server.stop()

        let production = try await LiveServer.start { $0.developmentMode = false }
        let refused = try await production.http("POST", "/v1/dev/tokens", json: #"{"user":"alice"}"#)
        #expect(refused.status == 404)
        #expect(try refused.decode(HTTPErrorBody.self).error.code == .notFound)
        #expect(try await production.http("OPTIONS", "/v1/dev/tokens").status == 404)
        try await production.stop()
    }

    @Test func iceServersCarryTurnRestCredentials() async throws {
        let server = try await LiveServer.start {
            $0.iceServers = IceServerProvider(stunURLs: ["stun:127.0.0.1:3478"],
                                              turnURLs: ["turn:127.0.0.1:3478?transport=udp", "turn:127.0.0.1:3478?transport=tcp"],
                                              turnSecret: "coturn-shared-secret", ttl: 3600)
        }
        let before = Int64(Date().timeIntervalSince1970)
        let response = try await server.http("GET", "/v1/ice-servers", token: server.token("alice")).decode(IceServersResponse.self)
        #expect(response.ttl == 3600)
        #expect(response.iceServers.count == 2)
        #expect(response.iceServers[0] == IceServer(urls: ["stun:127.0.0.1:3478"]))
        let turn = response.iceServers[1]
        let parts = try #require(turn.username?.split(separator: ":"))
        #expect(parts.count == 2 && parts[1] == "alice")
        let expiry = try #require(Int64(parts[0]))
        #expect(expiry >= before + 3600 && expiry <= before + 3602)
        // coturn computes base64(HMAC-SHA1(secret, username)); this is RFC 2104's HMAC-SHA1 of the same.
        #expect(turn.credential == IceServerProvider.credential(secret: "coturn-shared-secret", username: turn.username!))
        #expect(IceServerProvider.credential(secret: "key", username: "The quick brown fox jumps over the lazy dog")
                == Data([0xde, 0x7c, 0x9b, 0x85, 0xb8, 0xb7, 0x8a, 0xa6, 0xbc, 0x8a, 0x7a, 0x36, 0xf7, 0x0a, 0x90, 0x70,
                         0x1c, 0x9d, 0xb4, 0xd9]).base64EncodedString(), "the RFC 2104 / Wikipedia test vector")

        let client = try await WSTestClient.connect(url: server.signalURL, token: server.token("bob"))
        let welcome = try await client.hello(device: "b1")
        #expect(welcome.iceServers.count == 2)
        #expect(welcome.iceServers[1].username?.hasSuffix(":bob") == true)
        try await server.stop()

        let bare = try await LiveServer.start()
        #expect(try await bare.http("GET", "/v1/ice-servers", token: bare.token("alice")).decode(IceServersResponse.self).iceServers == [])
        try await bare.stop()
    }

    @Test func devicesAreRegisteredPerUserAndValidated() async throws {
        let server = try await LiveServer.start()
        let alice = try await server.token("alice")
        let body = #"{"platform":"ios","voip":{"token":"a1b2c3d4","topic":"net.parley.app","environment":"sandbox"}}"#
        let put = try await server.http("PUT", "/v1/devices/iphone-1", token: alice, json: body)
        #expect(put.status == 200)
        let record = try put.decode(DeviceRecord.self)
        #expect(record.voip == VoIPRegistration(token: "a1b2c3d4", topic: "net.parley.app", environment: .sandbox))
        #expect(try await server.server.store.devices(of: "alice").map(\.device) == ["iphone-1"])

        #expect(try await server.http("PUT", "/v1/devices/iphone-1", token: alice, json: #"{"platform":"symbian"}"#).status == 400)
        #expect(try await server.http("PUT", "/v1/devices/iphone-1", token: alice, json: #"{"platform":"ios","voip":{"token":"zz","topic":"x","environment":"sandbox"}}"#).status == 400)
        #expect(try await server.http("PUT", "/v1/devices/iphone-1", token: alice, json: #"{"platform":"ios","voip":{"token":"ab","topic":"x","environment":"staging"}}"#).status == 400)
        #expect(try await server.http("PUT", "/v1/devices/iphone-1", json: body).status == 401)
        #expect(try await server.server.store.devices(of: "alice").first?.voip?.token == "a1b2c3d4", "bad input lost nothing")

        let bob = try await server.token("bob")
        #expect(try await server.http("DELETE", "/v1/devices/iphone-1", token: bob).status == 404, "another user's device")
        #expect(try await server.http("DELETE", "/v1/devices/iphone-1", token: alice).status == 204)
        #expect(try await server.server.store.devices(of: "alice").isEmpty)
        try await server.stop()
    }

    @Test func callHistoryIsNewestFirstForBothParties() async throws {
        let server = try await LiveServer.start()
        let alice = try await server.device("alice", "a1")
        _ = try await server.device("bob", "b1")
        let calls: [CallID] = ["00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002",
                               "00000000-0000-4000-8000-000000000003"]
        for call in calls {
            #expect(try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
            #expect(try await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.isSuccess)
        }
        let bobHistory = try await server.http("GET", "/v1/calls?limit=2", token: server.token("bob")).decode(CallList.self)
        #expect(bobHistory.calls.map(\.call) == [calls[2], calls[1]])
        #expect(bobHistory.calls.allSatisfy { $0.reason == .cancelled && $0.duration == nil && $0.answeredAt == nil })
        #expect(try await server.http("GET", "/v1/calls", token: server.token("alice")).decode(CallList.self).calls.count == 3)
        #expect(try await server.http("GET", "/v1/calls", token: server.token("carol")).decode(CallList.self).calls.isEmpty)
        #expect(try await server.http("GET", "/v1/calls?limit=200", token: server.token("bob")).status == 200)
        let tooMany = try await server.http("GET", "/v1/calls?limit=201", token: server.token("bob"))
        #expect(tooMany.status == 400, "1 to 200 (protocol.md)")
        #expect(try tooMany.decode(HTTPErrorBody.self).error.code == .badRequest)
        #expect(try await server.http("GET", "/v1/calls?limit=0", token: server.token("bob")).status == 400)
        #expect(try await server.http("GET", "/v1/calls?limit=lots", token: server.token("bob")).status == 400)
        try await server.stop()
    }

    /// Every refusal is protocol v1's error body, whichever layer refuses: the authenticator, the
    /// body decoder, a route, the CORS layer around one.
    @Test func everyRefusalSpeaksProtocolV1() async throws {
        let server = try await LiveServer.start()
        func refusal(_ result: LiveServer.HTTPResult, _ status: Int, _ code: ErrorCode, _ words: String,
                     sourceLocation: SourceLocation = #_sourceLocation) throws {
            #expect(result.status == status, sourceLocation: sourceLocation)
            #expect(result.headers["content-type"]?.hasPrefix("application/json") == true, sourceLocation: sourceLocation)
            let body = try result.decode(HTTPErrorBody.self)
            #expect(body.error.code == code && body.error.message.contains(words), "\(body)", sourceLocation: sourceLocation)
        }
        try refusal(try await server.http("GET", "/v1/calls"), 401, .unauthorized, "access token")
        try refusal(try await server.http("GET", "/v1/ice-servers", token: "not.a.token"), 401, .unauthorized, "access token")
        let alice = try await server.token("alice")
        try refusal(try await server.http("PUT", "/v1/devices/iphone-1", token: alice, json: #"{"platform":"ios","voip":{"token":"ab"}}"#),
                    400, .badRequest, "topic")
        // A bundle id (Apple's rule): a NUL, a space or a line break is none, whatever the store.
        for topic in [#"net.parley\u0000app"#, "net.parley app", #"net.parley\r\napns-priority: 5"#, "net.parley.app/"] {
            let json = #"{"platform":"ios","voip":{"token":"ab","topic":"\#(topic)","environment":"sandbox"}}"#
            try refusal(try await server.http("PUT", "/v1/devices/iphone-1", token: alice, json: json), 400, .badRequest, "bundle id")
        }
        #expect(try await server.http("PUT", "/v1/devices/iphone-1", token: alice,
                                      json: #"{"platform":"ios","voip":{"token":"ab","topic":"net.Parley-2.app","environment":"sandbox"}}"#).status == 200)
        try refusal(try await server.http("DELETE", "/v1/devices/nothing-here", token: alice), 404, .notFound, "no such device")
        try refusal(try await server.http("GET", "/v1/signal", token: alice), 426, .badRequest, "WebSocket")
        try refusal(try await server.http("GET", "/v1/signal"), 401, .unauthorized, "access token")
        // A token in the query is read on the upgrade only (it would be logged with URLs elsewhere).
        try refusal(try await server.http("GET", "/v1/calls?access_token=\(alice)"), 401, .unauthorized, "access token")
        try refusal(try await server.http("GET", "/v1/nothing-here", token: alice), 404, .notFound, "not found")
        try refusal(try await server.http("POST", "/v1/lan/tokens", json: #"{"user":"alice"}"#), 404, .notFound, "not found")
        let named = try await server.http("POST", "/v1/dev/tokens", json: #"{"user":"alice","name":"\#(String(repeating: "n", count: 129))"}"#,
                                          headers: ["Origin": "http://example.test"])
        try refusal(named, 400, .badRequest, "128 characters")
        #expect(named.headers["access-control-allow-origin"] == "*", "a refusal a page reads carries CORS too")
        try await server.stop()
    }

    @Test func healthAndMetrics() async throws {
        let server = try await LiveServer.start()
        #expect(try await server.http("GET", "/healthz").status == 200)
        let alice = try await server.device("alice", "a1")
        _ = try await server.device("bob", "b1")
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: "00000000-0000-4000-8000-000000000009", to: "bob")) }
        alice.sendRaw("{oops")
        _ = try await alice.next()
        let metrics = String(decoding: try await server.http("GET", "/metrics").body, as: UTF8.self)
        #expect(metrics.contains("parley_connections 2"))
        #expect(metrics.contains("parley_sessions 2"))
        #expect(metrics.contains(#"parley_calls{state="ringing"} 1"#))
        #expect(metrics.contains("parley_calls_started_total 1"))
        #expect(metrics.contains(#"parley_errors_total{code="bad_request"} 1"#))
        #expect(metrics.contains("parley_frames_in_total"))
        let page = try await server.http("GET", "/")
        #expect(page.status == 200)
        #expect(page.headers["content-type"]?.hasPrefix("text/html") == true)
        try await server.stop()
    }
}
