import CAvahi
import Foundation
import ParleyKit

/// Why DNS-SD through Avahi failed, in words for the person at the keyboard.
public struct AvahiError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }

    init(_ what: String, code: Int32) {
        self.init("\(what): \(String(cString: avahi_strerror(code)))")
    }
}

/// LAN discovery on Linux: DNS-SD over multicast DNS through the system's Avahi daemon (its client
/// library, over D-Bus). One client on its own event thread serves every advertisement and browse.
///
/// Avahi calls its callbacks on that thread with the poll's lock held; every call into Avahi from
/// elsewhere takes the same lock (`locked`), as `avahi_threaded_poll_lock` asks, and nothing that
/// runs on Avahi's thread takes it again.
///
/// IPv4 only: listeners serve on IPv4 (`0.0.0.0`), and an IPv6 link-local address resolved
/// without its interface would be no use to a caller.
public final class AvahiDiscovery: LANDiscovery, @unchecked Sendable {
    private let poll: OpaquePointer
    private var client: OpaquePointer?
    private var started = false
    /// Callback contexts, kept alive while Avahi may call them.
    private var browses: [ObjectIdentifier: Browse] = [:]
    private var advertisements: [ObjectIdentifier: Advertisement] = [:]
    private var failure: AvahiError?

    /// Connects to the Avahi daemon; throws when it is not running or cannot be reached.
    public init() throws {
        guard let poll = avahi_threaded_poll_new() else { throw AvahiError("cannot start Avahi's event thread") }
        self.poll = poll
        // From here on a throw runs deinit, which frees what was made: nothing is freed here.
        var code: Int32 = 0
        let context = Unmanaged.passUnretained(self).toOpaque()
        client = avahi_client_new(avahi_threaded_poll_get(poll), AvahiClientFlags(0), { _, state, context in
            guard let context, state == AVAHI_CLIENT_FAILURE else { return }
            Unmanaged<AvahiDiscovery>.fromOpaque(context).takeUnretainedValue().clientFailed()
        }, context, &code)
        guard client != nil else {
            if code == Int32(AVAHI_ERR_NO_DAEMON) {
                throw AvahiError("the Avahi daemon is not running: LAN discovery needs avahi-daemon (Debian: apt-get install avahi-daemon)")
            }
            throw AvahiError("cannot connect to the Avahi daemon", code: code)
        }
        guard avahi_threaded_poll_start(poll) == 0 else { throw AvahiError("cannot start Avahi's event thread") }
        started = true
    }

    deinit {
        if started { avahi_threaded_poll_stop(poll) }
        let closed = AvahiError("the LAN discovery was closed")
        for browse in browses.values { browse.finish(throwing: closed) }
        for advertisement in advertisements.values { advertisement.settle(.failure(closed)) }
        // Frees every entry group, browser and resolver of the client too, withdrawing what was advertised.
        if let client { avahi_client_free(client) }
        avahi_threaded_poll_free(poll)
    }

    fileprivate func locked<T>(_ body: () throws -> T) rethrows -> T {
        avahi_threaded_poll_lock(poll)
        defer { avahi_threaded_poll_unlock(poll) }
        return try body()
    }

    /// On Avahi's thread: the daemon went away (stopped, restarted). Every browse ends with an
    /// error and every advertisement says it is lost.
    private func clientFailed() {
        let code = client.map { avahi_client_errno($0) } ?? Int32(AVAHI_ERR_DISCONNECTED)
        let error = AvahiError("the Avahi daemon went away", code: code)
        failure = error
        for browse in browses.values { browse.finish(throwing: error) }
        for advertisement in advertisements.values { advertisement.lost(error) }
    }

    // MARK: Advertising

