import AVFAudio
import CallKit
import Foundation
import Logging
@testable import ParleyApple
import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import PushKit
import Synchronization
import Testing
import WebRTC

extension OneIPhone {
    /// Faults that only a device would show, each against stand-ins that behave as the frameworks do
    /// (docs/apple-stand-ins.md): PushKit delivering to a process with no phone or a second phone, CallKit
    /// counting providers, RTCAudioSession's activation count, WebRTC applying its configuration when its
    /// audio unit starts. Serialized: the audio session, like iOS's, is one per process.
    @Suite("iPhone faults a device would show", .serialized)
    struct DeviceFaultTests {
        static func payload(_ call: UUID, from user: String = "alice") -> [AnyHashable: Any] {
            ["parley": ["call": call.uuidString.lowercased(), "from": ["user": user, "name": user.capitalized],
                        "media": ["audio": true, "video": false], "expiresAt": 1_700_000_000_000]]
        }

        // MARK: PushKit and CallKit, once per app

        @Test func aPushWithNoPhoneRunningIsReportedThenEndedThenCompleted() async throws {
            let system = IPhone.launch()  // nobody signed in: the stored session was unreadable, or the user signed out
            let call = UUID()
            nonisolated(unsafe) let provider = system.callKit.provider  // read from PushKit's queue, as the system would
            let atCompletion = ReportsAtCompletion()
            system.pushes.registry.standInAtCompletion = { atCompletion.value = provider.standInReports }
            defer { system.pushes.registry.standInAtCompletion = nil }
            #expect(await system.pushes.registry.standInDeliver(Self.payload(call)) == .reportedThenCompleted)
            // Ended before the completion ran (the completion runs in the same callback, after the end).
            #expect(atCompletion.value.contains(.ended(call, .failed)), "\(atCompletion.value)")
            let reports = system.callKit.provider.standInReports
            #expect(reports.first == .incoming(call, "Alice", "alice", video: false))
            #expect(reports.contains(.ended(call, .failed)))
            #expect(!system.callKit.provider.standInCalls.contains(call), "nothing rings that no one can answer")
            // A payload that is not Parley's, too.
            #expect(await system.pushes.registry.standInDeliver(["aps": [String: String]()]) == .reportedThenCompleted)
            #expect(system.callKit.provider.standInCalls.isEmpty)
        }

        @Test func afterSignOutAndSignInTheNextPhoneGetsTheTokenAndThePushes() async throws {
            let server = try await LiveServer.start()
            let system = IPhone.launch()
            // PushKit issued the token before anyone signed in; it is not announced again.
            system.pushes.registry.standInUpdateCredentials(token: Data([0xAB, 0x01]))
            let bob = try await IPhone.start(server, user: "bob", device: "shared-iphone", system: system)
            try await eventually("bob's phone registers the token") {
                try await server.server.store.devices(of: "bob").first?.voip?.token == "ab01"
            }
            await bob.phone.signOut()

            let carol = try await IPhone.start(server, user: "carol", device: "shared-iphone", system: system)
            try await eventually("carol's phone registers the same token") {
                try await server.server.store.devices(of: "carol").first?.voip?.token == "ab01"
            }
            // A push: reported and completed, and the new phone takes the call (the server does not know
            // it, so it ends: the phone asked).
            let call = UUID()
            #expect(await system.pushes.registry.standInDeliver(Self.payload(call)) == .reportedThenCompleted)
            try await eventually("carol's phone took the call and asked the server about it") {
                await carol.phone.calls.phase(of: call)?.isEnded == true
            }
            // The new token PushKit issues goes to the phone that runs now.
            system.pushes.registry.standInUpdateCredentials(token: Data([0xCD]))
            try await eventually("carol's phone registers the new token") {
                try await server.server.store.devices(of: "carol").first?.voip?.token == "cd"
            }
            await carol.stop()
            try await server.stop()
        }

        @Test func onePhoneAfterAnotherUseTheAppsOneProvider() async throws {
            let server = try await LiveServer.start()
            let connected = CXProvider.connected.withLock { $0 }
            let system = IPhone.launch()
            let bob = try await IPhone.start(server, user: "bob", device: "shared-iphone", system: system)
            await bob.phone.signOut()
            let carol = try await IPhone.start(server, user: "carol", device: "shared-iphone", system: system)
            #expect(CXProvider.connected.withLock { $0 } == connected + 1, "one CXProvider per app")

            // The provider's actions reach the phone that runs now: carol calls through CallKit.
            let alice = OtherParty(server, user: "alice")
            try await alice.start()
            let call = try await carol.phone.call("alice")
            try await eventually("alice's phone rings") {
                alice.provider.records.contains { if case .incoming(let report) = $0 { report.call == call } else { false } }
            }
            try await carol.phone.hangUp(call)
            try await eventually("alice's call ends") { alice.provider.endReason(of: call) != nil }
            await alice.stop()
            await carol.stop()
            try await server.stop()
        }

