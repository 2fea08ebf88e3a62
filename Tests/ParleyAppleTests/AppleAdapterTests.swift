import AVFAudio
import CallKit
import Foundation
@testable import ParleyApple
import ParleyKit
import ParleyLocalServices
import ParleyProtocol
import ParleyServerTesting
import PushKit
import Testing
import WebRTC

extension OneIPhone {
    /// The iPhone adapters against the stand-ins, with the SDK core and a real server behind them.
    /// Serialized: the audio session, like iOS's, is one per process.
    @Suite("iPhone adapters", .serialized)
    struct AppleAdapterTests {
        /// A server, bob's iPhone and alice calling him: returns once CallKit shows the call.
        static func aliceCallsBob(holdPeers: Bool = false) async throws -> (LiveServer, IPhone, OtherParty, UUID) {
            let server = try await LiveServer.start()
            let bob = try await IPhone.start(server, user: "bob", device: "bob-iphone", holdPeers: holdPeers)
            let alice = OtherParty(server, user: "alice")
            try await alice.start()
            let call = alice.call("bob")
            try await eventually("CallKit shows the call") { bob.incoming == [call] }
            return (server, bob, alice, call)
        }

        static func finish(_ server: LiveServer, _ bob: IPhone, _ alice: OtherParty) async throws {
            await alice.stop()
            await bob.stop()
            try await server.stop()
        }

        @Test func anIncomingCallIsAnsweredThroughCallKitAndAudioStartsOnlyOnEachActivation() async throws {
            let (server, bob, alice, call) = try await Self.aliceCallsBob()

            // The user answers on the lock screen: the action stays open until the core can start media.
            let answer = CXAnswerCallAction(call: call)
            #expect(bob.system.standInPerform(answer) == nil)
            try await eventually("the core fulfils the answer") { answer.standInOutcome == .fulfilled }
            // The session was configured in the action, for a voice call with Bluetooth, and never activated by the app.
            let session = AVAudioSession.sharedInstance().standInRecords
            #expect(session.contains(.category(.playAndRecord, .voiceChat, [.allowBluetoothHFP, .allowBluetoothA2DP])))
            #expect(!session.contains(.active(true)), "never setActive(true) during a CallKit call")
            #expect(RTCAudioSession.sharedInstance().useManualAudio)
            #expect(!RTCAudioSession.sharedInstance().isAudioEnabled, "no audio before didActivate")
            // The call's audio is negotiated: WebRTC's audio device starts its unit once audio is
            // enabled, and activates the session itself unless it was told CallKit did.
            RTCAudioSession.sharedInstance().standInAudioDeviceStarts()

            // Audio starts on didActivate, stops on didDeactivate, and starts again on the next one (after a hold).
            bob.system.standInActivateAudioSession()
            try await eventually("audio on") { RTCAudioSession.sharedInstance().isAudioEnabled }
            bob.system.standInDeactivateAudioSession()
            try await eventually("audio off") { !RTCAudioSession.sharedInstance().isAudioEnabled }
            bob.system.standInActivateAudioSession()
            try await eventually("audio on again") { RTCAudioSession.sharedInstance().isAudioEnabled }
            #expect(RTCAudioSession.sharedInstance().standInAudioUnitRunning)
            #expect(!AVAudioSession.sharedInstance().standInRecords.contains(.active(true)),
                    "the session was activated by CallKit only, never by the app or WebRTC")
            let records = RTCAudioSession.sharedInstance().standInRecords
            #expect(records.filter { $0 == .didActivate }.count == 2)
            #expect(records.firstIndex(of: .audioEnabled(true))! > records.firstIndex(of: .didActivate)!)

            // Mute from the system UI reaches the peer connection; the other side hears of it.
            let mute = CXSetMutedCallAction(call: call, muted: true)
            bob.system.standInPerform(mute)
            try await eventually("mute fulfilled") { mute.standInOutcome == .fulfilled }
            #expect(bob.peers.connections.first?.muted == true)

            // The system resets: every call ends, and the other party is told.
            bob.system.standInReset()
            try await eventually("alice's call ends") { alice.provider.endReason(of: call) != nil }
            try await Self.finish(server, bob, alice)
        }

