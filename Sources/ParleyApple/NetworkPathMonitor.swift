// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
#if os(Linux)
import NetworkStandIn  // see docs/apple-stand-ins.md: a module named Network would confuse SwiftNIO
#else
import Network
#endif
import ParleyKit

/// Tells the calls when the device's network changes (Wi-Fi to cellular and back, lost and found),
/// so signaling reconnects and media restarts ICE at once instead of waiting for a timeout.
public final class NetworkPathMonitor: @unchecked Sendable {
    private let monitor = NWPathMonitor()
    private let queue = DispatchQueue(label: "net.parley.network")
    private let lock = NSLock()
    private var last: PathSummary?
    private let changed: @Sendable () async -> Void

    /// The parts of a path whose change means new addresses: whether it is usable, and through what.
    struct PathSummary: Equatable {
        var usable: Bool
        var interfaces: [String]

        init(_ path: NWPath) {
            usable = path.status == .satisfied
            interfaces = path.availableInterfaces.map(\.name)
        }
    }

    /// - Parameter changed: called on every change after the first path (`CallManager.networkChanged`).
    public init(changed: @escaping @Sendable () async -> Void) {
        self.changed = changed
    }

    public convenience init<C: Clock>(calls: CallManager<C>) where C.Duration == Duration {
        self.init { await calls.networkChanged() }
    }

    public func start() {
        monitor.pathUpdateHandler = { [weak self] path in self?.update(PathSummary(path)) }
        monitor.start(queue: queue)
    }

    public func stop() { monitor.cancel() }

    private func update(_ summary: PathSummary) {
        let isChange = lock.withLock { () -> Bool in
            defer { last = summary }
            guard let last else { return false }  // the first path is where we start, not a change
            return last != summary && summary.usable
        }
        guard isChange else { return }
        let changed = self.changed
        Task { await changed() }
    }
}
#endif
