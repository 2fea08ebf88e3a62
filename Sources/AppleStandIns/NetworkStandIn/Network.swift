// Stand-in for Apple's Network framework on Linux, as module `NetworkStandIn`: a module named
// `Network` would make `canImport(Network)` true for every package in the build, and SwiftNIO and
// Hummingbird take that to mean an Apple platform. Only what ParleyApple uses: `NWPathMonitor`
// (NetworkPathMonitor) and `NWBrowser`, `NWConnection` and the endpoints, parameters and errors they
// carry (BonjourDiscovery). Network has no Objective-C header for these Swift types: they are
// transcribed from the SDK's Swift interface,
//   - iOS 17.0 (the package's floor): xybp888/iOS-SDKs@17a406eaab76a1e1f2fa3e8e50c6acb47e26ca55,
//     iPhoneOS17.0.sdk/System/Library/Frameworks/Network.framework/Modules/Network.swiftmodule/
//     arm64-apple-ios.swiftinterface — the declarations quoted below, handlers `@Sendable`, classes
//     `Sendable` (both new in iOS 17);
//   - checked against iOS 16.5: theos/sdks@4af4cb1d02b6b8c6046db70851f70ca186b8bd73,
//     iPhoneOS16.5.sdk/usr/lib/swift/Network.swiftmodule/arm64-apple-ios.swiftinterface (same
//     declarations, without `@Sendable` and `Sendable`).
// What they do is taken from the C headers beside them (browser.h, connection.h, path.h, dns_sd.h
// in the same iOS 16.5 SDK) and from the Swift overlay's source as it was published in
// swiftlang/swift (stdlib/public/Darwin/Network/*.swift, 2018–2019): a resolved address carries
// its interface, and its `debugDescription` reads `192.168.1.20%en0`. Apple platforms use the real
// framework. Hooks for tests are marked "Stand-in only"; docs/apple-stand-ins.md lists every
// difference from the real framework.

import Foundation
import StandInSupport
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// MARK: - Interfaces and paths

/// `public struct NWInterface : Swift.Hashable, Swift.CustomDebugStringConvertible, Swift.Sendable`
public struct NWInterface: Hashable, CustomDebugStringConvertible, Sendable {
    /// `public enum InterfaceType`
    public enum InterfaceType: Hashable, Sendable {
        case other, wifi, cellular, wiredEthernet, loopback
    }

    public let type: InterfaceType
    public let name: String

    /// Stand-in only: interfaces come from the system.
    public init(standInType type: InterfaceType, name: String) {
        self.type = type
        self.name = name
    }

    /// `public var debugDescription: Swift.String { get }` — the interface's name (`en0`), as the
    /// overlay's scoped addresses print it.
    public var debugDescription: String { name }
}

/// `public struct NWPath : Equatable, CustomDebugStringConvertible`
public struct NWPath: Equatable, Sendable {
    /// `public enum Status`
    public enum Status: Equatable, Sendable {
        case satisfied, unsatisfied, requiresConnection
    }

    public let status: Status
    public let availableInterfaces: [NWInterface]
    public let isExpensive: Bool
    public let isConstrained: Bool
    /// `public let supportsIPv4: Swift.Bool` — the interface the path uses has IPv4 connectivity
    /// (`nw_path_has_ipv4`, path.h).
    public let supportsIPv4: Bool
    /// `public let supportsIPv6: Swift.Bool` (`nw_path_has_ipv6`)
    public let supportsIPv6: Bool
    /// `public let remoteEndpoint: Network.NWEndpoint?` — on a connection's path, the address data
    /// is sent to (`nw_path_copy_effective_remote_endpoint`, path.h): for a connection to a Bonjour
    /// service, the address the service resolved to.
    public let remoteEndpoint: NWEndpoint?

    /// `public func usesInterfaceType(_ type: NWInterface.InterfaceType) -> Bool`
    public func usesInterfaceType(_ type: NWInterface.InterfaceType) -> Bool {
        availableInterfaces.first?.type == type
    }

    /// Stand-in only. The interfaces in the system's order of preference: the first is the one the
    /// path sends through. IPv4 and IPv6 are there when the path is satisfied, unless said otherwise.
    public init(standInStatus status: Status, interfaces: [NWInterface], isExpensive: Bool = false, isConstrained: Bool = false,
                supportsIPv4: Bool? = nil, supportsIPv6: Bool? = nil, remoteEndpoint: NWEndpoint? = nil) {
        self.status = status
        self.availableInterfaces = interfaces
        self.isExpensive = isExpensive
        self.isConstrained = isConstrained
        self.supportsIPv4 = supportsIPv4 ?? (status == .satisfied)
        self.supportsIPv6 = supportsIPv6 ?? (status == .satisfied)
        self.remoteEndpoint = remoteEndpoint
    }
}

/// `final public class NWPathMonitor`
public final class NWPathMonitor: @unchecked Sendable {
    private let lock = NSLock()
    private var queue: DispatchQueue?
    private var _handler: (@Sendable (NWPath) -> Void)?
    private var _path = NWPath(standInStatus: .satisfied, interfaces: [NWInterface(standInType: .wifi, name: "en0")])
    private var cancelled = false

    /// `public init()`
    public init() {
        Self.monitors.withLock { $0.append(Weak(monitor: self)) }
    }

    /// `final public var pathUpdateHandler: (@Sendable (_ newPath: NWPath) -> Void)?`
    public var pathUpdateHandler: (@Sendable (_ newPath: NWPath) -> Void)? {
        get { lock.withLock { _handler } }
        set { lock.withLock { _handler = newValue } }
    }

    /// `final public var currentPath: NWPath { get }`
    public var currentPath: NWPath { lock.withLock { _path } }