        @Test func anAnswerForACallThatCannotBeJoinedFails() async throws {
            // Media is slow to come up, so the answer is still open when the caller gives up.
            let (server, bob, alice, call) = try await Self.aliceCallsBob(holdPeers: true)
            let answer = CXAnswerCallAction(call: call)
            bob.system.standInPerform(answer)
            try await Task.sleep(for: .milliseconds(200))
            #expect(answer.standInOutcome == nil, "held open until media can start")
            let end = alice.provider.perform { .end($0, call: call) }
            try await eventually("alice hung up") { alice.provider.outcome(of: end) == true }
            try await eventually("the answer fails") { answer.standInOutcome == .failed }
            bob.peers.releaseCreation()
            try await Self.finish(server, bob, alice)
        }

        @Test func aVoIPPushIsReportedBeforeItsCompletionEvenWhenItIsMalformedOrLate() async throws {
            let server = try await LiveServer.start()
            let bob = try await IPhone.start(server, user: "bob", device: "bob-iphone")
            // PushKit hands over the token: the core registers it, in hex, for the sandbox.
            bob.pushes.registry.standInUpdateCredentials(token: Data([0xAB, 0x01, 0xFF, 0x10]))
            try await eventually("the token is registered") {
                try await server.server.store.devices(of: "bob").first { $0.device == "bob-iphone" }?.voip
                    == VoIPRegistration(token: "ab01ff10", topic: "net.parley.app", environment: .sandbox)
            }

            // A push for a call that is ringing: reported, then completed; the call goes on.
            let alice = OtherParty(server, user: "alice")
            try await alice.start()
            let call = alice.call("bob")
            try await eventually("the signaling copy arrived") { bob.incoming == [call] }
            // Its push, late: reported again under the call's UUID, which CallKit refuses (it has the
            // call) and PushKit counts as reported all the same; the call rings on, once.
            let itsPush: [AnyHashable: Any] = ["parley": ["call": call.uuidString.lowercased(), "from": ["user": "alice", "name": "Alice"],
                                                          "media": ["audio": true, "video": false], "expiresAt": 1_700_000_000_000]]
            #expect(await bob.pushes.registry.standInDeliver(itsPush) == .reportedThenCompleted)
            #expect(bob.incoming == [call] && bob.ended(call) == nil)
            let late = UUID()
            let payload: [AnyHashable: Any] = ["parley": ["call": late.uuidString.lowercased(), "from": ["user": "alice", "name": "Alice"],
                                                          "media": ["audio": true, "video": false], "expiresAt": 1_700_000_000_000]]
            #expect(await bob.pushes.registry.standInDeliver(payload) == .reportedThenCompleted)
            // It names a call the server does not know: reported, then ended at once.
            try await eventually("the unknown call ends") { bob.ended(late) != nil }
            // A payload that is not Parley's: still reported first, then ended (iOS would end the app otherwise).
            #expect(await bob.pushes.registry.standInDeliver(["aps": [String: String]()]) == .reportedThenCompleted)
            #expect(bob.incoming.count == 3)
            // Signing out: the server forgets the phone's tokens, so the next user's calls do not reach this account.
            await bob.phone.signOut()
            #expect(try await server.server.store.devices(of: "bob").first { $0.device == "bob-iphone" }?.voip == nil)
            try await Self.finish(server, bob, alice)
        }

