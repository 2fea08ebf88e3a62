import Foundation
import ParleyProtocol

/// Calls on a local network with no server: a listening device runs the call part of protocol v1
/// itself and advertises it with DNS-SD (multicast DNS) as `_parley._tcp`; a caller finds it,
/// asks it for a token (with the PIN, if it asks for one) and connects to it as to any server.
///
/// Discovery goes through the platform's own service — Avahi on Linux (`ParleyAvahi`), the Network
/// framework's `NWBrowser` and `NWListener` on Apple platforms (`ParleyApple`) — behind
/// ``LANDiscovery``; what a record says is decided here, once.
public enum LANService {
    /// The DNS-SD service type.
    public static let type = "_parley._tcp"
    /// The TXT record's version of this layout.
    public static let version = "1"

    /// The TXT record a listener advertises: `v=1`, `user`, `name` (when it has one) and `pin`
    /// (`1` when a caller must give the listener's PIN, else `0`).
    public static func txt(user: UserID, name: String?, pinRequired: Bool) -> [String: String] {
        var txt = ["v": version, "user": user.rawValue, "pin": pinRequired ? "1" : "0"]
        // A TXT string is at most 255 bytes, "name=" included.
        if let name, !name.isEmpty { txt["name"] = String(decoding: Array(name.utf8.prefix(240)), as: UTF8.self) }
        return txt
    }

    /// A DNS-SD instance name from what a person reads (`Bob on laptop`): control and format
    /// characters dropped, at most 63 bytes (DNS's label limit), cut on a character boundary.
    public static func instanceName(_ wanted: String) -> String {
        var name = ""
        for character in plainText(wanted) {
            guard name.utf8.count + String(character).utf8.count <= 63 else { break }
            name.append(character)
        }
        return name.isEmpty ? "Parley" : name
    }

    /// Text from the network made safe to print: no control or format characters (terminal escapes,
    /// new lines, bidirectional overrides), which could forge what a person reads beside it.
    public static func plainText(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.filter {
            !($0.properties.generalCategory == .control || $0.properties.generalCategory == .format
              || $0.properties.generalCategory == .lineSeparator || $0.properties.generalCategory == .paragraphSeparator)
        }))
    }

    /// A listener from a resolved record; nil when the record is not a Parley listener's (another
    /// version, no valid user id, no port).
    public static func listener(instance: String, host: String, port: Int, txt: [String: String]) -> LANListener? {
        guard txt["v"] == version, let user = txt["user"].flatMap(UserID.init(rawValue:)), (1...65535).contains(port),
              !host.isEmpty else { return nil }
        let name = txt["name"].map(plainText).flatMap { $0.isEmpty ? nil : $0 }
        return LANListener(instance: instance, user: user, name: name, host: host, port: port, pinRequired: txt["pin"] == "1")
    }
}

/// A device listening for calls on the local network.
public struct LANListener: Hashable, Sendable, CustomStringConvertible {
    /// The DNS-SD instance name, unique on the network (`bob on laptop`).
    public var instance: String
    public var user: UserID
    /// The display name it advertises.
    public var name: String?
    /// Its address on this network, as resolved (IPv4 or IPv6 literal).
    public var host: String
    public var port: Int
    /// Whether a caller must give its PIN.
    public var pinRequired: Bool

    public init(instance: String, user: UserID, name: String?, host: String, port: Int, pinRequired: Bool) {
        self.instance = instance
        self.user = user
        self.name = name
        self.host = host
        self.port = port
        self.pinRequired = pinRequired
    }

    /// The base URL of its signaling endpoint (`/v1/signal`) and token endpoint (`/v1/lan/tokens`).
    public var url: URL {
        let literal = host.contains(":") ? "[\(host)]" : host
        return URL(string: "http://\(literal):\(port)")!
    }

    public var description: String {
        "\(name.map { "\($0) (\(user))" } ?? user.rawValue) at \(host):\(port)\(pinRequired ? ", PIN" : "")"
    }
}

/// What a browse sees come and go.
public enum LANDiscoveryEvent: Hashable, Sendable {
    /// A listener appeared (or its record changed).
    case found(LANListener)
    /// The listener advertised under this instance name left.
    case lost(instance: String)
}

/// An advertisement in progress; it is withdrawn by `stop()` (and when the process ends).
public protocol LANAdvertisement: Sendable {
    /// The name it is registered under: the one asked for, or after a conflict on the network
    /// the next free one (`Bob on laptop #2`).
    var instance: String { get }
    func stop() async
}

/// The platform's DNS-SD service.
public protocol LANDiscovery: Sendable {
    /// Advertises a listener on `port` as `instance` (at most 63 bytes: `instanceName(_:)`); throws
    /// when the platform's service is missing or refuses. The name actually registered may differ
    /// after a conflict (`instance #2`). `lost` is told if the service goes away later (the
    /// daemon stopped): the device can no longer be found.
    func advertise(instance: String, port: Int, txt: [String: String],
                   lost: @escaping @Sendable (any Error) -> Void) async throws -> any LANAdvertisement
    /// Parley listeners as they appear and leave, resolved to an address, until the stream is
    /// dropped; it fails when the platform's service is missing or goes away.
    func browse() -> AsyncThrowingStream<LANDiscoveryEvent, any Error>
}

/// Keeps the listeners a browse has seen: what `parley lan` prints and a picker shows.
public struct LANDirectory: Sendable {
    public private(set) var listeners: [String: LANListener] = [:]

    public init() {}

    /// Applies an event; answers whether the list changed.
    @discardableResult
    public mutating func apply(_ event: LANDiscoveryEvent) -> Bool {
        switch event {
        case .found(let listener):
            return listeners.updateValue(listener, forKey: listener.instance) != listener
        case .lost(let instance):
            return listeners.removeValue(forKey: instance) != nil
        }
    }

    /// The listeners of `user`, or the one advertised as `instance`, or whose display name is `name`.
    public func matching(_ wanted: String) -> [LANListener] {
        let exact = listeners.values.filter { $0.instance == wanted }
        if !exact.isEmpty { return exact }
        return listeners.values.filter { $0.user.rawValue == wanted || $0.name == wanted }.sorted { $0.instance < $1.instance }
    }

    public var sorted: [LANListener] { listeners.values.sorted { ($0.user.rawValue, $0.instance) < ($1.user.rawValue, $1.instance) } }
}
