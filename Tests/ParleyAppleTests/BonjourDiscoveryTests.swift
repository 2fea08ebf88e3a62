import Foundation
import NetworkStandIn
@testable import ParleyApple
import ParleyKit
import ParleyLocalServices
import ParleyProtocol
import Testing

extension OneIPhone {
    /// `BonjourDiscovery` against the stand-in Network framework, which plays the local network: the
    /// listeners' DNS-SD records, the app's Info.plist, the user's Local Network choice. Serialized:
    /// that network is one per process. Every test ends with its browse stopped, so that nothing of it
    /// runs into the next.
    @Suite("Bonjour discovery", .serialized, .timeLimit(.minutes(1)))
    struct BonjourDiscoveryTests {
        init() {
            NWBrowser.standInReset()
            NWBrowser.standInBonjourServices = [LANService.type]
        }

        /// bob's laptop, listening with a PIN. Like a laptop on a home network it has a link-local IPv6
        /// address beside its IPv4 one, and a connection that may use either reaches it over IPv6 first.
        static let bob = NWBrowser.StandInService(
            name: "bob on laptop", type: LANService.type, txt: LANService.txt(user: "bob", name: "Bob", pinRequired: true),
            addresses: ["fe80::1c2:3ff:fe45:6789", "192.168.1.20"], port: 8443)
        static let bobListening = LANListener(instance: "bob on laptop", user: "bob", name: "Bob", host: "192.168.1.20", port: 8443,
                                              pinRequired: true)

        static func record(_ name: String, txt: [String: String], addresses: [String] = ["192.168.1.30"]) -> NWBrowser.StandInService {
            NWBrowser.StandInService(name: name, type: LANService.type, txt: txt, addresses: addresses, port: 8443)
        }

        static func stop<Event: Sendable>(_ browsing: BrowseRecorder<Event>) async throws {
            browsing.stop()
            try await eventually("the browser is cancelled") { NWBrowser.standInBrowsing == 0 }
            try await eventually("no connection is left") { NWConnection.standInOpen == 0 }
        }

