import Foundation
import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

/// The limits docs/threat-model.md lists for the HTTP endpoints, each tried past its edge: what is
/// refused says why, and what was there before is untouched. (The WebSocket's limits — frame size,
/// frame rate, hello, heartbeat, token expiry, outbound queue, resume buffer — have theirs in
/// LiveServerTests, BackpressureTests and HubSessionTests.)
@Suite("Limits", .timeLimit(.minutes(5)))
struct LimitTests {
    /// Past an address's burst, HTTP requests and WebSocket upgrades alike are answered 429 with
    /// Retry-After, before their tokens are read; another address, and /healthz, are not held up;
    /// the bucket refills at the sustained rate.
    @Test func requestsPastAnAddressesBurstAre429WithRetryAfter() async throws {
        // A token back every 10 s: nothing refills while the test runs, however slow the machine.
        let server = try await LiveServer.start {
            $0.limits.httpRequestsPerSecond = 0.1
            $0.limits.httpBurst = 6
        }
        let token = try await server.token("alice")
        for index in 0..<6 {
            #expect(try await server.http("GET", "/v1/ice-servers", token: token).status == 200, "request \(index) is within the burst")
        }
        let refused = try await server.http("GET", "/v1/ice-servers", token: token)
        #expect(refused.status == 429)
        let retryAfter = Int(refused.headers["retry-after"] ?? "") ?? 0
        #expect((1...10).contains(retryAfter), "\(refused.headers)")
        let body = try refused.decode(HTTPErrorBody.self)
        #expect(body.error.code == .rateLimited && body.error.message.contains("retry in"), "\(body)")
        #expect(try await server.http("POST", "/v1/dev/tokens", json: #"{"user":"mallory"}"#).status == 429, "a token request counts too")
        #expect(try await server.http("GET", "/healthz").status == 200, "a load balancer's health check is never refused")

        let (socket, upgrade, head) = try await RawWebSocket.upgrade(port: server.port, headers: ["Authorization": "Bearer \(token)"])
        #expect(upgrade == 429, "\(head)")
        #expect(try await socket.refusal(head: head).error.code == .rateLimited)
        #expect(head.lowercased().contains("retry-after: "), "\(head)")
        // Counted before the token is read: a flood of bad tokens is limited like any other.
        for headers in [[:], ["Authorization": "Bearer garbage"]] {
            let (_, status, _) = try await RawWebSocket.upgrade(port: server.port, headers: headers)
            #expect(status == 429, "\(headers)")
        }
        let (_, elsewhere, _) = try await RawWebSocket.upgrade(port: server.port, headers: ["Authorization": "Bearer \(token)"], source: "127.0.0.2")
        #expect(elsewhere == 101, "another address has its own bucket")
        try await server.stop()
    }

