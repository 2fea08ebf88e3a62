// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import Foundation
#if os(Linux)
import NetworkStandIn  // see docs/apple-stand-ins.md: a module named Network would confuse SwiftNIO
#else
import Network
#endif
import ParleyKit

/// Finds the devices listening for calls on the local network: ParleyKit's ``LANDiscovery`` over
/// the Network framework's `NWBrowser`, browsing `_parley._tcp` (``LANService/type``) with TXT
/// records. What a record means — its layout, which ones are Parley listeners — is
/// ``LANService``'s; this type only browses and resolves.
///
/// **The app must declare the service and the Local Network use.** Since iOS 14 browsing Bonjour
/// is local network access, behind the Local Network permission. The app's Info.plist must list
/// `_parley._tcp` under `NSBonjourServices` and give `NSLocalNetworkUsageDescription` (the sentence
/// the permission prompt shows): without the service type the system refuses the browse — the
/// browser fails with DNS-SD error -65555 (`kDNSServiceErr_NoAuth`) — and the stream finishes with
/// ``BonjourDiscoveryError/serviceTypeNotDeclared``.
///
/// **The Local Network permission.** Without it the browser waits with -65570
/// (`kDNSServiceErr_PolicyDenied`): while the first-time prompt is up, and for good if the user
/// says no. iOS does not tell the two apart, so that wait is not a refusal: the browse goes on, and
/// runs when the user allows it, in the prompt or later in Settings (TN3179, "Understanding local
/// network privacy"). ``browseWithPermission()`` says so to the UI
/// (``BonjourBrowseEvent/waitingForLocalNetworkPermission``); ``browse()`` just waits.
///
/// **Resolving.** A browse result names a service; it has no address. The Network framework
/// resolves a service only for a connection to it, so each listener is resolved the usual iOS way:
/// a TCP connection to the service endpoint, whose `currentPath.remoteEndpoint` is the address once
/// it is `.ready`; the connection is cancelled then, or after ``resolveTimeout`` if the listener
/// does not answer or the connection fails (the listener is then left out until its record
/// changes). The connection asks for IPv4 only: on a home network a peer is often reached first
/// over its link-local IPv6 address (fe80::/10), which means nothing without its interface scope,
/// and the listener's URL (``LANListener/url``) cannot carry one. The address is passed on without the scope the framework
/// attaches to it (`192.168.1.20%en0` becomes `192.168.1.20`).
///
/// **Listening.** An iPhone finds LAN listeners and calls them; it does not listen:
/// ``advertise(instance:port:txt:lost:)`` throws.
public final class BonjourDiscovery: LANDiscovery {
    /// How long a listener's address may take to resolve before the listener is left out.
    public let resolveTimeout: Duration

    public init(resolveTimeout: Duration = .seconds(5)) {
        self.resolveTimeout = resolveTimeout
    }

    /// Always throws ``BonjourDiscoveryError/listeningUnsupported``: listening for LAN calls means
    /// running the call part of protocol v1 — the call hub `parley listen --lan` runs for itself —
    /// inside the app, and that is not built for the iPhone. An iPhone finds LAN listeners with
    /// ``browse()`` and calls them.
    public func advertise(instance: String, port: Int, txt: [String: String],
                          lost: @escaping @Sendable (any Error) -> Void) async throws -> any LANAdvertisement {
        throw BonjourDiscoveryError.listeningUnsupported
    }

    /// Parley listeners as they appear (resolved to an IPv4 address) and leave. The browse stops —
    /// browser and resolving connections cancelled — when the consumer stops iterating; the stream
    /// fails with a ``BonjourDiscoveryError`` when the system refuses the browse.
    public func browse() -> AsyncThrowingStream<LANDiscoveryEvent, any Error> {
        run { event in
            if case .discovery(let discovery) = event { discovery } else { nil }
        }
    }

    /// ``browse()``, with what the UI should say meanwhile: whether the browse waits for the Local
    /// Network permission or runs.
    public func browseWithPermission() -> AsyncThrowingStream<BonjourBrowseEvent, any Error> {
        run { $0 }
    }

    private func run<Element: Sendable>(_ pick: @escaping @Sendable (BonjourBrowseEvent) -> Element?)
        -> AsyncThrowingStream<Element, any Error> {
        let (stream, continuation) = AsyncThrowingStream<Element, any Error>.makeStream()
        let browse = BonjourBrowse(resolveTimeout: resolveTimeout,
                                   report: { event in if let element = pick(event) { continuation.yield(element) } },
                                   fail: { continuation.finish(throwing: $0) })
        continuation.onTermination = { _ in browse.stop() }
        browse.start()
        return stream
    }
}

