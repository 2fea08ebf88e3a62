import Foundation
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

@Suite("Mute and hold")
struct MicrophoneTests {
    @Test func theMicrophoneSendsOnlyWhenNeitherMutedNorHeld() {
        var microphone = MicrophoneSwitches()
        #expect(microphone.sends)
        microphone.muted = true
        microphone.held = true
        microphone.held = false
        #expect(!microphone.sends, "resuming leaves the user's mute alone")
        microphone.muted = false
        #expect(microphone.sends)
    }

    @Test func resumingAMutedCallKeepsTheMicrophoneMuted() async throws {
        let server = try await LiveServer.start()
        let (alice, bob, call) = try await CallFlowTests.connectedCall(server)
        let bobPeer = try #require(bob.peers.connections.first)
        let steps: [(String, (ProviderActionID) -> ProviderAction, sends: Bool)] = [
            ("mute", { .setMuted($0, call: call, muted: true) }, false),
            ("hold", { .setHeld($0, call: call, held: true) }, false),
            ("resume", { .setHeld($0, call: call, held: false) }, false),
            ("unmute", { .setMuted($0, call: call, muted: false) }, true),
        ]
        for (name, make, sends) in steps {
            let action = bob.provider.perform(make)
            try await eventually("\(name) fulfilled") { bob.provider.outcome(of: action) == true }
            #expect(bobPeer.sendingAudio == sends, "after \(name)")
        }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func aMuteBeforeThePeerConnectionReachesItWhenItIsReady() {
        var (call, _) = CallStateMachine.incoming("6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21", from: "alice", name: nil, media: .audioOnly, alreadyReported: false)
        #expect(call.setMuted(true, action: ProviderActionID()).contains(.setPeerMuted(true)))
        #expect(call.answer(ProviderActionID()).contains(.makePeerConnection(polite: true)))
        #expect(call.peerConnectionReady() == [.setPeerMuted(true)])
    }

    /// Classic: the caller's peer connection is made after the answer. Connecting while ringing: it
    /// is the early path, made while ringing, which takes the mute when it becomes the call's.
    @Test(arguments: [false, true])
    func aMuteWhileRingingReachesThePeerConnectionMadeLater(connectWhileRinging: Bool) async throws {
        let server = try await LiveServer.start()
        let alice = SDKDevice(server, user: "alice", device: "a1") { $0.connectWhileRinging = connectWhileRinging }
        let bob = SDKDevice(server, user: "bob", device: "b1") { $0.connectWhileRinging = connectWhileRinging }
        try await alice.start()
        try await bob.start()
        let (call, _) = alice.call("bob")
        try await eventually("bob's phone rings") { bob.incomingCall() == call }
        if connectWhileRinging {
            try await eventually("alice connects to bob's phone while it rings") { alice.peers.connections.first?.currentIceState == .connected }
        }
        let mute = alice.provider.perform { .setMuted($0, call: call, muted: true) }
        try await eventually("mute fulfilled") { alice.provider.outcome(of: mute) == true }
        #expect(alice.peers.connections.count == (connectWhileRinging ? 1 : 0), "muted before the call has its peer connection")
        #expect(alice.peers.connections.first.map { !$0.sendingAudio && !$0.muted } ?? true, "held, not muted yet")
        _ = bob.provider.perform { .answer($0, call: call) }
        try await eventually("alice connects") { await alice.phase(call) == .connected }
        let alicePeer = try #require(alice.peers.connections.first)
        #expect(!alicePeer.sendingAudio, "the microphone stays muted")
        if connectWhileRinging {
            #expect(alicePeer.sendingHistory == [false], "not one moment of the microphone went out")
        }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }
}
