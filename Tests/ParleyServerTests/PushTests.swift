import Foundation
import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

/// Stands in for APNs, which cannot run here, and refuses what APNs would refuse.
final class FakeAPNs: VoIPPushSender, @unchecked Sendable {
    private let lock = NSLock()
    private var received: [VoIPPush] = []
    /// Tokens APNs no longer knows (it answers 410 Unregistered).
    let unregistered: Set<String>

    init(unregistered: Set<String> = []) { self.unregistered = unregistered }

    var pushes: [VoIPPush] { lock.withLock { received } }

    func send(_ push: VoIPPush) async -> VoIPPushOutcome {
        // What APNs checks of a VoIP push: the headers, the token, and the payload size (5 KB for VoIP).
        guard push.pushType == "voip", push.topic.hasSuffix(".voip"), push.priority == 10 else { return .failed("BadTopic") }
        guard push.registration.token.allSatisfy(\.isHexDigit) else { return .tokenInvalid }
        guard let body = try? JSONEncoder().encode(push.payload), body.count <= 5120 else { return .failed("PayloadTooLarge") }
        if unregistered.contains(push.registration.token) { return .tokenInvalid }
        lock.withLock { received.append(push) }
        return .delivered
    }
}

@Suite("VoIP push")
struct PushTests {
    @Test func anInviteWakesOnlyDevicesWithATokenAndNoLiveConnection() async throws {
        let apns = FakeAPNs(unregistered: ["dead00"])
        let server = try await LiveServer.start(pushSender: apns)
        let bob = try await server.token("bob")
        for (device, token) in [("sleeping-iphone", "ab12"), ("old-iphone", "dead00"), ("online-iphone", "cd34")] {
            let body = #"{"platform":"ios","voip":{"token":"\#(token)","topic":"net.parley.app","environment":"production"}}"#
            #expect(try await server.http("PUT", "/v1/devices/\(device)", token: bob, json: body).status == 200)
        }
        let online = try await server.device("bob", "online-iphone")
        let alice = try await server.device("alice", "a1", name: "Alice")
        let call: CallID = "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21"
        let ack = try await alice.request { .callInvite(CallInvite(id: $0, call: call, to: "bob")) }.get()
        #expect(ack.result["devices"] == .number(1))
        #expect(ack.result["pushed"] == .number(2))
        _ = try await online.expect { if case .callIncoming = $0.message { true } else { nil } }

        try await eventually { apns.pushes.count == 1 }
        let push = try #require(apns.pushes.first)
        #expect(push.device == "sleeping-iphone")
        #expect(push.topic == "net.parley.app.voip")
        #expect(push.payload.parley.call == call)
        #expect(push.payload.parley.from.user == "alice")
        #expect(push.payload.parley.from.name == "Alice")
        #expect(push.expiration == push.payload.parley.expiresAt / 1000)
        let wire = String(decoding: try JSONEncoder().encode(push.payload), as: UTF8.self)
        #expect(!wire.contains("device"), "the push body's from carries no device")

        try await eventually { try server.server.store.devices(of: "bob").first { $0.device == "old-iphone" }?.voip == nil }

        // Cancelling never sends a push; the woken device learns the call's fate over signaling.
        _ = try await alice.request { .callHangup(CallHangup(id: $0, call: call)) }
        let woken = try await server.device("bob", "sleeping-iphone")
        let state = try await woken.request { .callState(CallRequest(id: $0, call: call)) }.get().decodeResult(CallStateResult.self)
        #expect(state.state == .ended)
        #expect(state.reason == .cancelled)
        #expect(apns.pushes.count == 1)
        try await server.stop()
    }
}