    /// `final public func start(queue: DispatchQueue)` — the handler gets the current path at once.
    public func start(queue: DispatchQueue) {
        let (handler, path) = lock.withLock { () -> ((@Sendable (NWPath) -> Void)?, NWPath) in
            self.queue = queue
            return (_handler, _path)
        }
        if let handler { queue.async { handler(path) } }
    }

    /// `final public func cancel()`
    public func cancel() {
        lock.withLock { cancelled = true }
    }

    // MARK: Stand-in only

    /// The device's network changes (Wi-Fi to cellular, lost, back): every started monitor hears of it.
    public static func standInChange(to path: NWPath) {
        for monitor in monitors.withLock({ $0.compactMap(\.monitor) }) { monitor.update(path) }
    }

    private func update(_ path: NWPath) {
        let (handler, queue) = lock.withLock { () -> ((@Sendable (NWPath) -> Void)?, DispatchQueue?) in
            _path = path
            return cancelled ? (nil, nil) : (_handler, self.queue)
        }
        if let handler, let queue { queue.async { handler(path) } }
    }

    private struct Weak {
        weak var monitor: NWPathMonitor?
    }

    private static let monitors = StandInLockedBox<[Weak]>([])
}

// MARK: - Errors

/// `public enum NWError : Swift.Error, Swift.CustomDebugStringConvertible, Swift.Equatable`
/// (Sendable as every `Error`; Glibc's `POSIXErrorCode` is `Sendable`, as Darwin's is)
public enum NWError: Error, CustomDebugStringConvertible, Equatable {
    /// `case posix(Darwin.POSIXErrorCode)`
    case posix(POSIXErrorCode)
    /// `case dns(dnssd.DNSServiceErrorType)` — `typedef int32_t DNSServiceErrorType;` (dns_sd.h)
    case dns(Int32)
    /// `case tls(Darwin.OSStatus)` — `typedef SInt32 OSStatus;`
    case tls(Int32)

    /// `public var debugDescription: Swift.String { get }` — `-65555: NoAuth`, as the overlay prints
    /// it (code, colon, the DNS-SD or POSIX name).
    public var debugDescription: String {
        switch self {
        case .posix(let code): "\(code.rawValue): \(String(cString: strerror(code.rawValue)))"
        case .dns(let code): "\(code): \(Self.dnsNames[code] ?? "Unknown")"
        case .tls(let status): "\(status): TLS error"
        }
    }

    /// The DNS-SD errors' names (dns_sd.h, `kDNSServiceErr_…`) for the ones this stand-in reports.
    private static let dnsNames: [Int32: String] = [
        -65537: "Unknown", -65554: "NoSuchRecord", -65555: "NoAuth", -65563: "ServiceNotRunning", -65570: "PolicyDenied",
    ]
}

/// The DNS-SD error codes the stand-in's system reports (dns_sd.h).
private enum DNSServiceError {
    /// `kDNSServiceErr_NoAuth = -65555`: what DNSServiceBrowse answers an app that browses for a
    /// service type its Info.plist does not list under `NSBonjourServices` (iOS 14 and later).
    static let noAuth: Int32 = -65555
    /// `kDNSServiceErr_PolicyDenied = -65570`: the app does not have the Local Network privilege —
    /// its first-time prompt is still up, or the user said no (TN3179).
    static let policyDenied: Int32 = -65570
}

// MARK: - Addresses and endpoints

/// `public struct IPv4Address : Network.IPAddress, Swift.Hashable, Swift.CustomDebugStringConvertible`
/// (`IPAddress : Swift.Sendable`)
public struct IPv4Address: Hashable, CustomDebugStringConvertible, Sendable {
    /// `public var rawValue: Foundation.Data { get }` — the four bytes, in network order.
    public let rawValue: Data
    /// `public let interface: Network.NWInterface?` — the interface the address is scoped to.
    public let interface: NWInterface?

    /// `public init?(_ rawValue: Foundation.Data, _ interface: Network.NWInterface? = nil)` — nil
    /// unless the data is exactly four bytes.
    public init?(_ rawValue: Data, _ interface: NWInterface? = nil) {
        guard rawValue.count == 4 else { return nil }
        self.rawValue = rawValue
        self.interface = interface
    }

    /// `public init?(_ string: Swift.String)` — an address literal (`192.168.1.20`); no name
    /// resolution. (The real one also takes a scope, `169.254.8.8%en0`; this one does not.)
    public init?(_ string: String) {
        var bytes = [UInt8](repeating: 0, count: 4)
        guard inet_pton(AF_INET, string, &bytes) == 1 else { return nil }
        self.init(Data(bytes))
    }

    /// `public var isLinkLocal: Swift.Bool { get }` — 169.254.0.0/16.
    public var isLinkLocal: Bool { rawValue[rawValue.startIndex] == 169 && rawValue[rawValue.startIndex + 1] == 254 }

    /// `public var isLoopback: Swift.Bool { get }`
    public var isLoopback: Bool { rawValue == Data([127, 0, 0, 1]) }

    /// `public var debugDescription: Swift.String { get }` — the literal, then `%` and the
    /// interface when the address is scoped to one (`192.168.1.20%en0`), as the overlay prints it.
    public var debugDescription: String {
        let literal = rawValue.map { String($0) }.joined(separator: ".")
        return interface.map { "\(literal)%\($0.name)" } ?? literal
    }

    /// The address as seen on an interface (a resolved address carries the interface it was found on).
    fileprivate func scoped(to interface: NWInterface) -> IPv4Address {
        // Four bytes already: the failable init cannot fail.
        IPv4Address(rawValue, interface) ?? self
    }
}

/// `public struct IPv6Address : Network.IPAddress, Swift.Hashable, Swift.CustomDebugStringConvertible`
public struct IPv6Address: Hashable, CustomDebugStringConvertible, Sendable {
    /// `public var rawValue: Foundation.Data { get }` — the sixteen bytes.
    public let rawValue: Data
    /// `public let interface: Network.NWInterface?`
    public let interface: NWInterface?

