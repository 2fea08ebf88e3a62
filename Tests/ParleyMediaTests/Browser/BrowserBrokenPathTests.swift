import Foundation
import ParleyServerTesting
import ParleySoftphone
import ParleyWire
import Testing

/// Chromium behind a path that really breaks: the browser's ICE must find the other path.
extension BrowserTests {
    /// The page's selected candidate pair, "local remote" (addresses only), or nil before one.
    static let selectedPair = """
        const stats = await window.parley.call.pc.getStats();
        let id;
        stats.forEach((s) => { if (s.type === 'transport' && s.selectedCandidatePairId) id = s.selectedCandidatePairId; });
        const pair = id && stats.get(id);
        if (!pair) return null;
        const address = (candidate) => candidate && (candidate.address || candidate.ip);
        return address(stats.get(pair.localCandidateId)) + ' ' + address(stats.get(pair.remoteCandidateId));
        """

    /// Chromium in a namespace of its own, joined to the test's by two media paths (a laptop's
    /// Wi-Fi and Ethernet, say), calls the Linux softphone. Mid-call the path ICE chose dies for
    /// good: every packet lost both ways, no reset. The call moves to the other path — a new
    /// selected pair on both sides — and each hears the other again: the page's analyser hears
    /// the softphone's tone, and the softphone's recording carries the page's in every half second
    /// of the last two.
    @Test func aBrowserCallMovesToTheOtherPathWhenItsPathDies() async throws {
        let network = try TwoPathNetwork()
        defer { network.close() }
        try await BrowserLab.run(configure: {
            $0.host = "0.0.0.0"  // the page comes over the veth link; off loopback a secret of its own is needed
            $0.tokenKey = .hs256(secret: String(repeating: "t", count: 40))
        }, driver: {
            try await WebDriver.start(namespace: network.browserNamespace, host: TwoPathNetwork.control.browser, client: TwoPathNetwork.control.ours)
        }) { lab in
            let page = "http://\(TwoPathNetwork.control.ours):\(lab.server.port)"
            // Plain HTTP off loopback: the page says it needs HTTPS for the microphone.
            let insecure = try await lab.browser(tone: 660, through: page)
            try await eventually("the page says it is not secure") { try await insecure.notice().contains("HTTPS") }
            await insecure.close()
            // This test's page is taken as secure, as one over HTTPS would be.
            let alice = try await lab.browser(tone: 660, through: page, arguments: ["--unsafely-treat-insecure-origin-as-secure=\(page)"])
            try await lab.signIn(alice, as: "alice")
            let recording = lab.directory.appendingPathComponent("linus.wav")
            let linus = try makePhone(lab.server, "linus", tone: 440, record: recording, addresses: network.paths.map(\.ours))
            try await linus.start()
            let linusLog = EventCollector(linus.events)
            do {
                let call = try await alice.call("linus", answeredBy: linus, log: linusLog)
                try await alice.waitForRemoteTone(440)
                let linusPeer = try #require(await linus.peerConnection(of: call))

                let before = try #require(try await alice.evaluate(Self.selectedPair) as? String, "the page has a selected pair")
                let used = try #require(network.paths.firstIndex { before == "\($0.browser) \($0.ours)" }, "a pair on one path: \(before)")
                #expect(linusPeer.selectedCandidatePair?.localAddress == network.paths[used].ours)
                let other = network.paths[1 - used]
                let cut = ContinuousClock.now
                #expect(network.wires[used].change(to: "loss=100%"), "the wire took the change")

                try await eventually(timeout: .seconds(30), "the page's media moves to the other path") {
                    try await alice.evaluate(Self.selectedPair) as? String == "\(other.browser) \(other.ours)"
                }
                print("◇ the page's media moved \(ContinuousClock.now - cut) after its path died")
                try await eventually(timeout: .seconds(30), "the softphone's media moves to it too") {
                    linusPeer.selectedCandidatePair?.localAddress == other.ours
                }
                print("◇ the softphone's media moved \(ContinuousClock.now - cut) after its path died")
                try await alice.waitForRemoteTone(440)
                print("◇ the page heard the softphone again \(ContinuousClock.now - cut) after its path died")
                try await Task.sleep(for: .seconds(3))  // audio over the new path, for the recording
                try await alice.click("#hangup")
                try await alice.waitForCall("ended")
                try await eventually("linus's call ends") { await linus.timeline(of: call)?.isEnded == true }
            } catch {
                await linus.stop()
                throw error
            }
            await linus.stop()
            let heard = try Recording(recording)
            let last = heard.toneInEveryWindow(660, from: heard.audio.duration - 2.5, to: heard.audio.duration - 0.25, floor: -40)
            #expect(last.passed, "linus hears the page over the new path: \(last)")
        }
    }
}

/// Two wires for media between a namespace of its own (the browser's) and the test's own namespace
/// (named for the occasion, so that a wire can reach it), and a veth link for control and
/// signaling that carries no media (no route from the far side leads back to it). Reverse-path
/// filtering is on at both ends, so a packet comes back only the way it went: a pair across the two
/// wires (out on one, back on the other) cannot form, and "the path the media takes" is one wire.
final class TwoPathNetwork {
    static let control = (ours: "198.51.100.101", browser: "198.51.100.102")
    let paths = [(browser: "203.0.113.21", ours: "203.0.113.22"), (browser: "203.0.113.31", ours: "203.0.113.32")]
    let browserNamespace = "parley-br\(getpid() % 10_000)"
    private let ourName = "parley-self\(getpid() % 10_000)"
    private let link = "pwc\(getpid() % 100_000)"
    private(set) var wires: [ImpairedWireLab.Wire] = []
    private var filterWas: String?

    init() throws {
        do {
            try NetworkNamespace.runIP(["netns", "attach", ourName, "\(getpid())"])
            for path in paths {
                wires.append(try ImpairedWireLab.Wire(a: TunWire.Side(namespace: browserNamespace, address: path.browser),
                                                      b: TunWire.Side(namespace: ourName, address: path.ours), impairment: "delay=10ms"))
            }
            try NetworkNamespace.runIP(["link", "add", link, "type", "veth", "peer", "name", link + "b", "netns", browserNamespace])
            try NetworkNamespace.runIP(["addr", "add", Self.control.ours, "peer", Self.control.browser, "dev", link])
            try NetworkNamespace.runIP(["link", "set", link, "up"])
            try NetworkNamespace.runIP(["-n", browserNamespace, "addr", "add", Self.control.browser, "peer", Self.control.ours, "dev", link + "b"])
            try NetworkNamespace.runIP(["-n", browserNamespace, "link", "set", link + "b", "up"])
            let filter = "/proc/sys/net/ipv4/conf/all/rp_filter"
            filterWas = try String(contentsOfFile: filter, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            try "1".write(toFile: filter, atomically: false, encoding: .utf8)
            try NetworkNamespace(browserNamespace).run(["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1"])
        } catch {
            close()
            throw error
        }
    }

    /// Removes the link, the wires (the first made the browser's namespace and removes it: it goes
    /// last) and our namespace's name, and puts reverse-path filtering back as it was.
    func close() {
        if let filterWas { try? filterWas.write(toFile: "/proc/sys/net/ipv4/conf/all/rp_filter", atomically: false, encoding: .utf8) }
        filterWas = nil
        try? NetworkNamespace.runIP(["link", "del", link])
        for wire in wires.reversed() { _ = wire.stop() }
        wires = []
        try? NetworkNamespace.runIP(["netns", "delete", ourName])
    }
}
