import Foundation
import ParleyAPNsTesting
import ParleyLocalServices
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import Testing

/// A real server whose pushes go through its APNs provider to the double.
struct PushHarness {
    static let topic = "net.parley.app"
    let team: APNsTestTeam
    let apns: APNsDouble
    let server: LiveServer

    static func start(configure: (inout ServerConfiguration) -> Void = { _ in }) async throws -> PushHarness {
        let team = try APNsTestTeam()
        let apns = try await team.makeDouble()
        let server = try await LiveServer.start { configuration in
            configuration.apns = APNsSettings(keyFile: team.keyFile, keyID: team.keyID, teamID: team.teamID, url: apns.url, caFile: apns.caFile)
            configure(&configuration)
        }
        return PushHarness(team: team, apns: apns, server: server)
    }

    /// Registers `device` of `user` with a VoIP token (and an alert token, if given); `known` installs
    /// the app on the double's side too.
    func register(_ user: UserID, _ device: String, token: String, alerts: String? = nil, environment: String = "production",
                  known: Bool = true) async throws {
        let alertsField = alerts.map { #","alerts":{"token":"\#($0)","topic":"\#(Self.topic)","environment":"\#(environment)"}"# } ?? ""
        let body = #"{"platform":"ios","voip":{"token":"\#(token)","topic":"\#(Self.topic)","environment":"\#(environment)"}\#(alertsField)}"#
        let status = try await server.http("PUT", "/v1/devices/\(device)", token: try await server.token(user), json: body).status
        #expect(status == 200)
        guard known else { return }
        apns.addDevice(token: token, topic: Self.topic)
        if let alerts { apns.addDevice(token: alerts, topic: Self.topic, pushType: "alert") }
    }

    func token(of user: UserID, _ device: DeviceID) async throws -> String? {
        try await server.server.store.devices(of: user).first { $0.device == device }?.voip?.token
    }

    /// Waits until `/metrics` shows `line` (a push's outcome is counted once its answer is read).
    func expectMetric(_ line: String, sourceLocation: SourceLocation = #_sourceLocation) async {
        do {
            try await eventually(timeout: .seconds(5), line) { server.server.metrics.exposition().contains(line) }
        } catch {
            Issue.record("no \(line) in\n\(server.server.metrics.exposition())", sourceLocation: sourceLocation)
        }
    }

    func stop() async throws {
        try await server.stop()
        await apns.stop()
        team.removeKeyFile()
    }
}

@Suite("Push through APNs", .timeLimit(.minutes(5)))
struct PushTests {
    static let sleeping = String(repeating: "ab", count: 32)
    static let online = String(repeating: "cd", count: 32)
    static let removed = String(repeating: "ef", count: 32)

