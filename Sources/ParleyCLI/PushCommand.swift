import ArgumentParser
import Foundation
import Logging
import ParleyAPNs
import ParleyProtocol
import ParleyServer

/// The APNs flags `serve` and `push test` share.
struct APNsOptions: ParsableArguments {
    @Option(name: .customLong("apns-key-file"),
            help: "The .p8 token signing key from Apple's developer account (Keys, with APNs enabled). [PARLEY_APNS_KEY_FILE]")
    var keyFile: String = Serve.env("PARLEY_APNS_KEY_FILE") ?? ""

    @Option(name: .customLong("apns-key-id"), help: "The key's 10-character id. [PARLEY_APNS_KEY_ID]")
    var keyID: String = Serve.env("PARLEY_APNS_KEY_ID") ?? ""

    @Option(name: .customLong("apns-team-id"), help: "The developer team's 10-character id. [PARLEY_APNS_TEAM_ID]")
    var teamID: String = Serve.env("PARLEY_APNS_TEAM_ID") ?? ""

    @Option(name: .customLong("apns-url"),
            help: "Send pushes here instead of Apple's hosts (by each device's environment), e.g. a proxy. [PARLEY_APNS_URL]")
    var url: String = Serve.env("PARLEY_APNS_URL") ?? ""

    @Option(name: .customLong("apns-ca-file"), help: "One more root certificate (PEM) to trust for --apns-url. [PARLEY_APNS_CA_FILE]")
    var caFile: String = Serve.env("PARLEY_APNS_CA_FILE") ?? ""

    /// nil when no APNs flag is given; an error when only some of the three required ones are.
    func settings() throws -> APNsSettings? {
        let given = [keyFile, keyID, teamID].filter { !$0.isEmpty }.count
        guard given > 0 || !url.isEmpty || !caFile.isEmpty else { return nil }
        guard given == 3 else {
            throw ValidationError("APNs needs all three of --apns-key-file, --apns-key-id and --apns-team-id (or PARLEY_APNS_KEY_FILE, _KEY_ID, _TEAM_ID)")
        }
        var endpoint: URL?
        if !url.isEmpty {
            guard let parsed = URL(string: url), parsed.scheme == "https", parsed.host != nil else {
                throw ValidationError("--apns-url takes an https URL, not \(url)")
            }
            endpoint = parsed
        }
        return APNsSettings(keyFile: keyFile, keyID: keyID, teamID: teamID, url: endpoint, caFile: caFile.isEmpty ? nil : caFile)
    }

    /// Where pushes go, in words.
    static func describe(_ settings: APNsSettings) -> String {
        let hosts = settings.url?.absoluteString ?? "api.push.apple.com and api.sandbox.push.apple.com"
        return "pushes through APNs at \(hosts) (key \(settings.keyID), team \(settings.teamID))"
    }
}

struct PushCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "push",
        abstract: "Check the push path of a deployment.",
        subcommands: [PushTest.self]
    )
}