    /// `public init?(_ rawValue: Foundation.Data, _ interface: Network.NWInterface? = nil)`
    public init?(_ rawValue: Data, _ interface: NWInterface? = nil) {
        guard rawValue.count == 16 else { return nil }
        self.rawValue = rawValue
        self.interface = interface
    }

    /// `public init?(_ string: Swift.String)` — an address literal (`fe80::1`, `2001:db8::5`).
    /// (The real one also takes a scope, `fe80::1%lo0`; this one does not.)
    public init?(_ string: String) {
        var bytes = [UInt8](repeating: 0, count: 16)
        guard inet_pton(AF_INET6, string, &bytes) == 1 else { return nil }
        self.init(Data(bytes))
    }

    /// `public var isLinkLocal: Swift.Bool { get }` — fe80::/10.
    public var isLinkLocal: Bool { rawValue[rawValue.startIndex] == 0xfe && rawValue[rawValue.startIndex + 1] & 0xc0 == 0x80 }

    /// `public var debugDescription: Swift.String { get }` — the canonical literal (inet_ntop, as the
    /// overlay's getnameinfo gives it), then `%` and the interface when scoped (`fe80::1%en0`).
    public var debugDescription: String {
        let bytes = [UInt8](rawValue)
        var buffer = [CChar](repeating: 0, count: 64)
        let capacity = socklen_t(buffer.count)
        let written = bytes.withUnsafeBytes { source in
            inet_ntop(AF_INET6, source.baseAddress, &buffer, capacity) != nil
        }
        let literal = written ? String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
        return interface.map { "\(literal)%\($0.name)" } ?? literal
    }

    fileprivate func scoped(to interface: NWInterface) -> IPv6Address {
        IPv6Address(rawValue, interface) ?? self
    }
}

/// `public enum NWEndpoint : Swift.Hashable, Swift.CustomDebugStringConvertible, Swift.Sendable`
///
/// iOS 16's `case opaque(_: Network.nw_endpoint_t)` is left out (there is no C API here). On Apple
/// platforms the enum is not frozen: code that must compile on both matches cases with `if case`
/// rather than switching over them.
public enum NWEndpoint: Hashable, CustomDebugStringConvertible, Sendable {
    /// `case hostPort(host: Network.NWEndpoint.Host, port: Network.NWEndpoint.Port)`
    case hostPort(host: Host, port: Port)
    /// `case service(name: Swift.String, type: Swift.String, domain: Swift.String, interface: Network.NWInterface?)`
    /// — a Bonjour service, by name: it has no address until a connection resolves it.
    case service(name: String, type: String, domain: String, interface: NWInterface?)
    /// `case unix(path: Swift.String)`
    case unix(path: String)
    /// `case url(_: Foundation.URL)`
    case url(URL)

    /// `public enum Host : Swift.Hashable, Swift.CustomDebugStringConvertible, Swift.ExpressibleByStringLiteral, Swift.Sendable`
    public enum Host: Hashable, CustomDebugStringConvertible, ExpressibleByStringLiteral, Sendable {
        public typealias StringLiteralType = String

        /// `case name(Swift.String, Network.NWInterface?)`
        case name(String, NWInterface?)
        /// `case ipv4(Network.IPv4Address)`
        case ipv4(IPv4Address)
        /// `case ipv6(Network.IPv6Address)`
        case ipv6(IPv6Address)

        /// `public init(stringLiteral: Network.NWEndpoint.Host.StringLiteralType)`
        public init(stringLiteral: String) {
            self.init(stringLiteral)
        }

        /// `public init(_ string: Swift.String)` — an IPv4 or IPv6 literal makes an address host,
        /// anything else a name.
        public init(_ string: String) {
            if let address = IPv4Address(string) {
                self = .ipv4(address)
            } else if let address = IPv6Address(string) {
                self = .ipv6(address)
            } else {
                self = .name(string, nil)
            }
        }

        /// `public var interface: Network.NWInterface? { get }`
        public var interface: NWInterface? {
            switch self {
            case .name(_, let interface): interface
            case .ipv4(let address): address.interface
            case .ipv6(let address): address.interface
            }
        }

        /// `public var debugDescription: Swift.String { get }`
        public var debugDescription: String {
            switch self {
            case .name(let name, let interface): interface.map { "\(name)%\($0.name)" } ?? name
            case .ipv4(let address): address.debugDescription
            case .ipv6(let address): address.debugDescription
            }
        }
    }

    /// `public struct Port : Swift.Hashable, Swift.CustomDebugStringConvertible, Swift.ExpressibleByIntegerLiteral, Swift.RawRepresentable, Swift.Sendable`
    public struct Port: Hashable, CustomDebugStringConvertible, ExpressibleByIntegerLiteral, RawRepresentable, Sendable {
        public typealias IntegerLiteralType = UInt16

        /// `public var rawValue: Swift.UInt16 { get }`
        public let rawValue: UInt16

        /// `public static let any: Network.NWEndpoint.Port`
        public static let any: Port = 0

        /// `public init?(rawValue: Swift.UInt16)` — never nil (the overlay's accepts every value).
        public init?(rawValue: UInt16) {
            self.rawValue = rawValue
        }

        /// `public init(integerLiteral value: Network.NWEndpoint.Port.IntegerLiteralType)`
        public init(integerLiteral value: UInt16) {
            self.rawValue = value
        }

        /// `public var debugDescription: Swift.String { get }`
        public var debugDescription: String { String(rawValue) }
    }

    /// `public var interface: Network.NWInterface? { get }`
    public var interface: NWInterface? {
        switch self {
        case .hostPort(let host, _): host.interface
        case .service(_, _, _, let interface): interface
        case .unix, .url: nil
        }
    }