        @Test func aListenerIsReportedAtItsIPv4AddressWithWhatItsRecordSays() async throws {
            NWBrowser.standInAnnounce(Self.bob)
            let browsing = BrowseRecorder(BonjourDiscovery())
            try await eventually("bob is found") { !browsing.events.isEmpty }
            // The IPv4 address, without the `%en0` scope the resolved address carries.
            #expect(browsing.events == [.found(Self.bobListening)])
            try await eventually("the connection that resolved bob is cancelled") { NWConnection.standInOpen == 0 }

            // A listener that starts later is found too; one whose record changes is reported again.
            var carol = Self.record("carol", txt: LANService.txt(user: "carol", name: nil, pinRequired: false), addresses: ["10.0.0.7"])
            NWBrowser.standInAnnounce(carol)
            try await eventually("carol is found") { browsing.events.count == 2 }
            #expect(browsing.events.last == .found(LANListener(instance: "carol", user: "carol", name: nil, host: "10.0.0.7", port: 8443,
                                                               pinRequired: false)))
            carol.txt = LANService.txt(user: "carol", name: "Carol", pinRequired: true)
            NWBrowser.standInAnnounce(carol)
            try await eventually("carol's new record is reported") { browsing.events.count == 3 }
            #expect(browsing.events.last == .found(LANListener(instance: "carol", user: "carol", name: "Carol", host: "10.0.0.7", port: 8443,
                                                               pinRequired: true)))
            var directory = LANDirectory()
            for event in browsing.events { directory.apply(event) }
            #expect(directory.sorted.map(\.instance) == ["bob on laptop", "carol"])
            try await Self.stop(browsing)
        }

        @Test func recordsThatAreNotAParleyListenersAreIgnored() async throws {
            NWBrowser.standInAnnounce(Self.record("a later version", txt: ["v": "2", "user": "dave", "pin": "0"]))
            NWBrowser.standInAnnounce(Self.record("garbled", txt: ["v": "1", "user": "not a user id", "pin": "0"]))
            NWBrowser.standInAnnounce(Self.record("no user", txt: ["v": "1", "pin": "1"]))
            NWBrowser.standInAnnounce(Self.bob)
            let browsing = BrowseRecorder(BonjourDiscovery())
            try await eventually("bob is found") { !browsing.events.isEmpty }
            try await eventually("every record was resolved") { NWConnection.standInOpen == 0 }
            #expect(browsing.events == [.found(Self.bobListening)])

            // A listener whose record turns into one that is not a Parley listener's is gone for us.
            var bob = Self.bob
            bob.txt["v"] = "2"
            NWBrowser.standInAnnounce(bob)
            try await eventually("bob is lost") { browsing.events.count == 2 }
            #expect(browsing.events.last == .lost(instance: "bob on laptop"))
            try await Self.stop(browsing)
        }

        @Test func aListenerThatLeavesIsLost() async throws {
            NWBrowser.standInAnnounce(Self.bob)
            NWBrowser.standInAnnounce(Self.record("a later version", txt: ["v": "2", "user": "dave", "pin": "0"]))
            let browsing = BrowseRecorder(BonjourDiscovery())
            try await eventually("bob is found") { !browsing.events.isEmpty }
            try await eventually("every record was resolved") { NWConnection.standInOpen == 0 }

            // Only what was reported found is reported lost.
            NWBrowser.standInWithdraw(name: "a later version", type: LANService.type)
            NWBrowser.standInWithdraw(name: "bob on laptop", type: LANService.type)
            try await eventually("bob is lost") { browsing.events.count == 2 }
            #expect(browsing.events == [.found(Self.bobListening), .lost(instance: "bob on laptop")])
            var directory = LANDirectory()
            for event in browsing.events { directory.apply(event) }
            #expect(directory.listeners.isEmpty)
            try await Self.stop(browsing)
        }

        @Test func aListenerWhoseAddressDoesNotResolveIsLeftOutAndItsConnectionCancelled() async throws {
            // Only a link-local IPv6 address: nothing a LANListener URL can use, so nothing to resolve to.
            NWBrowser.standInAnnounce(Self.record("erin", txt: LANService.txt(user: "erin", name: nil, pinRequired: false),
                                                  addresses: ["fe80::2"]))
            let browsing = BrowseRecorder(BonjourDiscovery(resolveTimeout: .milliseconds(300)))
            try await eventually("erin is being resolved") { NWConnection.standInOpen == 1 }
            try await eventually("the resolution gives up") { NWConnection.standInOpen == 0 }
            #expect(browsing.events.isEmpty)
            #expect(!browsing.finished, "one listener that cannot be reached does not end the browse")
            try await Self.stop(browsing)
        }

        /// A browse stopped while a resolution is still under way cancels its connection then, not
        /// when the resolution would have given up.
        @Test func stoppingTheBrowseCancelsTheResolutionsUnderWay() async throws {
            NWBrowser.standInAnnounce(Self.record("erin", txt: LANService.txt(user: "erin", name: nil, pinRequired: false),
                                                  addresses: ["fe80::2"]))
            let browsing = BrowseRecorder(BonjourDiscovery(resolveTimeout: .seconds(60)))
            try await eventually("erin is being resolved") { NWConnection.standInOpen == 1 }
            browsing.stop()
            try await eventually(timeout: .seconds(2), "the stopped browse cancels erin's connection") { NWConnection.standInOpen == 0 }
            try await eventually("the browser is cancelled") { NWBrowser.standInBrowsing == 0 }
        }

        @Test func aServiceTypeMissingFromInfoPlistFailsTheBrowseWithWhatToDeclare() async throws {
            NWBrowser.standInBonjourServices = []  // an Info.plist without NSBonjourServices
            NWBrowser.standInAnnounce(Self.bob)
            let browsing = BrowseRecorder(BonjourDiscovery())
            try await eventually("the browse fails") { browsing.finished }
            let error = try #require(browsing.failure as? BonjourDiscoveryError)
            #expect(error == .serviceTypeNotDeclared)
            for words in ["NSBonjourServices", "_parley._tcp", "Info.plist", "NSLocalNetworkUsageDescription", "-65555"] {
                #expect(error.description.contains(words), "the error says \(words)")
            }
            #expect(browsing.events.isEmpty)
            // A failed browser still has to be cancelled.
            try await eventually("the failed browser is cancelled") { NWBrowser.standInBrowsing == 0 }
        }

        /// The first browse brings up the Local Network prompt, and the browser waits with -65570
        /// (PolicyDenied) while it is up: that is not a refusal. When the user allows, the browse runs.
        @Test func theLocalNetworkPromptIsNotARefusal() async throws {
            NWBrowser.standInSetLocalNetwork(.undetermined)
            NWBrowser.standInAnnounce(Self.bob)
            let browsing = BrowseRecorder(BonjourDiscovery())
            try await eventually("the browser waits") { NWBrowser.standInBrowsing == 1 }
            try await Task.sleep(for: .milliseconds(100))  // checks that nothing happens: the browse does not end
            #expect(!browsing.finished, "the prompt is still up")
            #expect(browsing.events.isEmpty)
            NWBrowser.standInSetLocalNetwork(.allowed)
            try await eventually("bob is found once the user allows") { !browsing.events.isEmpty }
            #expect(browsing.events == [.found(Self.bobListening)])
            try await Self.stop(browsing)
        }

        /// The user said no (or has not answered: iOS does not say which): the browse waits, and runs if
        /// the user turns Local Network on in Settings.
        @Test func withoutLocalNetworkTheBrowseWaits() async throws {
            NWBrowser.standInSetLocalNetwork(.denied)
            NWBrowser.standInAnnounce(Self.bob)
            let browsing = BrowseRecorder(BonjourDiscovery())
            try await eventually("the browser waits") { NWBrowser.standInBrowsing == 1 }
            try await Task.sleep(for: .milliseconds(100))  // checks that nothing happens: the browse does not end
            #expect(!browsing.finished)
            NWBrowser.standInSetLocalNetwork(.allowed)
            try await eventually("bob is found once it is on") { !browsing.events.isEmpty }
            try await Self.stop(browsing)
        }

        /// The UI hears why nothing is found yet, with where to turn Local Network on, and when the wait ends.
        @Test func theWaitForLocalNetworkIsReportedToTheUI() async throws {
            NWBrowser.standInSetLocalNetwork(.undetermined)
            NWBrowser.standInAnnounce(Self.bob)
            let browsing = BrowseRecorder(BonjourDiscovery().browseWithPermission())
            try await eventually("the wait is reported") { !browsing.events.isEmpty }
            #expect(browsing.events == [.waitingForLocalNetworkPermission])
            let sentence = BonjourBrowseEvent.waitingForLocalNetworkPermission.description
            #expect(sentence.contains("Local Network") && sentence.contains("Settings"))
            NWBrowser.standInSetLocalNetwork(.allowed)
            try await eventually("bob is found") { browsing.events.count == 3 }
            #expect(browsing.events == [.waitingForLocalNetworkPermission, .browsing, .discovery(.found(Self.bobListening))])
            try await Self.stop(browsing)
        }

        @Test func endingTheIterationCancelsTheBrowser() async throws {
            NWBrowser.standInAnnounce(Self.bob)
            let discovery = BonjourDiscovery()
            var seen: [LANDiscoveryEvent] = []
            for try await event in discovery.browse() {
                seen.append(event)
                #expect(NWBrowser.standInBrowsing == 1)
                break
            }
            #expect(seen == [.found(Self.bobListening)])
            try await eventually("the browser is cancelled") { NWBrowser.standInBrowsing == 0 }
            #expect(NWConnection.standInOpen == 0)

            // So does cancelling the task that iterates.
            let browsing = BrowseRecorder(discovery)
            try await eventually("browsing again") { NWBrowser.standInBrowsing == 1 && !browsing.events.isEmpty }
            browsing.stop()
            try await eventually("the browser is cancelled") { NWBrowser.standInBrowsing == 0 }
            try await eventually("the iteration ends") { browsing.finished }
            #expect(browsing.failure == nil)
        }

        @Test func anIPhoneDoesNotListen() async throws {
            let discovery = BonjourDiscovery()
            await #expect(throws: BonjourDiscoveryError.listeningUnsupported) {
                _ = try await discovery.advertise(instance: "alice on iphone", port: 8443,
                                                  txt: LANService.txt(user: "alice", name: nil, pinRequired: false), lost: { _ in })
            }
            #expect(BonjourDiscoveryError.listeningUnsupported.description.contains("call hub"))
            #expect(NWBrowser.standInBrowsing == 0)
        }

        /// What the adapter relies on in the stand-in, as the real framework does it: a browse result
        /// has no address; a connection to it resolves one, scoped to the interface, once started.
        @Test func theStandInResolvesAServiceOnlyThroughAStartedConnection() async throws {
            NWBrowser.standInAnnounce(Self.bob)
            let connection = NWConnection(to: .service(name: "bob on laptop", type: LANService.type, domain: "local.", interface: nil),
                                          using: .tcp)
            let states = StateLog()
            connection.stateUpdateHandler = { states.add($0) }
            try await Task.sleep(for: .milliseconds(50))
            #expect(states.all.isEmpty && connection.currentPath == nil, "nothing before start")
            connection.start(queue: DispatchQueue(label: "test.connection"))
            try await eventually("ready") { states.all.last == .ready }
            #expect(states.all == [.preparing, .ready])
            // Either address family allowed: IPv6 first, scoped to the interface it was found on.
            let remote = try #require(connection.currentPath?.remoteEndpoint)
            #expect(remote.debugDescription == "fe80::1c2:3ff:fe45:6789%en0.8443")
            connection.cancel()
            try await eventually("cancelled") { states.all.last == .cancelled }
            #expect(connection.currentPath == nil)
            #expect(NWConnection.standInOpen == 0)
        }
    }
}

