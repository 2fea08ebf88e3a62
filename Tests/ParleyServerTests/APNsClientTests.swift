import Crypto
import Foundation
import Logging
import ParleyAPNs
import ParleyAPNsTesting
import ParleyLocalServices
import ParleyProtocol
import ParleyServer
import Testing

/// A wall clock the test moves by hand, shared by the provider and the double.
final class ManualWallClock: @unchecked Sendable {
    private let lock = NSLock()
    private var current = Date()
    var now: Date { lock.withLock { current } }
    func advance(minutes: Double) { lock.withLock { current = current.addingTimeInterval(minutes * 60) } }
}

/// The APNs provider against the double: what it sends, and what it does with each answer.
@Suite("APNs provider", .timeLimit(.minutes(5)))
struct APNsClientTests {
    static let token = String(repeating: "ab", count: 32)
    static let topic = "net.parley.app"

    /// A provider for `team` that sends every environment to `double`, retrying quickly.
    static func client(_ team: APNsTestTeam, _ double: APNsDouble, key: APNsSigningKey? = nil,
                       wallClock: @escaping @Sendable () -> Date = { Date() }) throws -> APNsClient {
        var configuration = APNsClient.Configuration(key: try key ?? APNsSigningKey(file: team.keyFile, keyID: team.keyID, teamID: team.teamID))
        configuration.useEndpoint(double.url)
        configuration.extraRootCertificateFile = double.caFile
        configuration.initialBackoff = .milliseconds(20)
        configuration.maximumBackoff = .milliseconds(200)
        return try APNsClient(configuration: configuration, logger: Logger(label: "test.apns"), wallClock: wallClock)
    }

    static func voip(token: String = token, environment: APNsEnvironment = .production, expiresIn seconds: Double = 30,
                     payload: Data = Data(#"{"parley":{"call":"x"}}"#.utf8)) -> APNsNotification {
        APNsNotification(deviceToken: token, environment: environment, pushType: .voip, topic: topic + ".voip",
                         expiration: Int64(Date().timeIntervalSince1970 + seconds), payload: payload)
    }

    @Test func aVoIPPushCarriesEveryHeaderAPNsChecksOnOneConnection() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let double = try await team.makeDouble()
        double.addDevice(token: Self.token, topic: Self.topic)
        let client = try Self.client(team, double)

        let notification = Self.voip()
        #expect(await client.send(notification) == .delivered(apnsID: notification.id.uuidString))
        let request = try #require(double.delivered.first)
        #expect(request.method == "POST")
        #expect(request.path == "/3/device/\(Self.token)")
        #expect(request.headers["apns-push-type"] == "voip")
        #expect(request.headers["apns-topic"] == "net.parley.app.voip")
        #expect(request.headers["apns-priority"] == "10")
        #expect(request.headers["apns-expiration"] == String(notification.expiration))
        #expect(request.headers["apns-id"] == notification.id.uuidString)
        #expect(request.body == notification.payload)

        // Later pushes, many at once, are streams of the same HTTP/2 connection, with the same token.
        let results = await withTaskGroup(of: APNsResult.self) { group in
            for _ in 0..<20 { group.addTask { await client.send(Self.voip()) } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.allSatisfy { if case .delivered = $0 { true } else { false } })
        #expect(double.delivered.count == 21)
        #expect(Set(double.requests.map(\.connection)) == [1])
        #expect(Set(double.requests.compactMap(\.providerToken)).count == 1)
        try await client.shutdown()
        await double.stop()
    }

    @Test func aSandboxTokenGoesToTheSandboxOnly() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let production = try await team.makeDouble()
        let sandbox = try await team.makeDouble()
        sandbox.addDevice(token: Self.token, topic: Self.topic)
        var configuration = APNsClient.Configuration(key: try APNsSigningKey(file: team.keyFile, keyID: team.keyID, teamID: team.teamID))
        configuration.endpoints = [.production: production.url, .sandbox: sandbox.url]
        // Each double has its own CA: trust both, from one PEM file.
        let roots = FileManager.default.temporaryDirectory.appendingPathComponent("parley-roots-\(UUID().uuidString).pem")
        try (String(contentsOfFile: production.caFile, encoding: .utf8) + "\n" + String(contentsOfFile: sandbox.caFile, encoding: .utf8))
            .write(to: roots, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: roots) }
        configuration.extraRootCertificateFile = roots.path
        let client = try APNsClient(configuration: configuration, logger: Logger(label: "test"))

