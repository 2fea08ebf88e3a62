// Stand-in for Apple's Network framework on Linux, as module `NetworkStandIn`: a module named
// `Network` would make `canImport(Network)` true for every package in the build, and SwiftNIO and
// Hummingbird take that to mean an Apple platform. Only what ParleyApple uses of `NWPathMonitor`,
// transcribed from the iOS SDK's Swift interface (checked against iOS 16.5's, theos/sdks@4af4cb1d) (Network.framework/Modules/
// Network.swiftmodule/arm64-apple-ios.swiftinterface; Network has no Objective-C header for these
// Swift types). Apple platforms use the real framework. Hooks for tests are marked "Stand-in only".

import Foundation
import StandInSupport

/// `public struct NWInterface : Hashable, CustomDebugStringConvertible`
public struct NWInterface: Hashable, Sendable {
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

    /// `public func usesInterfaceType(_ type: NWInterface.InterfaceType) -> Bool`
    public func usesInterfaceType(_ type: NWInterface.InterfaceType) -> Bool {
        availableInterfaces.first?.type == type
    }

    /// Stand-in only.
    public init(standInStatus status: Status, interfaces: [NWInterface], isExpensive: Bool = false, isConstrained: Bool = false) {
        self.status = status
        self.availableInterfaces = interfaces
        self.isExpensive = isExpensive
        self.isConstrained = isConstrained
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
