import Foundation
import Logging
import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

/// A LAN listener's own hub (`parley listen --lan`): who gets a token, whom a caller may call, and
/// what the listener's user sees of a caller.
@Suite("LAN listener hub", .timeLimit(.minutes(5)))
struct LANHubTests {
    let call: CallID = "3a0e5d52-7a51-4f7e-9d3c-52b1e0c8a111"

    static func start(pin: String?) async throws -> LiveServer {
        try await LiveServer.start {
            $0.developmentMode = false
            $0.lan = LANSettings(host: "bob", pin: pin)
            $0.tokenKey = .hs256(secret: String(repeating: "k", count: 40))
        }
    }

    func lanToken(_ server: LiveServer, _ body: String) async throws -> LiveServer.HTTPResult {
        try await server.http("POST", "/v1/lan/tokens", json: body)
    }

    @Test func aCallerWithThePINGetsATokenAndCallsTheListenerWhoSeesItsAddress() async throws {
        let server = try await Self.start(pin: "4321")
        let answer = try await lanToken(server, #"{"user": "alice", "name": "Alice", "pin": "4321"}"#)
        #expect(answer.status == 200)
        let token = try answer.decode(DevTokenResponse.self).token
        let bob = try await server.device("bob", "listener")
        let alice = try await WSTestClient.connect(url: server.signalURL, token: token)
        #expect(try await alice.hello(device: "a1").user == "alice")

        #expect(try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
        let incoming = try await bob.expect { if case .callIncoming(let m) = $0.message { m } else { nil } }
        #expect(incoming.from.user == "alice")
        #expect(incoming.from.name == "Alice")
        #expect(incoming.from.address == "127.0.0.1")
        #expect(try await bob.request { .callAccept(CallRequest(id: $0, call: call)) }.isSuccess)
        _ = try await alice.expect { if case .callAccepted = $0.message { true } else { nil } }
        try await server.stop()
    }

    @Test func aWrongOrMissingPINAndTheListenersOwnUserGetNoToken() async throws {
        let server = try await Self.start(pin: "4321")
        let wrong = try await lanToken(server, #"{"user": "alice", "pin": "1111"}"#)
        #expect(wrong.status == 403)
        #expect(String(decoding: wrong.body, as: UTF8.self).contains("wrong PIN"))
        let missing = try await lanToken(server, #"{"user": "alice"}"#)
        #expect(missing.status == 403)
        #expect(String(decoding: missing.body, as: UTF8.self).contains("asks for a PIN"))
        // Nobody may pose as the listener's user: its calls and its history are the listener's own.
        let impostor = try await lanToken(server, #"{"user": "bob", "pin": "4321"}"#)
        #expect(impostor.status == 409)
        let malformed = try await lanToken(server, #"{"user": "not a user id!", "pin": "4321"}"#)
        #expect(malformed.status == 400)
        try await server.stop()
    }

    @Test func pinTriesFromOneAddressAreLimited() async throws {
        let server = try await Self.start(pin: "4321")
        for attempt in 1...5 {
            let answer = try await lanToken(server, #"{"user": "mallory", "pin": "\#(1000 + attempt)"}"#)
            #expect(answer.status == 403)
        }
        // The sixth try is refused before its PIN is looked at, the right one included.
        let limited = try await lanToken(server, #"{"user": "mallory", "pin": "4321"}"#)
        #expect(limited.status == 429)
        #expect(Int(limited.headers["retry-after"] ?? "") ?? 0 >= 1)
        try await server.stop()
    }

    @Test func withoutAPINAnyCallerGetsATokenButMayCallOnlyTheListener() async throws {
        let server = try await Self.start(pin: nil)
        let token = try await lanToken(server, #"{"user": "alice"}"#).decode(DevTokenResponse.self).token
        let carol = try await WSTestClient.connect(url: server.signalURL,
                                                   token: try await lanToken(server, #"{"user": "carol"}"#).decode(DevTokenResponse.self).token)
        _ = try await carol.hello(device: "c1")
        let alice = try await WSTestClient.connect(url: server.signalURL, token: token)
        _ = try await alice.hello(device: "a1")
        // Another caller connected to the same listener is not reachable through it.
        let relayed = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "carol")) }
        guard case .failure(let error) = relayed else { Issue.record("an invite to another caller was accepted"); return }
        #expect(error.code == .forbidden)
        let room = try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby")) }
        guard case .failure(let refused) = room else { Issue.record("a room was joined on a LAN listener"); return }
        #expect(refused.code == .forbidden)
        // A LAN listener is no development server.
        #expect(try await server.http("POST", "/v1/dev/tokens", json: #"{"user": "alice"}"#).status == 404)
        try await server.stop()
    }

    @Test func anOrdinaryServerHasNoLANTokensAndNoAddressInInvites() async throws {
        let server = try await LiveServer.start()
        #expect(try await lanToken(server, #"{"user": "alice"}"#).status == 404)
        let alice = try await server.device("alice", "a1")
        let bob = try await server.device("bob", "b1")
        #expect(try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
        let incoming = try await bob.expect { if case .callIncoming(let m) = $0.message { m } else { nil } }
        #expect(incoming.from.address == nil)
        try await server.stop()
    }

    /// And on PostgreSQL: a LAN listener's server is a node of its own, never a deployment's.
    @Test func aLANConfigurationIsRefusedInDevelopmentModeOrWithAnEmptyPINOrOnPostgreSQL() {
        var configuration = ServerConfiguration()
        configuration.lan = LANSettings(host: "bob")
        #expect(throws: ConfigurationError.self) { try configuration.validate() }
        configuration.developmentMode = false
        configuration.lan?.pin = ""
        #expect(throws: ConfigurationError.self) { try configuration.validate() }
        configuration.lan?.pin = "1234"
        #expect(throws: Never.self) { try configuration.validate() }
        configuration.databasePath = "postgres://parley@127.0.0.1/parley"
        #expect(throws: ConfigurationError.self) { try configuration.validate() }
    }

    @Test func aCallerCannotTakeAnotherCallersUserIdOrReadAnythingUnderIt() async throws {
        let server = try await Self.start(pin: nil)
        let token = try await lanToken(server, #"{"user": "alice"}"#).decode(DevTokenResponse.self).token
        let alice = try await WSTestClient.connect(url: server.signalURL, token: token)
        _ = try await alice.hello(device: "a1")
        // While alice is there, nobody else gets a token as alice (it would take over her session).
        let second = try await lanToken(server, #"{"user": "alice"}"#)
        #expect(second.status == 409)
        #expect(String(decoding: second.body, as: UTF8.self).contains("already connected"))
        // No history, devices, ICE servers or pages under any user id on a LAN listener.
        for (method, path) in [("GET", "/v1/calls"), ("PUT", "/v1/devices/a1"), ("GET", "/v1/ice-servers"), ("GET", "/")] {
            let answer = try await server.http(method, path, token: token, json: method == "PUT" ? #"{"platform": "linux"}"# : nil)
            #expect(answer.status == 404, "\(method) \(path) answered \(answer.status)")
        }
        try await server.stop()
    }

    @Test func aNameThatCouldRewriteTheCalleesScreenIsRefused() async throws {
        let server = try await Self.start(pin: nil)
        for name in ["Alice\u{1B}[2K at 10.0.0.1", "Alice\nat 10.0.0.1", "Alice\u{202E}1.0.0.01 ta"] {
            let body = String(decoding: try JSONEncoder().encode(LANTokenRequest(user: "alice", name: name)), as: UTF8.self)
            #expect(try await lanToken(server, body).status == 400, "\(name.debugDescription)")
        }
        #expect(try await lanToken(server, #"{"user": "alice", "name": "Alice Liddell ✨"}"#).status == 200)
        try await server.stop()
    }

    @Test func oneCallRingsTheListenerAtATime() async throws {
        let server = try await Self.start(pin: nil)
        _ = try await server.device("bob", "listener")
        var callers: [WSTestClient] = []
        for user in ["alice", "carol"] {
            let token = try await lanToken(server, #"{"user": "\#(user)"}"#).decode(DevTokenResponse.self).token
            let client = try await WSTestClient.connect(url: server.signalURL, token: token)
            _ = try await client.hello(device: DeviceID(rawValue: "d-\(user)")!)
            callers.append(client)
        }
        #expect(try await callers[0].request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.isSuccess)
        let second = try await callers[1].request { .callInvite(CallInvite(id: $0, call: "9b7f0b8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", to: "bob")) }
        guard case .failure(let busy) = second else { Issue.record("a second caller rang the listener at once"); return }
        #expect(busy.code == .rateLimited)
        try await server.stop()
    }

    /// Through the server: wrong PINs count toward the network's lockout (here from one address
    /// allowed many tries), and past them the right PIN is refused too.
    @Test func enoughWrongPINsLockTheListenerForEveryone() async throws {
        let server = try await LiveServer.start {
            $0.developmentMode = false
            var lan = LANSettings(host: "bob", pin: "4321")
            lan.pinAttempts = 100
            $0.lan = lan
            $0.tokenKey = .hs256(secret: String(repeating: "k", count: 40))
        }
        for index in 0..<LANGate.networkFailures {
            #expect(try await lanToken(server, #"{"user": "alice", "pin": "0\#(index)"}"#).status == 403)
        }
        let locked = try await lanToken(server, #"{"user": "alice", "pin": "4321"}"#)
        #expect(locked.status == 429)
        #expect(String(decoding: locked.body, as: UTF8.self).contains("too many wrong PINs from this network"), "\(locked)")
        try await server.stop()
    }

    @Test func wrongPINsFromManyAddressesLockTheWholeNetworkOut() {
        var settings = LANSettings(host: "bob", pin: "4321")
        settings.lockout = .seconds(60)
        let gate = LANGate(settings: settings, logger: Logger(label: "test"))
        let start = ContinuousClock.now
        for index in 0..<LANGate.networkFailures {
            #expect(gate.admit(address: "198.51.100.\(index)", now: start) == .admitted)
            gate.failed(now: start)
        }
        guard case .wait(let wait, everyone: true) = gate.admit(address: "203.0.113.9", now: start + .seconds(1)) else {
            Issue.record("a fresh address was let try after \(LANGate.networkFailures) wrong PINs")
            return
        }
        #expect(wait > .seconds(500))
        // The window passes: tries are taken again.
        #expect(gate.admit(address: "203.0.113.9", now: start + .seconds(601)) == .admitted)
    }
}