    /// `public var debugDescription: Swift.String { get }` — the overlay's spelling: `host:port`
    /// (`host.port` for IPv6), `name.type.domain`.
    public var debugDescription: String {
        switch self {
        case .hostPort(let host, let port):
            if case .ipv6 = host { "\(host.debugDescription).\(port.rawValue)" } else { "\(host.debugDescription):\(port.rawValue)" }
        case .service(let name, let type, let domain, let interface):
            "\(name).\(type)\(domain)" + (interface.map { "%\($0.name)" } ?? "")
        case .unix(let path): path
        case .url(let url): url.absoluteString
        }
    }
}

/// `public struct NWTXTRecord : Swift.Sendable` (`Equatable`, `CustomDebugStringConvertible` by
/// extension). Its `Collection` conformance, `Entry` and `getEntry(for:)` are left out.
public struct NWTXTRecord: Equatable, CustomDebugStringConvertible, Sendable {
    private var entries: [String: String]

    /// `public init(_ dictionary: [Swift.String : Swift.String] = [:])`
    public init(_ dictionary: [String: String] = [:]) {
        entries = dictionary
    }

    /// `public var dictionary: [Swift.String : Swift.String] { get }`
    public var dictionary: [String: String] { entries }

    /// `public subscript(key: Swift.String) -> Swift.String? { get set }`
    public subscript(key: String) -> String? {
        get { entries[key] }
        set { entries[key] = newValue }
    }

    /// `public var debugDescription: Swift.String { get }`
    public var debugDescription: String {
        entries.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
    }
}

// MARK: - Parameters and protocols

/// `public class NWProtocolOptions : @unchecked Swift.Sendable` (no public initializer)
public class NWProtocolOptions: @unchecked Sendable {
    init() {}
}

/// `public class NWProtocol : @unchecked Swift.Sendable` (no public initializer)
public class NWProtocol: @unchecked Sendable {
    init() {}
}

/// `public class NWProtocolIP : Network.NWProtocol`
public class NWProtocolIP: NWProtocol, @unchecked Sendable {
    /// `public class Options : Network.NWProtocolOptions`
    public class Options: NWProtocolOptions, @unchecked Sendable {
        /// `public enum Version` (`Equatable`, `Hashable` by extension; not `Sendable`)
        public enum Version: Hashable {
            /// `case any`
            case any
            /// `case v4`
            case v4
            /// `case v6`
            case v6
        }

        private let lock = NSLock()
        private var _version: Version = .any

        /// `public var version: Network.NWProtocolIP.Options.Version { get set }` — "will constrain
        /// which address endpoints can be used, and will filter DNS results during connection
        /// establishment" (the overlay's documentation): a connection to a Bonjour service
        /// resolves to an address of this version only.
        public var version: Version {
            get { lock.withLock { _version } }
            set { lock.withLock { _version = newValue } }
        }

        override init() {
            super.init()
        }
    }
}

/// `final public class NWParameters : Swift.CustomDebugStringConvertible` (`Sendable` from iOS 17:
/// `extension Network.NWParameters : Swift.Sendable`)
public final class NWParameters: CustomDebugStringConvertible, @unchecked Sendable {
    /// `final public var defaultProtocolStack: Network.NWParameters.ProtocolStack { get }`
    public let defaultProtocolStack: ProtocolStack

    /// `public init()` — an empty protocol stack ("although it may start out empty", the overlay).
    public init() {
        defaultProtocolStack = ProtocolStack(internetProtocol: nil)
    }

    private init(defaultProtocolStack: ProtocolStack) {
        self.defaultProtocolStack = defaultProtocolStack
    }

    /// `final public class var tcp: Network.NWParameters { get }` — a new object on every call, as
    /// the overlay's `NWParameters(tls: nil)`; its stack has IP options.
    public class var tcp: NWParameters {
        NWParameters(defaultProtocolStack: ProtocolStack(internetProtocol: NWProtocolIP.Options()))
    }

    /// `final public var debugDescription: Swift.String { get }`
    public var debugDescription: String {
        "NWParameters(ip: \((defaultProtocolStack.internetProtocol as? NWProtocolIP.Options).map { "\($0.version)" } ?? "none"))"
    }

    /// `public class ProtocolStack` (`@unchecked Swift.Sendable` from iOS 17)
    public class ProtocolStack: @unchecked Sendable {
        private let ip: NWProtocolOptions?

        init(internetProtocol: NWProtocolOptions?) {
            ip = internetProtocol
        }

        /// `public var internetProtocol: Network.NWProtocolOptions? { get set }` — the stack's own
        /// options object, so that setting its `version` takes effect. The setter does nothing, as
        /// the overlay's ("Not currently allowed").
        public var internetProtocol: NWProtocolOptions? {
            get { ip }
            set {}
        }
    }
}

// MARK: - The local network (Stand-in only)

/// What the system knows, shared by the browsers and connections: the DNS-SD services on the local
/// network, what the app's Info.plist declares, what the user chose for Local Network, and the
/// browsers and connections running (the framework keeps a started object alive until it is
/// cancelled, as these references do).
///
/// Lock order: an object's own lock, then this one; never the other way round.
private struct StandInLocalNetwork {
    struct Key: Hashable {
        var name: String
        var type: String

        init(name: String, type: String) {
            self.name = name
            self.type = Self.normalized(type)
        }

        /// DNS names compare without case and without the final dot.
        static func normalized(_ name: String) -> String {
            (name.hasSuffix(".") ? String(name.dropLast()) : name).lowercased()
        }
    }

    var services: [Key: NWBrowser.StandInService] = [:]
    var bonjourServices: [String] = []
    var localNetwork = NWBrowser.StandInLocalNetworkPrivilege.allowed
    var browsers: [ObjectIdentifier: NWBrowser] = [:]
    var connections: [ObjectIdentifier: NWConnection] = [:]