/// What ``BonjourDiscovery/browseWithPermission()`` reports.
public enum BonjourBrowseEvent: Hashable, Sendable, CustomStringConvertible {
    /// A listener came or went.
    case discovery(LANDiscoveryEvent)
    /// iOS holds the browse until the app has the Local Network permission: its prompt is up, or
    /// the user said no (iOS does not say which). The browse runs once the user allows it.
    case waitingForLocalNetworkPermission
    /// The browse runs: listeners come as ``discovery(_:)``.
    case browsing

    public var description: String {
        switch self {
        case .discovery(let event): "\(event)"
        case .waitingForLocalNetworkPermission:
            "Waiting for Local Network permission to look for LAN listeners. "
                + "If you said no, turn it on in Settings › Privacy & Security › Local Network."
        case .browsing: "Looking for LAN listeners."
        }
    }
}

/// Why ``BonjourDiscovery`` stopped browsing, or refused to listen.
public enum BonjourDiscoveryError: Error, Equatable, CustomStringConvertible {
    /// The browser failed with DNS-SD error -65555 (NoAuth): the app's Info.plist does not list
    /// `_parley._tcp` under `NSBonjourServices`.
    case serviceTypeNotDeclared
    /// The browser failed otherwise; the system's error, as it describes itself.
    case browserFailed(String)
    /// ``BonjourDiscovery/advertise(instance:port:txt:lost:)``: an iPhone does not listen for LAN calls.
    case listeningUnsupported

    public var description: String {
        switch self {
        case .serviceTypeNotDeclared:
            "Cannot look for LAN listeners: iOS refused to browse for \(LANService.type) (DNS-SD error -65555, NoAuth). "
                + "Since iOS 14 an app must declare the Bonjour services it browses for: list \(LANService.type) under "
                + "NSBonjourServices in the app's Info.plist, and give NSLocalNetworkUsageDescription for the Local Network prompt."
        case .browserFailed(let error):
            "Cannot look for LAN listeners: browsing for \(LANService.type) failed (\(error))."
        case .listeningUnsupported:
            "An iPhone cannot listen for LAN calls: that needs the call hub running inside the app, which is not built. "
                + "An iPhone finds LAN listeners and calls them."
        }
    }

    /// `kDNSServiceErr_NoAuth` (dns_sd.h): what the browse gets for a service type missing from
    /// `NSBonjourServices`.
    static let noAuth: Int32 = -65555
    /// `kDNSServiceErr_PolicyDenied` (dns_sd.h): the app does not have the Local Network permission (yet).
    static let policyDenied: Int32 = -65570

    /// What a failed browser's error means for the user.
    static func browserFailure(_ error: NWError) -> BonjourDiscoveryError {
        error == .dns(noAuth) ? .serviceTypeNotDeclared : .browserFailed(error.debugDescription)
    }
}

/// One browse: its browser, the resolutions under way and the listeners reported. Everything runs
/// on `queue`, where the Network framework calls back, so the state needs no lock; `stop()` may come
/// from anywhere and hops there too.
private final class BonjourBrowse: @unchecked Sendable {
    private let report: @Sendable (BonjourBrowseEvent) -> Void
    private let fail: @Sendable (any Error) -> Void
    private let resolveTimeout: Duration
    private let queue = DispatchQueue(label: "net.parley.bonjour")

    // Only on `queue`:
    private var browser: NWBrowser?
    /// The connection resolving each instance, and which attempt it is (a record that changes
    /// starts a new one; the old one's late callbacks are ignored).
    private var resolving: [String: (connection: NWConnection, attempt: UUID)] = [:]
    /// The instances reported `.found`, so that only those are reported `.lost`.
    private var reported: Set<String> = []
    private var stopped = false

    init(resolveTimeout: Duration, report: @escaping @Sendable (BonjourBrowseEvent) -> Void,
         fail: @escaping @Sendable (any Error) -> Void) {
        self.resolveTimeout = resolveTimeout
        self.report = report
        self.fail = fail
    }

    func start() {
        queue.async { [self] in
            guard !stopped else { return }
            let browser = NWBrowser(for: .bonjourWithTXTRecord(type: LANService.type, domain: nil), using: NWParameters())
            browser.stateUpdateHandler = { [weak self] state in self?.browserChanged(to: state) }
            browser.browseResultsChangedHandler = { [weak self] _, changes in self?.results(changed: changes) }
            self.browser = browser
            browser.start(queue: queue)
        }
    }

    /// The consumer is gone or the stream has finished: cancel everything under way.
    func stop() {
        queue.async { [self] in
            stopped = true
            browser?.cancel()
            browser = nil
            for resolution in resolving.values { resolution.connection.cancel() }
            resolving = [:]
        }
    }

