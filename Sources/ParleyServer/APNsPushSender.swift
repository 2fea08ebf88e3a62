import Foundation
import Logging
import ParleyAPNs
import ParleyProtocol

/// Where the server sends pushes: Apple's push service, with the team's token signing key.
public struct APNsSettings: Sendable {
    /// The `.p8` file, its key id and the team id (Apple's developer account, Keys).
    public var keyFile: String
    public var keyID: String
    public var teamID: String
    /// One endpoint for both environments instead of Apple's two hosts (a test double, a proxy).
    public var url: URL?
    /// One more root to trust for the endpoint (PEM).
    public var caFile: String?

    public init(keyFile: String, keyID: String, teamID: String, url: URL? = nil, caFile: String? = nil) {
        self.keyFile = keyFile
        self.keyID = keyID
        self.teamID = teamID
        self.url = url
        self.caFile = caFile
    }

    /// The client configuration; reads the key file once.
    public func clientConfiguration() throws(APNsConfigurationError) -> APNsClient.Configuration {
        var configuration = APNsClient.Configuration(key: try APNsSigningKey(file: keyFile, keyID: keyID, teamID: teamID))
        if let url { configuration.useEndpoint(url) }
        configuration.extraRootCertificateFile = caFile
        try configuration.validate()
        return configuration
    }
}

/// Sends the server's pushes through APNs: each device's token to the host of the environment it
/// registered (a sandbox token never goes to production), and counts what became of them.
public struct APNsPushSender: PushSender {
    public let client: APNsClient

    public init(client: APNsClient) { self.client = client }

    public func send(_ push: Push) async -> PushOutcome {
        let notification = APNsNotification(deviceToken: push.registration.token, environment: push.registration.environment.apns,
                                            pushType: push.isVoIP ? .voip : .alert, topic: push.topic, priority: push.priority,
                                            expiration: push.expiration, payload: push.body())
        switch await client.send(notification) {
        case .delivered(let id):
            return .delivered(id: id)
        case .tokenRejected(let reason, let since):
            return .tokenInvalid(reason: reason, since: since.map { Int64($0.timeIntervalSince1970 * 1000) })
        case .failed(let status, let reason, _):
            return .failed(status.map { "\($0) \(reason)" } ?? reason)
        }
    }
}

extension VoIPRegistration.Environment {
    var apns: APNsEnvironment {
        switch self {
        case .production: .production
        case .sandbox: .sandbox
        }
    }
}