    static let shared = StandInLockedBox(StandInLocalNetwork())

    /// The address a connection to `endpoint` reaches, and the interface it goes through; nil while
    /// nothing answers. A Bonjour service resolves to the first of its addresses that the IP version
    /// allows, IPv6 first when both are (RFC 8305's preference, which the Network framework follows),
    /// scoped to the interface it was found on.
    func resolve(_ endpoint: NWEndpoint, version: NWProtocolIP.Options.Version) -> (remote: NWEndpoint, interface: NWInterface?)? {
        switch endpoint {
        case .service(let name, let type, _, _):
            guard let service = services[Key(name: name, type: type)] else { return nil }
            let v4 = service.addresses.compactMap { IPv4Address($0)?.scoped(to: service.interface) }.map(NWEndpoint.Host.ipv4)
            let v6 = service.addresses.compactMap { IPv6Address($0)?.scoped(to: service.interface) }.map(NWEndpoint.Host.ipv6)
            let candidates: [NWEndpoint.Host] = switch version {
            case .v4: v4
            case .v6: v6
            case .any: v6 + v4
            }
            guard let host = candidates.first else { return nil }
            return (remote: .hostPort(host: host, port: NWEndpoint.Port(integerLiteral: service.port)), interface: service.interface)
        case .hostPort(let host, _):
            switch host {
            case .name:
                return nil  // no DNS here: a name never resolves
            case .ipv4:
                if version == .v6 { return nil }
                return (remote: endpoint, interface: host.interface)
            case .ipv6:
                if version == .v4 { return nil }
                return (remote: endpoint, interface: host.interface)
            }
        case .unix, .url:
            return nil
        }
    }
}

// MARK: - Browsing

/// `final public class NWBrowser : Swift.CustomDebugStringConvertible` (`Sendable` from iOS 17:
/// `extension Network.NWBrowser : Swift.Sendable`)
///
/// As browser.h says: results are delivered only while the browser is `.ready`; a DNS error fails
/// it for good (it must be cancelled and a new one made); cancelling is asynchronous and
/// `.cancelled` is the last thing its handler hears. Handlers run on the queue given to `start`,
/// and nothing happens before `start`. It browses the stand-in local network (`standInAnnounce`),
/// and applies iOS 14's rule: a service type missing from the app's `NSBonjourServices` fails the
/// browser with DNS-SD error -65555 (NoAuth); without the Local Network privilege it waits with
/// -65570 (PolicyDenied) — while the first-time prompt is up, and for good when the user says no —
/// and becomes `.ready` when the user allows it (TN3179).
public final class NWBrowser: CustomDebugStringConvertible, @unchecked Sendable {
    /// `public enum Descriptor : Swift.Sendable` (iOS 16's `case applicationService(name:)` is left out)
    public enum Descriptor: Sendable {
        /// `case bonjour(type: Swift.String, domain: Swift.String?)`
        case bonjour(type: String, domain: String?)
        /// `case bonjourWithTXTRecord(type: Swift.String, domain: Swift.String?)` — results carry
        /// the service's TXT record as their metadata.
        case bonjourWithTXTRecord(type: String, domain: String?)
    }

    /// `public struct Result : Swift.Hashable, Swift.Sendable`
    public struct Result: Hashable, Sendable {
        /// `public let endpoint: Network.NWEndpoint` — `.service(name:type:domain:interface:)`.
        public let endpoint: NWEndpoint
        /// `public let interfaces: [Network.NWInterface]`
        public let interfaces: [NWInterface]
        /// `public let metadata: Network.NWBrowser.Result.Metadata`
        public let metadata: Metadata

        /// `public enum Metadata : Swift.Equatable, Swift.CustomDebugStringConvertible, Swift.Sendable`
        public enum Metadata: Equatable, CustomDebugStringConvertible, Sendable {
            /// `case none`
            case none
            /// `case bonjour(_: Network.NWTXTRecord)`
            case bonjour(NWTXTRecord)

            /// `public var debugDescription: Swift.String { get }`
            public var debugDescription: String {
                switch self {
                case .none: "none"
                case .bonjour(let record): record.debugDescription
                }
            }
        }

        /// `public func hash(into hasher: inout Swift.Hasher)` — the metadata is `Equatable` only,
        /// so it is compared but not hashed.
        public func hash(into hasher: inout Hasher) {
            hasher.combine(endpoint)
            hasher.combine(interfaces)
        }

        /// `public static func == (lhs: Network.NWBrowser.Result, rhs: Network.NWBrowser.Result) -> Swift.Bool`
        public static func == (lhs: Result, rhs: Result) -> Bool {
            lhs.endpoint == rhs.endpoint && lhs.interfaces == rhs.interfaces && lhs.metadata == rhs.metadata
        }

        /// `public enum Change : Swift.Hashable, Swift.Sendable` (its `init(between:_:)` is left out)
        public enum Change: Hashable, Sendable {
            /// `case identical`
            case identical
            /// `case added(Network.NWBrowser.Result)`
            case added(Result)
            /// `case removed(Network.NWBrowser.Result)`
            case removed(Result)
            /// `case changed(old: Network.NWBrowser.Result, new: Network.NWBrowser.Result, flags: Network.NWBrowser.Result.Change.Flags)`
            case changed(old: Result, new: Result, flags: Flags)