        #expect(await client.send(Self.voip(environment: .sandbox)).isDelivered)
        #expect(sandbox.delivered.count == 1)
        #expect(production.requests.isEmpty, "a sandbox token never goes to production")
        // Sent to production, the same token is unknown there: APNs answers BadDeviceToken.
        #expect(await client.send(Self.voip(environment: .production)) == .tokenRejected(reason: "BadDeviceToken", since: nil))
        #expect(production.requests.count == 1)
        // The server's sender sends each device's push to the environment the device registered.
        let sender = APNsPushSender(client: client)
        let payload = VoIPPushPayload(parley: .init(call: CallID(uuid: UUID()), from: .init(user: "alice", name: "Alice"),
                                                    media: MediaSpec(audio: true, video: false),
                                                    expiresAt: Int64(Date().timeIntervalSince1970 * 1000) + 30_000))
        let registration = VoIPRegistration(token: Self.token, topic: Self.topic, environment: .sandbox)
        let outcome = await sender.send(Push(user: "bob", device: "iphone", registration: registration, content: .incomingCall(payload)))
        #expect({ if case .delivered = outcome { true } else { false } }(), "\(outcome)")
        #expect(sandbox.delivered.count == 2 && production.requests.count == 1, "a sandbox registration's push goes to the sandbox")
        try await client.shutdown()
        await production.stop()
        await sandbox.stop()
    }

    @Test func aProviderTokenSignedWithAnotherKeyIsRefused() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let double = try await team.makeDouble()
        double.addDevice(token: Self.token, topic: Self.topic)
        // Right ids, wrong key: the signature does not verify with the team's public key.
        let impostor = try APNsSigningKey(pem: P256.Signing.PrivateKey().pemRepresentation, keyID: team.keyID, teamID: team.teamID)
        let client = try Self.client(team, double, key: impostor)
        #expect(await client.send(Self.voip()).failure == "403 InvalidProviderToken")
        // It made a new token once (403 may mean a stale one), then gave up: two requests, none delivered.
        #expect(double.requests.map(\.status) == [403, 403])
        #expect(double.delivered.isEmpty)
        // And a token for another team fails the same way.
        let otherTeam = try APNsSigningKey(file: team.keyFile, keyID: team.keyID, teamID: "ZZZ999ZZZZ")
        let other = try Self.client(team, double, key: otherTeam)
        #expect(await other.send(Self.voip()).failure == "403 InvalidProviderToken")
        try await client.shutdown()
        try await other.shutdown()
        await double.stop()
    }

    @Test func theProviderTokenIsKeptFortyMinutesAndRenewedOnceWhenExpired() async throws {
        let clock = ManualWallClock()
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let double = try await team.makeDouble { clock.now }
        double.addDevice(token: Self.token, topic: Self.topic)
        let client = try Self.client(team, double) { clock.now }

        #expect(await client.send(Self.voip(expiresIn: 7200)).isDelivered)
        clock.advance(minutes: 39)
        #expect(await client.send(Self.voip(expiresIn: 7200)).isDelivered)
        clock.advance(minutes: 2)  // 41 minutes: a new token, which APNs allows (20 minutes or more)
        #expect(await client.send(Self.voip(expiresIn: 7200)).isDelivered)
        let tokens = double.requests.compactMap(\.providerToken)
        #expect(tokens[0] == tokens[1])
        #expect(tokens[2] != tokens[1])
        #expect(double.requests.allSatisfy { $0.status == 200 }, "never TooManyProviderTokenUpdates")

        // APNs calls the token expired (its clock says an hour passed): one new token at once, and the push goes.
        double.script(.refuse(status: 403, reason: "ExpiredProviderToken"))
        #expect(await client.send(Self.voip(expiresIn: 7200)).isDelivered)
        let last = double.requests.suffix(2)
        #expect(last.map(\.status) == [403, 200])
        #expect(last.first?.providerToken == tokens[2])
        #expect(last.last?.providerToken != tokens[2])
        // A token really an hour old is refused by the double's own check, and renewed the same way.
        clock.advance(minutes: 30)
        let staleClient = try Self.client(team, double) { clock.now.addingTimeInterval(-3700) }
        #expect(await staleClient.send(Self.voip(expiresIn: 7200)).failure == "403 ExpiredProviderToken")
        try await client.shutdown()
        try await staleClient.shutdown()
        await double.stop()
    }

    @Test func busyAndFailingAnswersAreRetriedUntilDelivered() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let double = try await team.makeDouble()
        double.addDevice(token: Self.token, topic: Self.topic)
        let client = try Self.client(team, double)
        double.script(.refuse(status: 503, reason: "ServiceUnavailable"), .refuse(status: 429, reason: "TooManyRequests"),
                      .refuse(status: 500, reason: "InternalServerError"))
        #expect(await client.send(Self.voip()).isDelivered)
        #expect(double.requests.map(\.status) == [503, 429, 500, 200])

        // A dropped connection: the push goes again on a new one.
        double.script(.dropConnection)
        #expect(await client.send(Self.voip()).isDelivered)
        #expect(double.connectionsAccepted == 2)
        #expect(double.requests.suffix(2).map(\.status) == [0, 200])
        try await client.shutdown()
        await double.stop()
    }

    @Test func retriesStopAtTheNotificationsExpiry() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let double = try await team.makeDouble()
        double.addDevice(token: Self.token, topic: Self.topic)
        let client = try Self.client(team, double)
        for _ in 0..<200 { double.script(.refuse(status: 503, reason: "ServiceUnavailable")) }
        let started = ContinuousClock.now
        let result = await client.send(Self.voip(expiresIn: 1.5))
        guard case .failed(nil, let reason, _) = result else { Issue.record("expected a failure, got \(result)"); return }
        #expect(reason.contains("expired"))
        #expect(double.requests.count > 1, "it tried again")
        #expect(double.delivered.isEmpty)
        #expect(ContinuousClock.now - started < .seconds(5), "it stopped at the expiry, not later")
        try await client.shutdown()
        await double.stop()
    }

    @Test func whatAPNsWouldRefuseIsNotSentOrNotRetried() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let double = try await team.makeDouble()
        double.addDevice(token: Self.token, topic: Self.topic)
        let client = try Self.client(team, double)
        // Too big: refused here, as APNs would (413), without a request.
        let big = Data(("{\"x\":\"" + String(repeating: "a", count: 5200) + "\"}").utf8)
        #expect(await client.send(Self.voip(payload: big)).failure == "PayloadTooLarge")
        #expect(double.requests.isEmpty)
        // Wrong topic for the token's app: failed at once with APNs' reason, no retry.
        var wrongTopic = Self.voip()
        wrongTopic.topic = "com.other.app.voip"
        #expect(await client.send(wrongTopic).failure == "400 DeviceTokenNotForTopic")
        // A VoIP push whose topic lacks `.voip`.
        var noSuffix = Self.voip()
        noSuffix.topic = Self.topic
        #expect(await client.send(noSuffix).failure == "400 InvalidPushType")
        // 410: the token is rejected with the time APNs knew it gone.
        let gone = Date(timeIntervalSince1970: 1_700_000_000)
        double.unregister(token: Self.token, at: gone)
        #expect(await client.send(Self.voip()) == .tokenRejected(reason: "Unregistered", since: gone))
        #expect(double.requests.count == 3)
        try await client.shutdown()
        await double.stop()
    }

    @Test func anEndpointWhoseCertificateIsNotTrustedFailsAtOnce() async throws {
        let team = try APNsTestTeam()
        defer { team.removeKeyFile() }
        let double = try await team.makeDouble()
        double.addDevice(token: Self.token, topic: Self.topic)
        var configuration = APNsClient.Configuration(key: try APNsSigningKey(file: team.keyFile, keyID: team.keyID, teamID: team.teamID))
        configuration.useEndpoint(double.url)  // and no --apns-ca-file: the double's CA is nobody's root
        let client = try APNsClient(configuration: configuration, logger: Logger(label: "test"))
        let started = ContinuousClock.now
        let failure = try #require(await client.send(Self.voip(expiresIn: 60)).failure)
        #expect(failure.hasPrefix("TLS with 127.0.0.1 failed"), "not retried until the expiry: waiting does not mend a certificate")
        // Not retried by the HTTP client either, until its connect timeout (10 s): it took 10 s so.
        #expect(ContinuousClock.now - started < .seconds(5), "reported at once, not after the HTTP client's own retries")
        #expect(double.requests.isEmpty)
        try await client.shutdown()
        await double.stop()
    }

    @Test func aKeyThatIsNotAP8FileOrIdsThatAreNotApplesAreRefusedClearly() throws {
        #expect(throws: APNsConfigurationError.self) { try APNsSigningKey(pem: "not a key", keyID: "ABC123DEFG", teamID: "DEF123GHIJ") }
        let pem = P256.Signing.PrivateKey().pemRepresentation
        #expect(throws: APNsConfigurationError.self) { try APNsSigningKey(pem: pem, keyID: "abc", teamID: "DEF123GHIJ") }
        #expect(throws: APNsConfigurationError.self) { try APNsSigningKey(file: "/nonexistent/AuthKey.p8", keyID: "ABC123DEFG", teamID: "DEF123GHIJ") }
        let key = try APNsSigningKey(pem: pem, keyID: "ABC123DEFG", teamID: "DEF123GHIJ")
        #expect(!"\(key)".contains("PRIVATE"), "the key is never printed")
    }
}

extension APNsResult {
    var isDelivered: Bool { if case .delivered = self { true } else { false } }
    /// "status reason" of a failure (just the reason when no answer came), nil otherwise.
    var failure: String? {
        guard case .failed(let status, let reason, _) = self else { return nil }
        return status.map { "\($0) \(reason)" } ?? reason
    }
}
