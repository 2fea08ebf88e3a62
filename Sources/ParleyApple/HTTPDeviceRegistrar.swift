// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import ParleyKit
import ParleyProtocol

/// Registers through the server's HTTP API (`PUT /v1/devices/{device}`) with a fresh access token
/// each time, over URLSession: the platform's half of `DeviceRegistrar`, which ParleyKit defines.
public struct HTTPDeviceRegistrar: DeviceRegistrar {
    public var server: URL
    public var device: DeviceID
    public var token: @Sendable () async throws -> String

    /// - Parameters:
    ///   - server: the server's HTTP base URL.
    ///   - token: an access token for the user (the same source the signaling client uses).
    public init(server: URL, device: DeviceID, token: @escaping @Sendable () async throws -> String) {
        self.server = server
        self.device = device
        self.token = token
    }

    public struct Refused: Error, CustomStringConvertible {
        public var status: Int
        public var description: String { "the server refused the device registration (HTTP \(status))" }
    }

    public func register(_ registration: DeviceRegistration) async throws {
        var request = URLRequest(url: server.appendingPathComponent("v1/devices/\(device.rawValue)"))
        request.httpMethod = "PUT"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue("Bearer \(try await token())", forHTTPHeaderField: "Authorization")
        request.httpBody = try JSONEncoder().encode(registration)
        request.timeoutInterval = 10
        let (_, response) = try await URLSession.shared.dataCancellably(for: request)
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard status == 200 else { throw Refused(status: status) }
    }
}
#endif
