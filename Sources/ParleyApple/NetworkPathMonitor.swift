// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
#if os(Linux)
import NetworkStandIn  // see docs/apple-stand-ins.md: a module named Network would confuse SwiftNIO
#else
import Network
#endif
import ParleyKit

/// Says when the device's network changes (Wi-Fi to cellular and back, lost and found), so that
/// signaling reconnects and media restarts ICE at once instead of waiting for a timeout: its owner
/// hands each of `changes` to `CallManager.networkChanged` (`ParleyPhone` does).
public final class NetworkPathMonitor: @unchecked Sendable {
    /// Every change that matters after the first path: the path usable again, another interface,
    /// or IPv4 or IPv6 gained or lost. Changes its reader has not taken yet count as one.
    public let changes: AsyncStream<Void>
    private let changed: AsyncStream<Void>.Continuation
    private let monitor = NWPathMonitor()
    private let queue = DispatchQueue(label: "net.parley.network")
    private let lock = NSLock()
    private var last: PathSummary?

    /// The parts of a path whose change means new addresses: whether it is usable, the interface it
    /// sends through — the first of `availableInterfaces`, which lists them in the system's order
    /// of preference — and the IP versions it has. Other interfaces coming and going (cellular
    /// beside Wi-Fi, a VPN's tunnel that carries nothing) leave the call's addresses as they were.
    struct PathSummary: Equatable {
        var usable: Bool
        var interface: NWInterface?
        var ipv4: Bool
        var ipv6: Bool

        init(_ path: NWPath) {
            usable = path.status == .satisfied
            interface = path.availableInterfaces.first
            ipv4 = path.supportsIPv4
            ipv6 = path.supportsIPv6
        }
    }

    public init() {
        (changes, changed) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    public func start() {
        monitor.pathUpdateHandler = { [weak self] path in self?.update(PathSummary(path)) }
        monitor.start(queue: queue)
    }

    /// Stops watching; `changes` ends.
    public func stop() {
        monitor.cancel()
        changed.finish()
    }

    private func update(_ summary: PathSummary) {
        let isChange = lock.withLock { () -> Bool in
            defer { last = summary }
            guard let last else { return false }  // the first path is where we start, not a change
            return last != summary && summary.usable
        }
        if isChange { changed.yield() }
    }
}
#endif