/// A browse consumed in the background, as an app's picker would: what it reported and how it ended.
final class BrowseRecorder<Event: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var received: [Event] = []
    private var ended = false
    private var error: (any Error)?
    private var task: Task<Void, Never>?

    init(_ stream: AsyncThrowingStream<Event, any Error>) {
        task = Task { [self] in
            do {
                for try await event in stream { self.lock.withLock { self.received.append(event) } }
                self.lock.withLock { self.ended = true }
            } catch {
                self.lock.withLock {
                    self.ended = true
                    self.error = error
                }
            }
        }
    }

    var events: [Event] { lock.withLock { received } }
    var finished: Bool { lock.withLock { ended } }
    var failure: (any Error)? { lock.withLock { error } }

    /// Cancels the task that iterates: the consumer goes away.
    func stop() { task?.cancel() }
}

extension BrowseRecorder where Event == LANDiscoveryEvent {
    convenience init(_ discovery: BonjourDiscovery) {
        self.init(discovery.browse())
    }
}

/// The states a connection's handler was given, in order.
final class StateLog: @unchecked Sendable {
    private let lock = NSLock()
    private var states: [NWConnection.State] = []

    var all: [NWConnection.State] { lock.withLock { states } }
    func add(_ state: NWConnection.State) { lock.withLock { states.append(state) } }
}
