import Foundation
import ParleyAPNsTesting
import ParleyGStreamer
import ParleyKit
import ParleyLocalServices
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import ParleySoftphone
import Testing

/// The push path end to end: a device with no connection is woken through APNs (the double),
/// goes through the SDK's push path, and the call connects with audio both ways.
@Suite("Woken by push", .serialized, .timeLimit(.minutes(5)))
struct PushWakeTests {
    static let topic = "net.parley.app"

    /// A server pushing through the double; bob's phone registered its VoIP token, then slept.
    struct Setup {
        let team: APNsTestTeam
        let apns: APNsDouble
        let server: LiveServer
        let directory: URL

        static func start() async throws -> Setup {
            let team = try APNsTestTeam()
            let apns = try await team.makeDouble()
            let server = try await LiveServer.start { configuration in
                configuration.apns = APNsSettings(keyFile: team.keyFile, keyID: team.keyID, teamID: team.teamID,
                                                  url: apns.url, caFile: apns.caFile)
            }
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-push-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let token = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
            let alerts = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
            apns.addDevice(token: token, topic: topic)
            apns.addDevice(token: alerts, topic: topic, pushType: "alert")
            // Signed in once: the phone registers PushKit's token, then the app is suspended (no connection).
            let phone = try bobsPhone(server, directory)
            try await phone.registerForVoIPPushes(VoIPRegistration(token: token, topic: topic, environment: .sandbox),
                                                  alerts: VoIPRegistration(token: alerts, topic: topic, environment: .sandbox))
            await phone.stop()
            return Setup(team: team, apns: apns, server: server, directory: directory)
        }

        /// What iOS would launch when the push arrives: a fresh app process, same device.
        static func bobsPhone(_ server: LiveServer, _ directory: URL) throws -> Softphone {
            var media = MediaEngineConfiguration()
            media.input = .tone(hertz: 660)
            media.output = .file(directory.appendingPathComponent("bob.wav"))
            media.localAddresses = ["127.0.0.1"]
            var options = SoftphoneOptions(server: URL(string: server.baseURL)!, user: "bob", device: "bob-iphone", media: media)
            options.statsInterval = .milliseconds(500)
            return try Softphone(options: options, logger: testLogger)
        }

        /// The first VoIP push the double delivered, as the device receives it.
        func nextVoIPPush() async throws -> APNsDouble.Request {
            try await eventually("a VoIP push reached APNs") { apns.delivered.contains { $0.pushType == "voip" } }
            return try #require(apns.delivered.first { $0.pushType == "voip" })
        }

        func stop() async throws {
            try await server.stop()
            await apns.stop()
            team.removeKeyFile()
            try? FileManager.default.removeItem(at: directory)
        }
    }

    /// `parley listen` as the phone: it registers its VoIP token and goes offline; a call pushes to it
    /// through the double; started with the pushed payload, as PushKit would start the app, it
    /// reports the call, connects, answers, and both sides hear each other in every half second.
    @Test func aSleepingParleyListenWokenByPushAnswersAndBothSidesHear() async throws {
        let setup = try await Setup.start()
        let server = setup.server.baseURL
        let token = String(repeating: "5a", count: 32)
        setup.apns.addDevice(token: token, topic: Self.topic)
        let registered = try await SoftphoneCommandTests.run(["listen", "--server", server, "--as", "carol", "--device", "carol-iphone",
                                                              "--register-voip", token, "--voip-environment", "production"])
        #expect(registered.status == 0, "\(registered.output)\(registered.errors)")
        #expect(registered.output.contains("registered device carol-iphone of carol for VoIP pushes"))

        let alice = try makePhone(setup.server, "alice", tone: 440, record: setup.directory.appendingPathComponent("alice.wav"))
        try await alice.start()
        let call = await alice.call("carol")
        try await eventually("a VoIP push to carol's phone") { setup.apns.delivered.contains { $0.deviceToken == token } }
        let push = try #require(setup.apns.delivered.first { $0.deviceToken == token })
        #expect(push.pushType == "voip")
        #expect(push.topic == "net.parley.app.voip")
        #expect(await alice.timeline(of: call)?.pushed == 1)
        let payload = setup.directory.appendingPathComponent("push.json")
        try push.body.write(to: payload)

        let recording = setup.directory.appendingPathComponent("carol.wav")
        let woken = try await SoftphoneCommandTests.run(["listen", "--server", server, "--as", "carol", "--device", "carol-iphone",
                                                         "--woken-by", payload.path, "--answer", "auto", "--once",
                                                         "--play", "tone:660", "--record", recording.path, "--duration", "3"])
        #expect(woken.status == 0, "\(woken.output)\(woken.errors)")
        #expect(woken.output.contains("woken by a VoIP push"))
        #expect(woken.output.contains("incoming call from alice"))
        try await eventually("alice's call ended") { await alice.timeline(of: call)?.isEnded == true }
        #expect(await alice.timeline(of: call)?.firstAudio != nil)
        await alice.stop()
        // Each heard the other's tone in every half second after the first, for about the three
        // seconds of the call (a recording holds only what was decoded).
        let carolsSeconds = try Recording(recording).audio.duration
        let alicesSeconds = try Recording(setup.directory.appendingPathComponent("alice.wav")).audio.duration
        #expect(carolsSeconds > 2.5 && alicesSeconds > 2.5, "carol heard \(carolsSeconds) s, alice \(alicesSeconds) s")
        let heardByCarol = try Recording(recording).toneInEveryWindow(440, from: 0.5)
        let heardByAlice = try Recording(setup.directory.appendingPathComponent("alice.wav")).toneInEveryWindow(660, from: 0.5, to: 2.5)
        #expect(heardByCarol.passed, "\(heardByCarol)")
        #expect(heardByAlice.passed, "\(heardByAlice)")
        #expect(!setup.apns.delivered.contains { $0.pushType == "alert" }, "an answered call leaves no missed-call alert")
        try await setup.stop()
    }

    @Test func aCallCancelledBeforeTheWokenPhoneConnectsIsReportedThenEndedAtOnce() async throws {
        let setup = try await Setup.start()
        let alice = try makePhone(setup.server, "alice", tone: 440, record: nil)
        try await alice.start()
        let call = await alice.call("bob")
        let push = try await setup.nextVoIPPush()
        await alice.hangUp(call)
        try await eventually("alice's call ended") { await alice.timeline(of: call)?.isEnded == true }

        // The push arrives late: iOS insists the call be reported, and the SDK ends it at once.
        let bob = try Setup.bobsPhone(setup.server, setup.directory)
        let bobLog = EventCollector(bob.events)
        try await bob.handleVoIPPush(push.body)
        try await eventually("the call was reported") { bobLog.events.contains { if case .incoming(call, _, _, _) = $0 { true } else { false } } }
        try await eventually("and ended") { bobLog.events.contains { if case .phase(call, .ended) = $0 { true } else { false } } }
        // The missed call reaches bob as an ordinary alert.
        try await eventually("the missed-call alert") { setup.apns.delivered.contains { $0.pushType == "alert" } }
        let alert = try #require(setup.apns.delivered.first { $0.pushType == "alert" })
        #expect(alert.topic == "net.parley.app")
        #expect(String(decoding: alert.body, as: UTF8.self).contains(call.uuidString.lowercased()))
        await bob.stop()
        await alice.stop()
        try await setup.stop()
    }
}