    public func advertise(instance: String, port: Int, txt: [String: String],
                          lost: @escaping @Sendable (any Error) -> Void) async throws -> any LANAdvertisement {
        guard (1...65535).contains(port) else { throw AvahiError("cannot advertise port \(port)") }
        let advertisement = Advertisement(owner: self, instance: LANService.instanceName(instance), port: UInt16(port), txt: txt,
                                          lost: lost)
        try locked {
            if let failure { throw failure }
            advertisements[ObjectIdentifier(advertisement)] = advertisement
            do {
                try advertisement.register(client: client)
            } catch {
                advertisement.free()
                advertisements[ObjectIdentifier(advertisement)] = nil
                throw error
            }
        }
        do {
            try await advertisement.established()
        } catch {
            await advertisement.stop()
            throw error
        }
        return advertisement
    }

    fileprivate func withdraw(_ advertisement: Advertisement) {
        locked {
            advertisement.free()
            advertisements[ObjectIdentifier(advertisement)] = nil
        }
    }

    /// One service registration: an entry group, renamed on a name conflict as Avahi suggests.
    final class Advertisement: LANAdvertisement, @unchecked Sendable {
        private weak var owner: AvahiDiscovery?
        /// Changed only on Avahi's thread or under its lock.
        private var name: String
        private let port: UInt16
        private let txt: [String: String]
        private let onLost: @Sendable (any Error) -> Void
        private var group: OpaquePointer?
        private var waiter: CheckedContinuation<Void, any Error>?
        private var outcome: Result<Void, AvahiError>?

        init(owner: AvahiDiscovery, instance: String, port: UInt16, txt: [String: String], lost: @escaping @Sendable (any Error) -> Void) {
            self.owner = owner
            self.name = instance
            self.port = port
            self.txt = txt
            self.onLost = lost
        }

        var instance: String { owner?.locked { name } ?? name }

        /// With the poll's lock held, or on Avahi's thread.
        func register(client: OpaquePointer?) throws {
            let context = Unmanaged.passUnretained(self).toOpaque()
            if group == nil {
                group = avahi_entry_group_new(client, { group, state, context in
                    guard let context else { return }
                    Unmanaged<Advertisement>.fromOpaque(context).takeUnretainedValue().changed(state, group: group)
                }, context)
            }
            guard let group else { throw AvahiError("cannot advertise", code: avahi_client_errno(client)) }
            var list: UnsafeMutablePointer<AvahiStringList>?
            for (key, value) in txt.sorted(by: { $0.key < $1.key }) { list = avahi_string_list_add(list, "\(key)=\(value)") }
            defer { avahi_string_list_free(list) }
            while true {
                let code = avahi_entry_group_add_service_strlst(group, AvahiIfIndex(AVAHI_IF_UNSPEC), AvahiProtocol(AVAHI_PROTO_INET),
                                                                AvahiPublishFlags(0), name, LANService.type, nil, nil, port, list)
                if code == Int32(AVAHI_ERR_COLLISION) {
                    guard rename() else { throw AvahiError("cannot advertise \(name): the name is taken", code: code) }
                    continue
                }
                guard code == 0 else { throw AvahiError("cannot advertise \(name)", code: code) }
                break
            }
            let code = avahi_entry_group_commit(group)
            guard code == 0 else { throw AvahiError("cannot advertise \(name)", code: code) }
        }

        private func rename() -> Bool {
            guard let alternative = avahi_alternative_service_name(name) else { return false }
            name = String(cString: alternative)
            avahi_free(alternative)
            return true
        }

        /// On Avahi's thread.
        private func changed(_ state: AvahiEntryGroupState, group: OpaquePointer?) {
            switch state {
            case AVAHI_ENTRY_GROUP_ESTABLISHED:
                settle(.success(()))
            case AVAHI_ENTRY_GROUP_COLLISION:
                // Another device took the name first: take the next one (`bob #2`) and advertise again.
                guard rename() else { return settle(.failure(AvahiError("cannot advertise \(name): the name is taken"))) }
                avahi_entry_group_reset(group)
                do {
                    try register(client: avahi_entry_group_get_client(group))
                } catch {
                    settle(.failure(error as? AvahiError ?? AvahiError("\(error)")))
                }
            case AVAHI_ENTRY_GROUP_FAILURE:
                let error = AvahiError("advertising \(name) failed", code: avahi_client_errno(avahi_entry_group_get_client(group)))
                if outcome == nil { settle(.failure(error)) } else { onLost(error) }
            default:
                break
            }
        }