        @Test func routeChangesAndInterruptionsReachThePolicyAndComeBackAsRoutes() async throws {
            let (server, bob, alice, call) = try await Self.aliceCallsBob()
            let answer = CXAnswerCallAction(call: call)
            bob.system.standInPerform(answer)
            try await eventually("answered") { answer.standInOutcome == .fulfilled }
            bob.system.standInActivateAudioSession()
            try await eventually("audio on") { RTCAudioSession.sharedInstance().isAudioEnabled }

            // AirPods connect: the policy routes to them, through their microphone.
            let mic = AVAudioSessionPortDescription(standInPortType: .builtInMic, name: "iPhone Microphone")
            let airpodsIn = AVAudioSessionPortDescription(standInPortType: .bluetoothHFP, name: "AirPods")
            let airpodsOut = AVAudioSessionPortDescription(standInPortType: .bluetoothHFP, name: "AirPods", uid: "airpods-out")
            AVAudioSession.sharedInstance().standInChangeRoute(
                to: AVAudioSessionRouteDescription(standInInputs: [airpodsIn], outputs: [airpodsOut]), inputs: [mic, airpodsIn],
                reason: .newDeviceAvailable)
            try await eventually("routed to the AirPods") {
                AVAudioSession.sharedInstance().standInRecords.contains(.preferredInput(airpodsIn.uid))
            }

            // Siri interrupts: media pauses; the interruption ends with "should resume": it resumes.
            AVAudioSession.sharedInstance().standInInterrupt(.began)
            try await eventually("paused") { !RTCAudioSession.sharedInstance().isAudioEnabled }
            AVAudioSession.sharedInstance().standInInterrupt(.ended, options: .shouldResume)
            try await eventually("resumed") { RTCAudioSession.sharedInstance().isAudioEnabled }

            // The speaker button is an override, not a category option.
            await bob.phone.setSpeaker(true)
            try await eventually("speaker") { AVAudioSession.sharedInstance().standInRecords.contains(.override(.speaker)) }
            #expect(!AVAudioSession.sharedInstance().categoryOptions.contains(.defaultToSpeaker))
            try await Self.finish(server, bob, alice)
        }

        @Test func routeAndInterruptionNotificationsMapToTheCoresEvents() {
            let receiver = AVAudioSessionPortDescription(standInPortType: .builtInReceiver, name: "Receiver")
            let headphones = AVAudioSessionPortDescription(standInPortType: .headphones, name: "Headphones")
            let car = AVAudioSessionPortDescription(standInPortType: .carAudio, name: "Car")
            let before = AVAudioSessionRouteDescription(standInInputs: [], outputs: [receiver])
            let plugged = AVAudioSessionRouteDescription(standInInputs: [], outputs: [headphones])
            #expect(AppleAudioSession.routeEvent(reason: .newDeviceAvailable, current: plugged, previous: before) == .newDeviceAvailable(.wiredHeadset))
            #expect(AppleAudioSession.routeEvent(reason: .oldDeviceUnavailable, current: before, previous: plugged) == .oldDeviceUnavailable(.wiredHeadset))
            #expect(AppleAudioSession.routeEvent(reason: .categoryChange, current: before, previous: before) == .categoryChange)
            #expect(AppleAudioSession.routeEvent(reason: .override, current: before, previous: before) == nil)
            #expect(AppleAudioSession.output(for: car) == .carAudio)
            #expect(AppleAudioSession.interruption([AVAudioSessionInterruptionTypeKey: NSNumber(value: 1)]) == .beganBySystem)
            #expect(AppleAudioSession.interruption([AVAudioSessionInterruptionTypeKey: NSNumber(value: 0),
                                                    AVAudioSessionInterruptionOptionKey: NSNumber(value: 1)]) == .ended(shouldResume: true))
            #expect(AppleAudioSession.interruption([AVAudioSessionInterruptionTypeKey: NSNumber(value: 0)]) == .ended(shouldResume: false))
            #expect(AppleAudioSession.interruption([:]) == nil)
        }

        @Test func aStartFromTheAppGoesThroughCallKitAndAMistakenHandleIsRefused() async throws {
            let server = try await LiveServer.start()
            let bob = try await IPhone.start(server, user: "bob", device: "bob-iphone")
            let alice = OtherParty(server, user: "alice")
            try await alice.start()
            let call = try await bob.phone.call("alice")
            try await eventually("alice's phone rings") {
                alice.provider.records.contains { if case .incoming(let report) = $0 { report.call == call } else { false } }
            }
            try await eventually("CallKit hears the call is connecting") { bob.system.standInReports.contains(.outgoingStartedConnecting(call)) }
            try await bob.phone.hangUp(call)
            try await eventually("alice's call ends") { alice.provider.endReason(of: call) != nil }
            // A handle that is not a user id fails its start action at once.
            let bad = CXStartCallAction(call: UUID(), handle: CXHandle(type: .generic, value: "not a user"))
            bob.system.standInPerform(bad)
            try await eventually("refused") { bad.standInOutcome == .failed }
            try await Self.finish(server, bob, alice)
        }
    }
}