            /// `public struct Flags : Swift.OptionSet, Swift.Hashable, Swift.Sendable` — the raw
            /// values are browse_result.h's `nw_browse_result_change_t` bits (the overlay's are not
            /// in the interface).
            public struct Flags: OptionSet, Hashable, Sendable {
                /// `public let rawValue: Swift.UInt8`
                public let rawValue: UInt8
                /// `public init(rawValue: Swift.UInt8)`
                public init(rawValue: UInt8) { self.rawValue = rawValue }
                /// `public static let identical: Network.NWBrowser.Result.Change.Flags`
                public static let identical = Flags(rawValue: 0x01)
                /// `public static let interfaceAdded: Network.NWBrowser.Result.Change.Flags`
                public static let interfaceAdded = Flags(rawValue: 0x08)
                /// `public static let interfaceRemoved: Network.NWBrowser.Result.Change.Flags`
                public static let interfaceRemoved = Flags(rawValue: 0x10)
                /// `public static let metadataChanged: Network.NWBrowser.Result.Change.Flags`
                public static let metadataChanged = Flags(rawValue: 0x20)
            }
        }
    }

    /// `public enum State : Swift.Equatable, Swift.Sendable`
    public enum State: Equatable, Sendable {
        /// `case setup`
        case setup
        /// `case ready`
        case ready
        /// `case failed(Network.NWError)`
        case failed(NWError)
        /// `case cancelled`
        case cancelled
        /// `case waiting(Network.NWError)` (iOS 14)
        case waiting(NWError)
    }

    /// `final public let descriptor: Network.NWBrowser.Descriptor`
    public let descriptor: Descriptor
    /// `final public let parameters: Network.NWParameters`
    public let parameters: NWParameters

    private let lock = NSLock()
    private var _state: State = .setup
    private var _results: [StandInLocalNetwork.Key: Result] = [:]
    private var _queue: DispatchQueue?
    private var _stateUpdateHandler: (@Sendable (State) -> Void)?
    private var _browseResultsChangedHandler: (@Sendable (Set<Result>, Set<Result.Change>) -> Void)?
    private var started = false

    /// `public init(for descriptor: Network.NWBrowser.Descriptor, using parameters: Network.NWParameters)`
    public init(for descriptor: Descriptor, using parameters: NWParameters) {
        self.descriptor = descriptor
        self.parameters = parameters
    }

    /// `final public var state: Network.NWBrowser.State { get }`
    public var state: State { lock.withLock { _state } }

    /// `final public var browseResults: Swift.Set<Network.NWBrowser.Result> { get }`
    public var browseResults: Set<Result> { lock.withLock { Set(_results.values) } }

    /// `final public var queue: Dispatch.DispatchQueue? { get }`
    public var queue: DispatchQueue? { lock.withLock { _queue } }

    /// `@preconcurrency final public var stateUpdateHandler: (@Sendable (_ newState: Network.NWBrowser.State) -> Swift.Void)? { get set }`
    public var stateUpdateHandler: (@Sendable (_ newState: State) -> Void)? {
        get { lock.withLock { _stateUpdateHandler } }
        set { lock.withLock { _stateUpdateHandler = newValue } }
    }

    /// `@preconcurrency final public var browseResultsChangedHandler: (@Sendable (_ newResults: Swift.Set<Network.NWBrowser.Result>, _ changes: Swift.Set<Network.NWBrowser.Result.Change>) -> Swift.Void)? { get set }`
    public var browseResultsChangedHandler: (@Sendable (_ newResults: Set<Result>, _ changes: Set<Result.Change>) -> Void)? {
        get { lock.withLock { _browseResultsChangedHandler } }
        set { lock.withLock { _browseResultsChangedHandler = newValue } }
    }

    /// `final public var debugDescription: Swift.String { get }`
    public var debugDescription: String { "NWBrowser(\(browsedType), \(lock.withLock { _state }))" }

    /// `final public func start(queue: Dispatch.DispatchQueue)` — once; later calls are ignored.
    public func start(queue: DispatchQueue) {
        lock.withLock {
            guard !started, _state == .setup else { return }
            started = true
            _queue = queue
            let me = ObjectIdentifier(self)
            let type = browsedType
            let (declared, allowed, visible) = StandInLocalNetwork.shared.withLock {
                (network: inout StandInLocalNetwork) -> (Bool, Bool, [StandInLocalNetwork.Key: StandInService]) in
                network.browsers[me] = self
                let declared = network.bonjourServices.contains {
                    StandInLocalNetwork.Key.normalized($0) == StandInLocalNetwork.Key.normalized(type)
                }
                return (declared, network.localNetwork == .allowed, network.services)
            }
            if !declared {
                setStateLocked(.failed(.dns(DNSServiceError.noAuth)))
            } else if !allowed {
                setStateLocked(.waiting(.dns(DNSServiceError.policyDenied)))
            } else {
                becomeReadyLocked(seeing: visible)
            }
        }
    }

    private func becomeReadyLocked(seeing services: [StandInLocalNetwork.Key: StandInService]) {
        setStateLocked(.ready)
        var changes: Set<Result.Change> = []
        for (key, service) in services {
            if let change = changeLocked(key, to: service) { changes.insert(change) }
        }
        deliverLocked(changes)
    }

    /// The app was given the Local Network privilege: a browser waiting for it becomes ready and
    /// reports what it sees.
    fileprivate func standInAllowed() {
        lock.withLock {
            guard _state == .waiting(.dns(DNSServiceError.policyDenied)) else { return }
            becomeReadyLocked(seeing: StandInLocalNetwork.shared.withLock { $0.services })
        }
    }

    /// `final public func cancel()` — asynchronous: `.cancelled` is the last state the handler
    /// gets, and the handlers are released after it. Later calls are ignored.
    public func cancel() {
        let wasLive = lock.withLock { () -> Bool in
            guard _state != .cancelled else { return false }
            setStateLocked(.cancelled)
            _stateUpdateHandler = nil
            _browseResultsChangedHandler = nil
            return true
        }
        if wasLive {
            let me = ObjectIdentifier(self)
            StandInLocalNetwork.shared.withLock { _ = $0.browsers.removeValue(forKey: me) }
        }
    }