struct PushTest: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "test",
        abstract: "Send a test VoIP push to each registered device of a user, and say what APNs answered.",
        discussion: """
        Run it where the server runs, with the same database and APNs settings. Each device that \
        takes the push shows an incoming call from "Parley push test", which ends on its own within \
        seconds (the app finds no such call on the server).
        Example: parley push test bob --database /var/lib/parley/parley.sqlite --apns-key-file AuthKey_ABC123DEFG.p8 \\
                 --apns-key-id ABC123DEFG --apns-team-id DEF123GHIJ
        """
    )

    @Argument(help: "The user whose devices to push to.")
    var user: String

    @Option(help: "The server's SQLite file, where devices are registered. [PARLEY_DATABASE]")
    var database: String = Serve.env("PARLEY_DATABASE") ?? "parley.sqlite"

    @OptionGroup var apns: APNsOptions

    func validate() throws {
        guard UserID(rawValue: user) != nil else { throw ValidationError("'\(user)' is not a valid user id: use 1-64 characters of A-Z a-z 0-9 . _ @ -") }
    }

    func run() async throws {
        guard let settings = try apns.settings() else {
            throw ValidationError("push test needs the server's APNs settings: --apns-key-file, --apns-key-id and --apns-team-id (or PARLEY_APNS_…)")
        }
        guard FileManager.default.fileExists(atPath: database) else {
            throw ValidationError("no database at \(database): pass the server's --database (PARLEY_DATABASE)")
        }
        let userID = UserID(rawValue: user)!
        let devices = try await SQLiteStore(path: database).devices(of: userID)
        guard !devices.isEmpty else {
            print("\(user) has no registered device: the app registers one with PUT /v1/devices/{device} after sign-in")
            throw ExitCode(1)
        }
        var logger = Logger(label: "parley.push")
        logger.logLevel = .warning
        let client: APNsClient
        do {
            client = try APNsClient(configuration: settings.clientConfiguration(), logger: logger)
        } catch {
            throw ValidationError(error.description)
        }
        print("parley: \(APNsOptions.describe(settings))")
        var failures = 0
        for device in devices {
            let sentence: String
            if let voip = device.voip {
                let (ok, text) = await Self.testPush(voip, client: client)
                if !ok { failures += 1 }
                sentence = text
            } else {
                sentence = "no VoIP token registered (platform \(device.platform.rawValue)): nothing to send"
            }
            print("  \(device.device): \(sentence)")
        }
        try? await client.shutdown()
        if failures > 0 { throw ExitCode(1) }
    }

    /// Sends one test push; answers whether APNs took it, and what to tell the operator.
    static func testPush(_ voip: VoIPRegistration, client: APNsClient) async -> (Bool, String) {
        let expiresAt = Int64(Date().timeIntervalSince1970 * 1000) + 30_000
        let payload = VoIPPushPayload(parley: .init(call: CallID(uuid: UUID()), from: .init(user: "parley", name: "Parley push test"),
                                                    media: MediaSpec(audio: true, video: false), expiresAt: expiresAt))
        let push = Push(user: "parley", device: "test", registration: voip, content: .incomingCall(payload))
        let notification = APNsNotification(deviceToken: voip.token, environment: voip.environment == .sandbox ? .sandbox : .production,
                                            pushType: .voip, topic: push.topic, expiration: push.expiration, payload: push.body())
        let environment = voip.environment.rawValue
        switch await client.send(notification) {
        case .delivered(let id):
            return (true, "APNs accepted the push (apns-id \(id), \(environment)); the phone should show a call from \"Parley push test\"")
        case .tokenRejected(let reason, let since):
            let when = since.map { " since \(ISO8601DateFormatter().string(from: $0))" } ?? ""
            let hint = reason == APNsReason.badDeviceToken
                ? "APNs does not know this token in \(environment): a development build's token is a sandbox one, a TestFlight or App Store build's a production one"
                : "the app is no longer on the device, or it stopped taking pushes; the server forgets this token at the next call"
            return (false, "APNs rejected the token (\(reason)\(when)): \(hint)")
        case .failed(let status, let reason, _):
            let hint: String = switch reason {
            case APNsReason.invalidProviderToken, APNsReason.missingProviderToken:
                "check the key file, --apns-key-id and --apns-team-id (the key must have APNs enabled)"
            case "TopicDisallowed", "DeviceTokenNotForTopic", "BadTopic":
                "the token belongs to another app than \(voip.topic), or the key's team cannot push to it"
            case APNsReason.tooManyProviderTokenUpdates:
                "another process renews tokens for this key too often"
            default:
                status == nil ? "APNs could not be reached or did not answer" : "see Apple's list of APNs errors"
            }
            return (false, "the push failed (\(status.map { "\($0) " } ?? "")\(reason)): \(hint)")
        }
    }
}