    private func browserChanged(to state: NWBrowser.State) {
        guard !stopped else { return }
        if case .failed(let error) = state {
            // Finishing runs `onTermination`, which stops the browse (a failed browser must still be cancelled).
            fail(BonjourDiscoveryError.browserFailure(error))
        } else if case .waiting(let error) = state, error == .dns(BonjourDiscoveryError.policyDenied) {
            // The prompt may still be up: not a refusal. The browser becomes ready when the user allows.
            report(.waitingForLocalNetworkPermission)
        } else if state == .ready {
            report(.browsing)
        }
        // Other waits (no network yet) end by themselves: the browser becomes ready when it can.
    }

    private func results(changed changes: Set<NWBrowser.Result.Change>) {
        guard !stopped else { return }
        // Departures first: a batch is a set, with no order, and may hold one listener's departure
        // beside another's arrival.
        for change in changes {
            if case .removed(let result) = change { remove(result) }
        }
        for change in changes {
            if case .added(let result) = change {
                resolve(result)
            } else if case .changed(old: _, new: let result, flags: _) = change {
                resolve(result)  // a new TXT record, or another interface: resolve again
            }
        }
    }

    private func resolve(_ result: NWBrowser.Result) {
        guard case .service(name: let instance, type: _, domain: _, interface: _) = result.endpoint,
              case .bonjour(let record) = result.metadata else { return }
        let txt = record.dictionary
        finishResolving(instance)
        let parameters = NWParameters.tcp
        // IPv4 only (see BonjourDiscovery): the resolved address must make sense without a scope.
        if let ip = parameters.defaultProtocolStack.internetProtocol as? NWProtocolIP.Options {
            ip.version = .v4
        }
        let connection = NWConnection(to: result.endpoint, using: parameters)
        let attempt = UUID()
        resolving[instance] = (connection, attempt)
        connection.stateUpdateHandler = { [weak self] state in
            self?.resolution(of: instance, attempt: attempt, changedTo: state, txt: txt)
        }
        connection.start(queue: queue)
        queue.asyncAfter(deadline: .now() + Self.interval(resolveTimeout)) { [weak self] in
            self?.giveUp(on: instance, attempt: attempt)
        }
    }

    private func resolution(of instance: String, attempt: UUID, changedTo state: NWConnection.State, txt: [String: String]) {
        guard let current = resolving[instance], current.attempt == attempt else { return }
        if state == .ready {
            let remote = current.connection.currentPath?.remoteEndpoint
            finishResolving(instance)
            guard !stopped, case .hostPort(host: let host, port: let port)? = remote, let address = Self.literal(host) else { return }
            if let listener = LANService.listener(instance: instance, host: address, port: Int(port.rawValue), txt: txt) {
                reported.insert(instance)
                report(.discovery(.found(listener)))
            } else if reported.remove(instance) != nil {
                // Its record changed into one that is not a Parley listener's (another version): it is gone for us.
                report(.discovery(.lost(instance: instance)))
            }
        } else if case .failed = state {
            finishResolving(instance)
        }
        // `.waiting` (refused, no route yet, the Local Network prompt still up) may pass: the
        // connection retries by itself, and the timeout ends the attempt if it does not.
    }

    private func giveUp(on instance: String, attempt: UUID) {
        guard resolving[instance]?.attempt == attempt else { return }
        finishResolving(instance)
    }

    private func finishResolving(_ instance: String) {
        resolving.removeValue(forKey: instance)?.connection.cancel()
    }

    private func remove(_ result: NWBrowser.Result) {
        guard case .service(name: let instance, type: _, domain: _, interface: _) = result.endpoint else { return }
        finishResolving(instance)
        if reported.remove(instance) != nil {
            report(.discovery(.lost(instance: instance)))
        }
    }

    /// The IP literal ``LANListener`` wants: an IPv4 address from its four bytes, without the
    /// interface scope the framework attaches to a resolved address (its `debugDescription` reads
    /// `192.168.1.20%en0`). A global or unique-local IPv6 address needs no scope and keeps none; a
    /// link-local one is useless without it, and a name was not resolved: nil.
    static func literal(_ host: NWEndpoint.Host) -> String? {
        if case .ipv4(let address) = host {
            let bytes = [UInt8](address.rawValue)
            return bytes.count == 4 ? bytes.map { String($0) }.joined(separator: ".") : nil
        }
        if case .ipv6(let address) = host, !address.isLinkLocal {
            return String(address.debugDescription.prefix { $0 != "%" })
        }
        return nil
    }

    private static func interval(_ duration: Duration) -> DispatchTimeInterval {
        let (seconds, attoseconds) = duration.components
        return .nanoseconds(Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000))
    }
}
#endif