        /// On Avahi's thread or under its lock: the first outcome is the one `established` answers.
        func settle(_ result: Result<Void, AvahiError>) {
            if outcome == nil { outcome = result }
            waiter?.resume(with: result.mapError { $0 as any Error })
            waiter = nil
        }

        /// The daemon went away.
        func lost(_ error: AvahiError) {
            if outcome == nil {
                settle(.failure(error))
            } else {
                onLost(error)
            }
        }

        func established() async throws {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                guard let owner else { return continuation.resume(throwing: AvahiError("the LAN discovery was closed")) }
                owner.locked {
                    if let outcome {
                        continuation.resume(with: outcome.mapError { $0 as any Error })
                    } else {
                        waiter = continuation
                    }
                }
            }
        }

        /// Under the poll's lock.
        func free() {
            if let group { avahi_entry_group_free(group) }
            group = nil
            waiter?.resume(throwing: AvahiError("the advertisement was withdrawn"))
            waiter = nil
        }

        func stop() async {
            owner?.withdraw(self)
        }
    }

    // MARK: Browsing

    public func browse() -> AsyncThrowingStream<LANDiscoveryEvent, any Error> {
        let (stream, continuation) = AsyncThrowingStream<LANDiscoveryEvent, any Error>.makeStream()
        let browse = Browse(continuation: continuation)
        // Set before the browser exists, so a stream that ends at once still frees it. The stream
        // may end on Avahi's own thread (a failure), where its lock must not be taken again.
        continuation.onTermination = { [weak self] _ in
            DispatchQueue.global().async { [weak self] in
                guard let self else { return }
                self.locked {
                    browse.free()
                    self.browses[ObjectIdentifier(browse)] = nil
                }
            }
        }
        let refused: AvahiError? = locked {
            if let failure { return failure }
            browses[ObjectIdentifier(browse)] = browse
            let context = Unmanaged.passUnretained(browse).toOpaque()
            browse.browser = avahi_service_browser_new(
                client, AvahiIfIndex(AVAHI_IF_UNSPEC), AvahiProtocol(AVAHI_PROTO_INET), LANService.type, nil, AvahiLookupFlags(0),
                { browser, interface, proto, event, name, type, domain, _, context in
                    guard let context else { return }
                    Unmanaged<Browse>.fromOpaque(context).takeUnretainedValue()
                        .browsed(browser, interface: interface, protocol: proto, event: event, name: name, type: type, domain: domain)
                }, context)
            guard browse.browser != nil else { return AvahiError("cannot browse for \(LANService.type)", code: avahi_client_errno(client)) }
            return nil
        }
        if let refused { continuation.finish(throwing: refused) }
        return stream
    }

    /// One browse: a service browser, a resolver per record seen, and which interfaces each
    /// instance is seen on (it is lost when the last one goes). Each listener is reported once,
    /// and again only when what it says changes.
    final class Browse: @unchecked Sendable {
        struct Sighting: Hashable {
            var interface: AvahiIfIndex
            var proto: AvahiProtocol
        }

        var browser: OpaquePointer?
        private let continuation: AsyncThrowingStream<LANDiscoveryEvent, any Error>.Continuation
        private var seen: [String: Set<Sighting>] = [:]
        private var resolvers: Set<OpaquePointer> = []
        private var found: [String: LANListener] = [:]

        init(continuation: AsyncThrowingStream<LANDiscoveryEvent, any Error>.Continuation) {
            self.continuation = continuation
        }

        /// On Avahi's thread.
        func browsed(_ browser: OpaquePointer?, interface: AvahiIfIndex, protocol proto: AvahiProtocol, event: AvahiBrowserEvent,
                     name: UnsafePointer<CChar>?, type: UnsafePointer<CChar>?, domain: UnsafePointer<CChar>?) {
            switch event {
            case AVAHI_BROWSER_NEW:
                guard let name else { return }
                seen[String(cString: name), default: []].insert(Sighting(interface: interface, proto: proto))
                let context = Unmanaged.passUnretained(self).toOpaque()
                let resolver = avahi_service_resolver_new(
                    avahi_service_browser_get_client(browser), interface, proto, name, type, domain, AvahiProtocol(AVAHI_PROTO_INET),
                    AvahiLookupFlags(0),
                    { resolver, _, _, event, name, _, _, _, address, port, txt, _, context in
                        guard let context else { return }
                        Unmanaged<Browse>.fromOpaque(context).takeUnretainedValue()
                            .resolved(resolver, event: event, name: name, address: address, port: port, txt: txt)
                    }, context)
                if let resolver { resolvers.insert(resolver) }
            case AVAHI_BROWSER_REMOVE:
                guard let name else { return }
                let instance = String(cString: name)
                seen[instance]?.remove(Sighting(interface: interface, proto: proto))
                if seen[instance]?.isEmpty ?? true {
                    seen[instance] = nil
                    if found.removeValue(forKey: instance) != nil { continuation.yield(.lost(instance: instance)) }
                }
            case AVAHI_BROWSER_FAILURE:
                let code = avahi_client_errno(avahi_service_browser_get_client(browser))
                finish(throwing: AvahiError("browsing for \(LANService.type) failed", code: code))
            default:
                break  // AVAHI_BROWSER_CACHE_EXHAUSTED, AVAHI_BROWSER_ALL_FOR_NOW
            }
        }

        /// On Avahi's thread.
        func resolved(_ resolver: OpaquePointer?, event: AvahiResolverEvent, name: UnsafePointer<CChar>?,
                      address: UnsafePointer<AvahiAddress>?, port: UInt16, txt: UnsafeMutablePointer<AvahiStringList>?) {
            defer {
                if let resolver, resolvers.remove(resolver) != nil { avahi_service_resolver_free(resolver) }
            }
            guard event == AVAHI_RESOLVER_FOUND, let name, let address, address.pointee.proto == AvahiProtocol(AVAHI_PROTO_INET) else { return }
            let instance = String(cString: name)
            // Resolved after it left: nothing to report.
            guard seen[instance] != nil else { return }
            var text = [CChar](repeating: 0, count: Int(AVAHI_ADDRESS_STR_MAX))
            avahi_address_snprint(&text, text.count, address)
            let host = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            guard let listener = LANService.listener(instance: instance, host: host, port: Int(port), txt: Self.pairs(txt)),
                  found[instance] != listener else { return }
            found[instance] = listener
            continuation.yield(.found(listener))
        }

        static func pairs(_ list: UnsafeMutablePointer<AvahiStringList>?) -> [String: String] {
            var pairs: [String: String] = [:]
            var item = list
            while let current = item {
                var key: UnsafeMutablePointer<CChar>?
                var value: UnsafeMutablePointer<CChar>?
                var size = 0
                if avahi_string_list_get_pair(current, &key, &value, &size) == 0, let key {
                    pairs[String(cString: key)] = value.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: size), as: UTF8.self) } ?? ""
                    avahi_free(key)
                    if let value { avahi_free(value) }
                }
                item = avahi_string_list_get_next(current)
            }
            return pairs
        }

        func finish(throwing error: AvahiError) {
            continuation.finish(throwing: error)
        }

        /// Under the poll's lock.
        func free() {
            for resolver in resolvers { avahi_service_resolver_free(resolver) }
            resolvers = []
            if let browser { avahi_service_browser_free(browser) }
            browser = nil
        }
    }
}