        @Test func aCallReportedByItsPushIsNotDeclinedWhenSignalingBringsItToo() async throws {
            let server = try await LiveServer.start()
            let bob = try await IPhone.start(server, user: "bob", device: "bob-iphone")
            let alice = OtherParty(server, user: "alice")
            try await alice.start()
            // The push comes first, then the invite over signaling, for the same call.
            let call = UUID()
            #expect(await bob.pushes.registry.standInDeliver(Self.payload(call)) == .reportedThenCompleted)
            alice.provider.perform { .start($0, call: call, to: "bob", video: false) }
            try await eventually("alice hears bob's phone ring") { await alice.manager.phase(of: call) == .ringing }
            try await Task.sleep(for: .milliseconds(300))  // checks that nothing happens: no decline follows
            #expect(alice.provider.endReason(of: call) == nil, "the call still rings")
            #expect(bob.incoming == [call], "reported once")
            await alice.stop()
            await bob.stop()
            try await server.stop()
        }

        // MARK: The audio session, as WebRTC's RTCAudioSession.mm keeps it

        static func audio() -> AppleAudioSession {
            AVAudioSession.sharedInstance().standInReset()
            RTCAudioSession.sharedInstance().standInReset()
            var logger = Logger(label: "test.audio")
            logger.logLevel = .critical
            return AppleAudioSession(logger: logger)
        }

        @Test(arguments: [false, true])
        func leavingAVoiceRoomGivesTheSessionBackToOtherApps(audioOffFirst: Bool) async throws {
            let audio = Self.audio()
            let rtc = RTCAudioSession.sharedInstance(), session = AVAudioSession.sharedInstance()
            await audio.activateForRoom()
            rtc.standInAudioDeviceStarts()  // the room's media is negotiated: WebRTC's audio unit starts
            #expect(session.standInIsActive && rtc.standInAudioUnitRunning)
            // Leaving closes the room's peer connection and turns audio off, in either order.
            if audioOffFirst {
                await audio.deactivateAfterRoom()
                rtc.standInAudioDeviceStops()
            } else {
                rtc.standInAudioDeviceStops()
                await audio.deactivateAfterRoom()
            }
            #expect(!session.standInIsActive, "the session is released")
            #expect(session.standInRecords.suffix(2) == [.active(false), .notifiedOthers], "other apps' audio may resume")
            #expect(rtc.standInActivationCount == 0)
        }

        @Test func webRTCStartingItsAudioKeepsTheCallsConfiguration() async throws {
            let audio = Self.audio()
            let rtc = RTCAudioSession.sharedInstance(), session = AVAudioSession.sharedInstance()
            // A video call, answered: configured in the action, activated by CallKit, audio on.
            await audio.configure(CallAudioConfiguration(video: true))
            session.standInSystemSetActive(true)
            await audio.setAudioEnabled(true)
            rtc.standInAudioDeviceStarts()
            #expect(session.mode == .videoChat)
            #expect(session.categoryOptions == [.allowBluetoothHFP, .allowBluetoothA2DP], "headphones' A2DP stays allowed")

            // An audio call with the speaker on before WebRTC's audio starts: it stays on the speaker.
            let voice = Self.audio()
            await voice.configure(CallAudioConfiguration(video: false))
            session.standInSystemSetActive(true)
            await voice.setAudioEnabled(true)
            await voice.overrideOutputToSpeaker(true)
            rtc.standInAudioDeviceStarts()
            #expect(session.mode == .voiceChat)
            #expect(session.standInOutputOverride == .speaker)
            #expect(!session.standInRecords.contains(.active(true)), "activated by CallKit only")
        }
    }
}

extension OneIPhone.DeviceFaultTests {
    /// `RTCPeerConnectionFactory()` has H.264 only (RTCPeerConnectionFactory.mm): a video call with
    /// Parley's Linux engine, which sends VP8, would have no codec in common.
    @Test func thePhonesWebRTCHasTheCodecsTheLinuxEngineSends() {
        #expect(RTCPeerConnectionFactory().standInVideoCodecs == ["H264"])
        #expect(WebRTCPeerConnectionFactory().factory.standInVideoCodecs.contains("VP8"))
    }
}

/// What the CallKit stand-in had been told when a push's completion ran.
private final class ReportsAtCompletion: Sendable {
    private let reports = Mutex<[CXProvider.StandInReport]>([])
    var value: [CXProvider.StandInReport] {
        get { reports.withLock { $0 } }
        set { reports.withLock { $0 = newValue } }
    }
}
