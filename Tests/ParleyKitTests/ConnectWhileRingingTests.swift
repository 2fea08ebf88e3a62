import Foundation
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

/// Connecting while ringing, two SDK clients through the real server, with fake media that holds
/// what a held engine holds (`FakePeerConnection.holdsMedia`, `sendingAudio`, `microphoneOpened`).
@Suite("Connecting while ringing")
struct ConnectWhileRingingTests {
    /// alice calls bob, whose phone and laptop ring.
    static func ringTwoDevices(_ server: LiveServer, video: Bool = false) async throws -> (SDKDevice, SDKDevice, SDKDevice, UUID) {
        let alice = SDKDevice(server, user: "alice", device: "a1")
        let phone = SDKDevice(server, user: "bob", device: "phone")
        let laptop = SDKDevice(server, user: "bob", device: "laptop")
        for device in [alice, phone, laptop] { try await device.start() }
        let (call, _) = alice.call("bob", video: video)
        try await eventually("both ring") { phone.incomingCall() == call && laptop.incomingCall() == call }
        return (alice, phone, laptop, call)
    }

    /// `callee` answers `call` from `caller`, and both connect.
    static func answer(_ call: UUID, on callee: SDKDevice, from caller: SDKDevice) async throws {
        let answer = callee.provider.perform { .answer($0, call: call) }
        try await eventually("answered") { callee.provider.outcome(of: answer) == true }
        try await eventually("both connect") {
            let phases = (await caller.phase(call), await callee.phase(call))
            return phases.0 == .connected && phases.1 == .connected
        }
    }

    static func stop(_ server: LiveServer, _ devices: SDKDevice...) async throws {
        for device in devices { await device.stop() }
        try await server.stop()
    }

    /// While it rings the caller has a path to each ringing device, connected and silent; the device
    /// that answers is connected the moment its answer is taken, and only its path sends; the other
    /// device's path closes on both sides without having opened its microphone.
    @Test func theAnsweringDevicesPathIsConnectedAtOnceAndNothingWasSentBefore() async throws {
        let server = try await LiveServer.start()
        let (alice, phone, laptop, call) = try await Self.ringTwoDevices(server)
        try await eventually("alice connects to both devices while they ring") {
            alice.peers.connections.count == 2 && alice.peers.connections.allSatisfy { $0.currentIceState == .connected }
        }
        try await eventually("each device's connection too") {
            [phone, laptop].allSatisfy { $0.peers.connections.count == 1 && $0.peers.connections[0].currentIceState == .connected }
        }
        let everyPeer = alice.peers.connections + phone.peers.connections + laptop.peers.connections
        #expect(everyPeer.allSatisfy { $0.holdsMedia && !$0.sendingAudio && !$0.microphoneOpened }, "nothing sent or captured while ringing")
        #expect(alice.peers.configurations.allSatisfy { $0.holdsMedia })
        #expect(await alice.phase(call) == .ringing && phone.audio.records.isEmpty, "no audio configured before the answer")

        let answer = laptop.provider.perform { .answer($0, call: call) }
        try await eventually("the laptop's answer is fulfilled") { laptop.provider.outcome(of: answer) == true }
        #expect(await laptop.phase(call) == .connected, "connected at once: its path was ready")
        try await eventually("alice is connected") { await alice.phase(call) == .connected }
        #expect(alice.provider.records.contains(.connected(call)))

        let alicePaths = alice.peers.connections
        #expect(alicePaths.count == 2, "no new connection after the answer")
        #expect(alicePaths.filter(\.closed).count == 1, "alice closed the path to the phone")
        let kept = try #require(alicePaths.first { !$0.closed })
        #expect(laptop.peers.connections[0].sendingAudio && kept.sendingAudio, "media starts on the answering path")
        try await eventually("the phone stops ringing and closes its path") {
            phone.provider.endReason(of: call) == .answeredElsewhere && phone.peers.connections[0].closed
        }
        #expect(!phone.peers.connections[0].microphoneOpened, "the device that did not answer never sent")
        try await Self.stop(server, alice, phone, laptop)
    }