    private var browsedType: String {
        switch descriptor {
        case .bonjour(let type, _), .bonjourWithTXTRecord(let type, _): type
        }
    }

    private var browsedDomain: String? {
        switch descriptor {
        case .bonjour(_, let domain), .bonjourWithTXTRecord(_, let domain): domain
        }
    }

    private func setStateLocked(_ state: State) {
        _state = state
        if let handler = _stateUpdateHandler, let queue = _queue {
            queue.async { handler(state) }
        }
    }

    /// What this browser sees of `service` (nil: gone), and how its result changed.
    private func changeLocked(_ key: StandInLocalNetwork.Key, to service: StandInService?) -> Result.Change? {
        let old = _results[key]
        let new = service.flatMap(result(for:))
        _results[key] = new
        switch (old, new) {
        case (nil, nil):
            return nil
        case (nil, let new?):
            return .added(new)
        case (let old?, nil):
            return .removed(old)
        case (let old?, let new?):
            guard old != new else { return nil }
            var flags: Result.Change.Flags = []
            if old.metadata != new.metadata { flags.insert(.metadataChanged) }
            if !Set(new.interfaces).isSubset(of: old.interfaces) { flags.insert(.interfaceAdded) }
            if !Set(old.interfaces).isSubset(of: new.interfaces) { flags.insert(.interfaceRemoved) }
            return .changed(old: old, new: new, flags: flags)
        }
    }

    private func result(for service: StandInService) -> Result? {
        guard StandInLocalNetwork.Key.normalized(service.type) == StandInLocalNetwork.Key.normalized(browsedType),
              browsedDomain.map({ StandInLocalNetwork.Key.normalized($0) == StandInLocalNetwork.Key.normalized(service.domain) }) ?? true
        else { return nil }
        let metadata: Result.Metadata
        switch descriptor {
        case .bonjour: metadata = .none
        case .bonjourWithTXTRecord: metadata = .bonjour(NWTXTRecord(service.txt))
        }
        return Result(endpoint: .service(name: service.name, type: service.type, domain: service.domain, interface: nil),
                      interfaces: [service.interface], metadata: metadata)
    }

    private func deliverLocked(_ changes: Set<Result.Change>) {
        guard !changes.isEmpty, let handler = _browseResultsChangedHandler, let queue = _queue else { return }
        let results = Set(_results.values)
        queue.async { handler(results, changes) }
    }

    /// The network's record for `key` changed: a ready browser reports it.
    fileprivate func standInSee(_ key: StandInLocalNetwork.Key) {
        lock.withLock {
            guard _state == .ready else { return }
            let service = StandInLocalNetwork.shared.withLock { $0.services[key] }
            if let change = changeLocked(key, to: service) { deliverLocked([change]) }
        }
    }

    // MARK: Stand-in only

    /// A DNS-SD service instance on the local network: what its PTR, SRV, TXT and A/AAAA records say.
    public struct StandInService: Hashable, Sendable {
        public var name: String
        public var type: String
        public var domain: String
        public var txt: [String: String]
        /// What its host's A and AAAA records give, as literals (`192.168.1.20`, `fe80::1`); empty
        /// for a host that does not answer.
        public var addresses: [String]
        public var port: UInt16
        /// The interface it is seen on; a resolved address is scoped to it.
        public var interface: NWInterface

        public init(name: String, type: String, domain: String = "local.", txt: [String: String], addresses: [String], port: UInt16,
                    interface: NWInterface = NWInterface(standInType: .wifi, name: "en0")) {
            self.name = name
            self.type = type
            self.domain = domain
            self.txt = txt
            self.addresses = addresses
            self.port = port
            self.interface = interface
        }
    }

    /// A service appears on the network, or its records change: ready browsers of its type report
    /// it (`.added`, or `.changed` with the flags), and connections to it that were waiting for an
    /// answer resolve.
    public static func standInAnnounce(_ service: StandInService) {
        let key = StandInLocalNetwork.Key(name: service.name, type: service.type)
        let (browsers, connections) = StandInLocalNetwork.shared.withLock {
            (network: inout StandInLocalNetwork) -> ([NWBrowser], [NWConnection]) in
            network.services[key] = service
            return (Array(network.browsers.values), Array(network.connections.values))
        }
        for browser in browsers { browser.standInSee(key) }
        for connection in connections { connection.standInRetry() }
    }

    /// The service leaves (its goodbye packets): ready browsers report it `.removed`.
    public static func standInWithdraw(name: String, type: String) {
        let key = StandInLocalNetwork.Key(name: name, type: type)
        let browsers = StandInLocalNetwork.shared.withLock { (network: inout StandInLocalNetwork) -> [NWBrowser] in
            network.services[key] = nil
            return Array(network.browsers.values)
        }
        for browser in browsers { browser.standInSee(key) }
    }

    /// The app's Info.plist `NSBonjourServices`: the service types it may browse for. Empty by
    /// default, as in an app that declares none.
    public static var standInBonjourServices: [String] {
        get { StandInLocalNetwork.shared.withLock { $0.bonjourServices } }
        set { StandInLocalNetwork.shared.withLock { $0.bonjourServices = newValue } }
    }

    /// The app's Local Network privilege (TN3179): undetermined until the user answers the prompt
    /// the first local network access brings up, then allowed or denied (Settings › Privacy &
    /// Security › Local Network changes it later).
    public enum StandInLocalNetworkPrivilege: Sendable {
        case undetermined, allowed, denied
    }