    /// Behind a reverse proxy every request comes from the proxy: for one named as trusted, the
    /// client its X-Forwarded-For names is counted instead; from anyone else the header is ignored.
    @Test func behindATrustedProxyTheForwardedClientIsCounted() async throws {
        let server = try await LiveServer.start {
            $0.limits.httpRequestsPerSecond = 0.1
            $0.limits.httpBurst = 2
            $0.trustedProxies = ["127.0.0.1"]
        }
        func status(_ client: String) async throws -> Int {
            try await server.http("GET", "/v1/calls", headers: ["X-Forwarded-For": "192.0.2.99, \(client)"]).status
        }
        #expect(try await status("198.51.100.7") == 401)
        #expect(try await status("198.51.100.7") == 401)
        #expect(try await status("198.51.100.7") == 429, "the client's burst is spent")
        #expect(try await status("198.51.100.8") == 401, "another client behind the same proxy is not")
        try await server.stop()

        #expect(AddressRateLimiter.client(peer: "203.0.113.5", forwardedFor: "198.51.100.7", trustedProxies: ["127.0.0.1"]) == "203.0.113.5",
                "an untrusted peer's header is ignored")
        #expect(AddressRateLimiter.key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64")
        #expect(AddressRateLimiter.key("2001:db8:1:2:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64", "one /64, one bucket")
        #expect(AddressRateLimiter.key("2001:db8::1") == "2001:db8:0:0::/64")
        #expect(AddressRateLimiter.key("::ffff:192.0.2.1") == "192.0.2.1")
        #expect(AddressRateLimiter.key("192.0.2.1") == "192.0.2.1")
    }

    @Test func noLimitWhenTheRateIsZero() async throws {
        let server = try await LiveServer.start {
            $0.limits.httpRequestsPerSecond = 0
            $0.limits.httpBurst = 1
        }
        for _ in 0..<30 { #expect(try await server.http("GET", "/v1/calls").status == 401) }
        try await server.stop()
    }

    /// The table of addresses is bounded, and forgets first the addresses that are back to a full bucket.
    @Test func theAddressTableIsBounded() {
        let limiter = AddressRateLimiter(rate: 1, burst: 2, maxAddresses: 100)
        for index in 0..<1_000 { #expect(limiter.admit("10.0.\(index / 256).\(index % 256)", now: .zero) == nil) }
        #expect(limiter.addressCount <= 100)
        #expect(limiter.admit("192.0.2.1", now: .zero) == nil)
        #expect(limiter.admit("192.0.2.1", now: .zero) == nil)
        #expect(limiter.admit("192.0.2.1", now: .zero) == .milliseconds(1_000), "the third at once waits a second")
        #expect(limiter.admit("192.0.2.1", now: .milliseconds(1_000)) == nil)
        #expect(AddressRateLimiter.retryAfter(.milliseconds(1)) == 1)
        #expect(AddressRateLimiter.retryAfter(.milliseconds(2_100)) == 3)

        // A flooder that spent its burst keeps its empty bucket, however many addresses come after it.
        let flood = AddressRateLimiter(rate: 1, burst: 2, maxAddresses: 100)
        for _ in 0..<2 { #expect(flood.admit("192.0.2.9", now: .zero) == nil) }
        #expect(flood.admit("192.0.2.9", now: .zero) != nil)
        for index in 0..<1_000 { _ = flood.admit("10.1.\(index / 256).\(index % 256)", now: .zero) }
        #expect(flood.admit("192.0.2.9", now: .zero) != nil, "still refused")
        // Forgotten first: the addresses whose buckets are full again, not those that still owe.
        let refill = AddressRateLimiter(rate: 1, burst: 2, maxAddresses: 100)
        for index in 0..<50 { _ = refill.admit("10.2.0.\(index)", now: .zero) }
        for index in 0..<50 { for _ in 0..<2 { _ = refill.admit("10.3.0.\(index)", now: .seconds(9)) } }
        for index in 0..<20 { _ = refill.admit("10.4.0.\(index)", now: .seconds(10)) }
        for index in 0..<50 {
            #expect(refill.admit("10.3.0.\(index)", now: .seconds(10)) == nil, "one token back after a second")
            #expect(refill.admit("10.3.0.\(index)", now: .seconds(10)) != nil, "and only one: 10.3.0.\(index) was remembered")
        }
    }

    /// A body over 64 KiB is refused with 413 and nothing of it is stored.
    @Test func aBodyOverTheLimitIs413() async throws {
        let server = try await LiveServer.start()
        let alice = try await server.token("alice")
        // 64 KiB, as server.md says: a body just under it is read (and its field named), one over refused.
        let fits = #"{"platform":"ios","voip":{"token":"ab","topic":""# + String(repeating: "a", count: 60 * 1024) + #"","environment":"sandbox"}}"#
        let read = try await server.http("PUT", "/v1/devices/iphone-1", token: alice, json: fits)
        #expect(read.status == 400, "read, and refused for its topic")
        #expect(try read.decode(HTTPErrorBody.self).error.message.contains("topic"))
        let padding = String(repeating: "a", count: 64 * 1024)
        let big = #"{"platform":"ios","pad":""# + padding + #""}"#
        let refused = try await server.http("PUT", "/v1/devices/iphone-1", token: alice, json: big)
        #expect(refused.status == 413)
        #expect(try refused.decode(HTTPErrorBody.self).error.code == .payloadTooLarge)
        #expect(try await server.server.store.devices(of: "alice").isEmpty)
        #expect(try await server.http("POST", "/v1/dev/tokens", json: #"{"user":"alice","name":""# + padding + #""}"#).status == 413)
        try await server.stop()
    }

    /// A user registers at most `devicesPerUser` devices: a new one past that is refused (409) and
    /// says what to do; the registered ones can still be updated, and other users are not affected.
    @Test func devicesPerUserAreCapped() async throws {
        let server = try await LiveServer.start { $0.limits.devicesPerUser = 3 }
        let alice = try await server.token("alice")
        let body = #"{"platform":"linux"}"#
        for index in 1...3 { #expect(try await server.http("PUT", "/v1/devices/d\(index)", token: alice, json: body).status == 200) }
        let refused = try await server.http("PUT", "/v1/devices/d4", token: alice, json: body)
        #expect(refused.status == 409)
        #expect(try refused.decode(HTTPErrorBody.self).error.message.contains("remove one"))
        #expect(try await server.http("PUT", "/v1/devices/d2", token: alice, json: #"{"platform":"web"}"#).status == 200, "an update is not a new device")
        #expect(try await server.server.store.devices(of: "alice").count == 3)
        #expect(try await server.http("PUT", "/v1/devices/d1", token: try await server.token("bob"), json: body).status == 200)
        #expect(try await server.http("DELETE", "/v1/devices/d1", token: alice).status == 204)
        #expect(try await server.http("PUT", "/v1/devices/d4", token: alice, json: body).status == 200, "room again once one is removed")
        try await server.stop()
    }

    /// The same cap holds for devices connected at once: one more device's hello is refused and its
    /// connection closed (1008); a device already there reconnects, and other users connect.
    @Test func devicesConnectedPerUserAreCapped() async throws {
        let server = try await LiveServer.start { $0.limits.devicesPerUser = 2 }
        let phone = try await server.device("alice", "phone")
        let laptop = try await server.device("alice", "laptop")
        let third = try await WSTestClient.connect(url: server.signalURL, token: try await server.token("alice"))
        third.send(.hello(Hello(id: "h3", device: "tablet")))
        let refusal = try await third.expect { frame -> ErrorMessage? in
            if case .error(let error) = frame.message { return error }
            return nil
        }
        #expect(refusal.re == "h3" && refusal.code == .forbidden, "\(refusal)")
        #expect(refusal.message.contains("2 devices"))
        #expect(await third.closeCode() == CloseCode.policy.rawValue)

        let again = try await server.device("alice", "laptop")  // replaces its own connection
        #expect(again.welcome?.device == "laptop")
        _ = try await server.device("bob", "phone")
        #expect(!phone.isClosed)
        _ = laptop
        try await server.stop()
    }
}
