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
}