    /// Declined, cancelled, unanswered: every path made while ringing closes on both sides, and
    /// none ever sent.
    @Test(arguments: ["declined", "cancelled", "no-answer"])
    func aCallThatEndsWhileRingingClosesEveryPath(how: String) async throws {
        let server = try await LiveServer.start { $0.ringTimeout = .seconds(2) }
        let (alice, phone, laptop, call) = try await Self.ringTwoDevices(server)
        try await eventually("alice connects to both devices") {
            alice.peers.connections.count == 2 && alice.peers.connections.allSatisfy { $0.currentIceState == .connected }
        }
        switch how {
        case "declined": _ = phone.provider.perform { .end($0, call: call) }
        case "cancelled": _ = alice.provider.perform { .end($0, call: call) }
        default: break  // the server's ring timeout
        }
        let everyPeer = alice.peers.connections + phone.peers.connections + laptop.peers.connections
        try await eventually(timeout: .seconds(10), "every path closes (\(how))") { everyPeer.allSatisfy(\.closed) }
        #expect(everyPeer.allSatisfy { !$0.microphoneOpened }, "nothing was ever sent")
        #expect(await alice.phase(call)?.isEnded == true)
        try await Self.stop(server, alice, phone, laptop)
    }

    /// A callee that does not connect while ringing (an older client, or one configured not to):
    /// the caller connects after the answer, as before.
    @Test func aCalleeThatDoesNotRingEarlyIsCalledAsBefore() async throws {
        let server = try await LiveServer.start()
        let alice = SDKDevice(server, user: "alice", device: "a1")
        let bob = SDKDevice(server, user: "bob", device: "b1") { $0.connectWhileRinging = false }
        try await alice.start()
        try await bob.start()
        let (call, _) = alice.call("bob")
        try await eventually("bob's phone rings") { bob.incomingCall() == call }
        try await Task.sleep(for: .milliseconds(200))
        #expect(alice.peers.connections.isEmpty && bob.peers.connections.isEmpty)
        try await Self.answer(call, on: bob, from: alice)
        #expect(alice.peers.configurations.map(\.holdsMedia) == [false] && bob.peers.configurations.map(\.holdsMedia) == [false])
        try await Self.stop(server, alice, bob)
    }

    /// A video call connects after the answer (the camera would have to start early).
    @Test func aVideoCallConnectsAfterTheAnswer() async throws {
        let server = try await LiveServer.start()
        let (alice, phone, laptop, call) = try await Self.ringTwoDevices(server, video: true)
        try await Task.sleep(for: .milliseconds(200))  // checks that nothing happens while it rings
        #expect(alice.peers.connections.isEmpty && phone.peers.connections.isEmpty && laptop.peers.connections.isEmpty)
        // The laptop answers: then, and only then, one connection each, holding nothing back.
        try await Self.answer(call, on: laptop, from: alice)
        #expect(alice.peers.configurations.map(\.holdsMedia) == [false] && laptop.peers.configurations.map(\.holdsMedia) == [false])
        #expect(phone.peers.connections.isEmpty, "the device that did not answer never connected")
        try await Self.stop(server, alice, phone, laptop)
    }

    /// With `relayOnlyWhileRinging`, the callee's connection made while ringing gathers relay
    /// candidates only: the caller learns none of its addresses.
    @Test func aCalleeMayKeepItsAddressesFromTheCallerWhileRinging() async throws {
        let server = try await LiveServer.start()
        let alice = SDKDevice(server, user: "alice", device: "a1")
        let bob = SDKDevice(server, user: "bob", device: "b1") { $0.relayOnlyWhileRinging = true }
        try await alice.start()
        try await bob.start()
        let (call, _) = alice.call("bob")
        try await eventually("bob's connection is made while ringing") { bob.peers.configurations.count == 1 }
        #expect(bob.peers.configurations[0].relayOnly && bob.peers.configurations[0].holdsMedia)
        // Bob's connection is made at `call.incoming`, before his `call.ringing` reaches alice.
        try await eventually("alice hears it ring") { await alice.phase(call) == .ringing }
        try await Self.stop(server, alice, bob)
    }
}