    @Test func anInviteWakesOnlyDevicesWithATokenAndNoLiveConnection() async throws {
        let push = try await PushHarness.start()
        try await push.register("bob", "sleeping-iphone", token: Self.sleeping)
        try await push.register("bob", "online-iphone", token: Self.online)
        try await push.register("bob", "old-iphone", token: Self.removed)
        // The app left this phone after it registered: APNs answers 410 with a later time.
        push.apns.unregister(token: Self.removed, at: Date().addingTimeInterval(60))
        let online = try await push.server.device("bob", "online-iphone")
        let alice = try await push.server.device("alice", "a1", name: "Alice")
        let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"
        let invited = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get().decodeResult(CallInviteResult.self)
        #expect(invited.devices == 1)
        #expect(invited.pushed == 2)
        _ = try await online.expect { if case .callIncoming = $0.message { true } else { nil } }

        try await eventually { push.apns.requests.count == 2 }
        let delivered = try #require(push.apns.delivered.first)
        #expect(push.apns.delivered.count == 1)
        #expect(delivered.deviceToken == Self.sleeping)
        #expect(delivered.pushType == "voip")
        #expect(delivered.topic == "net.parley.app.voip")
        let payload = try JSONDecoder().decode(VoIPPushPayload.self, from: delivered.body)
        #expect(payload.parley.call == call)
        #expect(payload.parley.from.user == "alice")
        #expect(payload.parley.from.name == "Alice")
        #expect(delivered.headers["apns-expiration"] == String(payload.parley.expiresAt / 1000))
        #expect(!String(decoding: delivered.body, as: UTF8.self).contains("device"), "the push body's from carries no device")

        // APNs said 410 for the old phone, after its registration: the token is gone, the others stay.
        try await eventually { try await push.token(of: "bob", "old-iphone") == nil }
        #expect(try await push.token(of: "bob", "sleeping-iphone") == Self.sleeping)
        await push.expectMetric(#"parley_pushes_total{type="voip",outcome="delivered"} 1"#)
        await push.expectMetric(#"parley_pushes_total{type="voip",outcome="token_invalid"} 1"#)
        await push.expectMetric("parley_push_tokens_removed_total 1")
        await push.expectMetric(#"parley_apns_responses_total{status="410"} 1"#)
        await push.expectMetric("parley_apns_request_duration_seconds_count 2")
        try await push.stop()
    }

    static let alerts = String(repeating: "a1", count: 32)

    @Test func aCancelledCallSendsTheWokenDeviceAMissedCallAlertNotAVoIPPush() async throws {
        let push = try await PushHarness.start()
        try await push.register("bob", "sleeping-iphone", token: Self.sleeping, alerts: Self.alerts)
        // A device with a VoIP token only cannot take an alert: it gets none.
        try await push.register("bob", "voip-only-ipad", token: Self.removed)
        let alice = try await push.server.device("alice", "a1", name: "Alice")
        let call: CallID = "0b0c7a52-9d5e-4f0e-8d1b-6f4e1b9d2a10"
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
        try await eventually { push.apns.delivered.count == 2 }
        _ = try await alice.request { .callHangup(CallHangup(id: $0, call: call)) }.get()

        try await eventually { push.apns.delivered.count == 3 }
        let alert = try #require(push.apns.delivered.last)
        #expect(alert.pushType == "alert")
        #expect(alert.deviceToken == Self.alerts, "to the app's notification token, not the VoIP one")
        #expect(alert.topic == "net.parley.app", "an alert's topic is the bundle id")
        let body = try JSONDecoder().decode(MissedCallAlert.self, from: alert.body)
        #expect(body.aps.alert.title == "Missed call")
        #expect(body.aps.alert.body == "Alice (alice)")
        #expect(body.parley.missedCall.call == call)
        // The woken device learns the call's fate over signaling.
        let woken = try await push.server.device("bob", "sleeping-iphone")
        let state = try await woken.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(state.reason == .cancelled)
        #expect(push.apns.delivered.filter { $0.pushType == "voip" }.count == 2, "a cancellation is never a VoIP push")
        // Nothing more comes (a check that something does not happen): none was even tried on the
        // VoIP-only device, where APNs would refuse it and it would never count as delivered.
        try await Task.sleep(for: .milliseconds(200))
        #expect(push.apns.requests.filter { $0.pushType == "alert" }.count == 1, "none to the VoIP-only device")
        #expect(!push.apns.requests.contains { $0.deviceToken == Self.removed && $0.pushType != "voip" })
        await push.expectMetric(#"parley_pushes_total{type="alert",outcome="delivered"} 1"#)
        try await push.stop()
    }

    @Test func anUnansweredCallAlertsAndAnAnsweredOneDoesNot() async throws {
        let push = try await PushHarness.start { $0.ringTimeout = .seconds(1) }
        try await push.register("bob", "sleeping-iphone", token: Self.sleeping, alerts: Self.alerts)
        let alice = try await push.server.device("alice", "a1")
        let unanswered: CallID = "11111111-2222-4333-8444-555555555555"
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: unanswered, to: "bob")) }.get()
        _ = try await alice.expect(timeout: .seconds(10)) { if case .callEnded(let ended) = $0.message, ended.reason == .noAnswer { true } else { nil } }
        try await eventually { push.apns.delivered.contains { $0.pushType == "alert" } }

        // Woken, the phone answers: no alert for that call.
        let answered: CallID = "66666666-7777-4888-8999-aaaaaaaaaaaa"
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: answered, to: "bob")) }.get()
        try await eventually { push.apns.delivered.filter { $0.pushType == "voip" }.count == 2 }
        let bob = try await push.server.device("bob", "sleeping-iphone")
        _ = try await bob.request { .callAccept(CallRequest(id: $0, call: answered)) }.get()
        _ = try await alice.request { .callHangup(CallHangup(id: $0, call: answered)) }.get()
        try await Task.sleep(for: .milliseconds(300))
        #expect(push.apns.delivered.filter { $0.pushType == "alert" }.count == 1)
        try await push.stop()
    }

    @Test func aTokenIsForgottenOnlyWhenAPNsRejectsTheOneTheDeviceStillHas() async throws {
        let push = try await PushHarness.start()
        // Unknown to APNs (BadDeviceToken): forgotten.
        try await push.register("bob", "bad", token: "0123456789abcdef", known: false)
        // 410 dated before the device registered again: kept.
        try await push.register("carol", "reinstalled", token: Self.removed)
        push.apns.unregister(token: Self.removed, at: Date().addingTimeInterval(-3600))
        // Any other refusal: kept, counted as failed.
        try await push.register("dave", "iphone", token: Self.online)
        push.apns.script(.refuse(status: 400, reason: "TopicDisallowed"))

        let alice = try await push.server.device("alice", "a1")
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: CallID(uuid: UUID()), to: "dave")) }.get()
        try await eventually { push.apns.requests.count == 1 }
        for callee: UserID in ["bob", "carol"] {
            _ = try await alice.request { .callInvite(CallInvite(id: $0, call: CallID(uuid: UUID()), to: callee)) }.get()
        }
        try await eventually { push.apns.requests.count == 3 }
        // Every answer handled (bob's and carol's rejections, dave's failure): then look at the store.
        await push.expectMetric(#"parley_pushes_total{type="voip",outcome="token_invalid"} 2"#)
        await push.expectMetric(#"parley_pushes_total{type="voip",outcome="failed"} 1"#)
        #expect(try await push.token(of: "bob", "bad") == nil)
        #expect(try await push.token(of: "carol", "reinstalled") == Self.removed)
        #expect(try await push.token(of: "dave", "iphone") == Self.online)
        await push.expectMetric("parley_push_tokens_removed_total 1")
        try await push.stop()
    }

    @Test func anExpiredProviderTokenOrABusyAPNsStillGetsThePushThrough() async throws {
        let push = try await PushHarness.start()
        try await push.register("bob", "sleeping-iphone", token: Self.sleeping)
        push.apns.script(.refuse(status: 403, reason: "ExpiredProviderToken"), .refuse(status: 503, reason: "ServiceUnavailable"),
                         .refuse(status: 429, reason: "TooManyRequests"))
        let alice = try await push.server.device("alice", "a1")
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: CallID(uuid: UUID()), to: "bob")) }.get()
        try await eventually { push.apns.delivered.count == 1 }
        #expect(push.apns.requests.map(\.status) == [403, 503, 429, 200])
        let tokens = push.apns.requests.compactMap(\.providerToken)
        #expect(tokens[0] != tokens[1], "a new provider token after ExpiredProviderToken")
        #expect(Set(tokens.dropFirst()).count == 1, "and only one")
        await push.expectMetric(#"parley_pushes_total{type="voip",outcome="delivered"} 1"#)
        await push.expectMetric(#"parley_apns_responses_total{status="403"} 1"#)
        await push.expectMetric(#"parley_apns_responses_total{status="503"} 1"#)
        await push.expectMetric(#"parley_apns_responses_total{status="429"} 1"#)
        #expect(try await push.token(of: "bob", "sleeping-iphone") == Self.sleeping)
        try await push.stop()
    }

    @Test func aTokenBelongsToTheLastAccountThatRegisteredIt() async throws {
        let push = try await PushHarness.start()
        try await push.register("bob", "family-iphone", token: Self.sleeping, alerts: Self.alerts)
        // Carol signs in on the same phone: its tokens are hers now, and bob's calls must not ring it.
        try await push.register("carol", "family-iphone", token: Self.sleeping, alerts: Self.alerts)
        #expect(try await push.token(of: "bob", "family-iphone") == nil)
        #expect(try await push.server.server.store.devices(of: "bob").first?.alerts == nil)
        #expect(try await push.token(of: "carol", "family-iphone") == Self.sleeping)
        let alice = try await push.server.device("alice", "a1")
        let invited = try await alice.request { .callInvite(CallInvite(id: $0, call: CallID(uuid: UUID()), to: "bob")) }.get()
            .decodeResult(CallInviteResult.self)
        #expect(invited.pushed == 0)
        try await push.stop()
    }

    @Test func aSlowAPNsNeverHoldsUpSignalingOrOtherPushes() async throws {
        let push = try await PushHarness.start()
        try await push.register("bob", "sleeping-iphone", token: Self.sleeping)
        try await push.register("carol", "sleeping-iphone", token: Self.online)
        push.apns.script(.delay(.seconds(30)))  // bob's push hangs at APNs
        let alice = try await push.server.device("alice", "a1")
        let bobOnline = try await push.server.device("bob", "laptop")
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: CallID(uuid: UUID()), to: "bob")) }.get()
        _ = try await bobOnline.expect { if case .callIncoming = $0.message { true } else { nil } }
        try await eventually { push.apns.arrivals == 1 }
        // Carol's push goes through while bob's still waits.
        _ = try await alice.request { .callInvite(CallInvite(id: $0, call: CallID(uuid: UUID()), to: "carol")) }.get()
        try await eventually { push.apns.delivered.contains { $0.deviceToken == Self.online } }
        #expect(!push.apns.requests.contains { $0.deviceToken == Self.sleeping }, "bob's push is still held at APNs")
        try await push.stop()
    }
}