    /// The user decides: answers the Local Network prompt, or changes the switch in Settings.
    /// Browsers without the privilege wait with -65570 (PolicyDenied), whether the prompt is up or
    /// the user said no; allowing it readies those waiting. (Taking it away affects browsers
    /// started afterwards only.)
    public static func standInSetLocalNetwork(_ privilege: StandInLocalNetworkPrivilege) {
        let browsers = StandInLocalNetwork.shared.withLock { (network: inout StandInLocalNetwork) -> [NWBrowser] in
            network.localNetwork = privilege
            return privilege == .allowed ? Array(network.browsers.values) : []
        }
        for browser in browsers { browser.standInAllowed() }
    }

    /// How many browsers were started and not yet cancelled (a failed browser counts until it is).
    public static var standInBrowsing: Int {
        StandInLocalNetwork.shared.withLock { $0.browsers.count }
    }

    /// A fresh network: no services, no `NSBonjourServices`, Local Network allowed, and the
    /// browsers and connections of earlier tests forgotten (not cancelled).
    public static func standInReset() {
        StandInLocalNetwork.shared.withLock { $0 = StandInLocalNetwork() }
    }
}

// MARK: - Connections

/// `final public class NWConnection : Swift.CustomDebugStringConvertible` (`Sendable` from iOS 17:
/// `extension Network.NWConnection : Swift.Sendable`)
///
/// Only establishment is modelled: `start` moves it to `.preparing`, and it becomes `.ready` once the
/// endpoint resolves to an address the parameters' IP version allows (a Bonjour service resolves
/// against the stand-in local network, `NWBrowser.standInAnnounce`); until then it stays
/// `.preparing`, as a real one does while nothing answers. Every address accepts the connection; no
/// data flows. Handlers run on the queue given to `start`; `cancel` is asynchronous and `.cancelled`
/// is the last state delivered.
public final class NWConnection: CustomDebugStringConvertible, @unchecked Sendable {
    /// `public enum State : Swift.Equatable, Swift.Sendable`
    public enum State: Equatable, Sendable {
        /// `case setup`
        case setup
        /// `case waiting(Network.NWError)`
        case waiting(NWError)
        /// `case preparing`
        case preparing
        /// `case ready`
        case ready
        /// `case failed(Network.NWError)`
        case failed(NWError)
        /// `case cancelled`
        case cancelled
    }

    /// `final public let endpoint: Network.NWEndpoint`
    public let endpoint: NWEndpoint
    /// `final public let parameters: Network.NWParameters`
    public let parameters: NWParameters

    private let lock = NSLock()
    private var _state: State = .setup
    private var _path: NWPath?
    private var _queue: DispatchQueue?
    private var _stateUpdateHandler: (@Sendable (State) -> Void)?
    private var started = false

    /// `public init(to: Network.NWEndpoint, using: Network.NWParameters)`
    public init(to: NWEndpoint, using: NWParameters) {
        endpoint = to
        parameters = using
    }

    /// `final public var state: Network.NWConnection.State { get }`
    public var state: State { lock.withLock { _state } }

    /// `@preconcurrency final public var stateUpdateHandler: (@Sendable (_ state: Network.NWConnection.State) -> Swift.Void)? { get set }`
    public var stateUpdateHandler: (@Sendable (_ state: State) -> Void)? {
        get { lock.withLock { _stateUpdateHandler } }
        set { lock.withLock { _stateUpdateHandler = newValue } }
    }

    /// `final public var currentPath: Network.NWPath? { get }` — nil before the connection has a
    /// path and after it is cancelled (`nw_connection_copy_current_path`, connection.h); once
    /// `.ready`, its `remoteEndpoint` is the address reached.
    public var currentPath: NWPath? { lock.withLock { _path } }

    /// `final public var queue: Dispatch.DispatchQueue? { get }`
    public var queue: DispatchQueue? { lock.withLock { _queue } }

    /// `final public var debugDescription: Swift.String { get }`
    public var debugDescription: String { "NWConnection(\(endpoint.debugDescription), \(lock.withLock { _state }))" }

    /// `final public func start(queue: Dispatch.DispatchQueue)` — once; later calls are ignored.
    public func start(queue: DispatchQueue) {
        lock.withLock {
            guard !started, _state == .setup else { return }
            started = true
            _queue = queue
            let me = ObjectIdentifier(self)
            StandInLocalNetwork.shared.withLock { $0.connections[me] = self }
            setStateLocked(.preparing)
            connectLocked()
        }
    }

    /// `final public func cancel()` — asynchronous: `.cancelled` is the last state the handler
    /// gets, and the handler is released after it. Later calls are ignored.
    public func cancel() {
        let wasLive = lock.withLock { () -> Bool in
            guard _state != .cancelled else { return false }
            _path = nil
            setStateLocked(.cancelled)
            _stateUpdateHandler = nil
            return true
        }
        if wasLive {
            let me = ObjectIdentifier(self)
            StandInLocalNetwork.shared.withLock { _ = $0.connections.removeValue(forKey: me) }
        }
    }

    private func setStateLocked(_ state: State) {
        _state = state
        if let handler = _stateUpdateHandler, let queue = _queue {
            queue.async { handler(state) }
        }
    }

    private func connectLocked() {
        let version = (parameters.defaultProtocolStack.internetProtocol as? NWProtocolIP.Options)?.version ?? .any
        let target = self.endpoint
        guard let resolved = StandInLocalNetwork.shared.withLock({ $0.resolve(target, version: version) }) else {
            return  // nothing answers (yet): stays .preparing
        }
        _path = NWPath(standInStatus: .satisfied, interfaces: resolved.interface.map { [$0] } ?? [], remoteEndpoint: resolved.remote)
        setStateLocked(.ready)
    }

    /// The network changed: a connection still preparing tries again.
    fileprivate func standInRetry() {
        lock.withLock {
            if _state == .preparing { connectLocked() }
        }
    }

    // MARK: Stand-in only

    /// How many connections were started and not yet cancelled.
    public static var standInOpen: Int {
        StandInLocalNetwork.shared.withLock { $0.connections.count }
    }
}
