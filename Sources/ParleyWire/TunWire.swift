import CParleyNet
import Foundation

/// A userspace impaired wire between two network namespaces: one TUN device in each, a
/// point-to-point link between their two addresses, and this process forwarding every IP packet
/// through a `WireDirection` each way. The kernel here has no netem; this stands in for it.
///
/// Control lines (on `control`, usually standard input), each answered with one line:
///
///     set <spec>          both directions (see `Impairment`)
///     set ab <spec>       a → b only; `set ba <spec>` for b → a
///     stats               what each direction did so far, as JSON
///     quit
public final class TunWire: @unchecked Sendable {  // used by one thread at a time: run, then statistics and close
    public struct Side: Sendable {
        public var namespace: String
        public var address: String
        public init(namespace: String, address: String) {
            self.namespace = namespace
            self.address = address
        }
    }

    public let a: Side
    public let b: Side
    private var ab: WireDirection
    private var ba: WireDirection
    private var tunA: Int32
    private var tunB: Int32
    private var created: [NetworkNamespace] = []
    /// Wires made by this process so far: each names its devices after its number.
    nonisolated(unsafe) private static var made = 0
    private static let numbering = NSLock()

    /// Makes the namespaces that do not exist yet (and removes them again in `close`), and the link.
    public init(a: Side, b: Side, ab: Impairment, ba: Impairment, seed: UInt64) throws {
        self.a = a
        self.b = b
        // Two streams of draws, one a direction, both from the one seed.
        self.ab = WireDirection(impairment: ab, seed: seed)
        self.ba = WireDirection(impairment: ba, seed: seed ^ 0x5EED_0F_B7A0)
        var created: [NetworkNamespace] = []
        var opened: [Int32] = []
        do {
            for side in [a, b] where !NetworkNamespace(side.namespace).exists {
                created.append(try NetworkNamespace.create(side.namespace))
            }
            let wire = Self.numbering.withLock {
                Self.made += 1
                return Self.made
            }
            for (side, peer) in [(a, b), (b, a)] {
                // A name unique on this machine while it lives in ours (several wires may join the
                // same two namespaces); it keeps it in the namespace.
                let device = "pw\(getpid() % 100_000)\(side.address == a.address ? "a" : "b")\(wire)"
                let fd = parley_tun_open(device)
                guard fd >= 0 else {
                    throw WireError("cannot open a TUN device (\(String(cString: strerror(errno)))): the wire needs root and /dev/net/tun")
                }
                opened.append(fd)
                try NetworkNamespace.runIP(["link", "set", device, "netns", side.namespace])
                try NetworkNamespace.runIP(["-n", side.namespace, "addr", "add", side.address, "peer", peer.address, "dev", device])
                try NetworkNamespace.runIP(["-n", side.namespace, "link", "set", device, "up"])
            }
        } catch {
            opened.forEach { _ = Glibc.close($0) }
            created.forEach { $0.delete() }
            throw error
        }
        tunA = opened[0]
        tunB = opened[1]
        self.created = created
    }

    /// Forwards until `quit` or the end of `control`, and with `stopsOnSignals` until SIGINT or
    /// SIGTERM too (a process's handlers: leave it off inside a program of your own); `report` gets
    /// each answer to a control line.
    public func run(control: Int32?, stopsOnSignals: Bool, report: (String) -> Void) throws {
        let stop = stopsOnSignals ? try SignalPipe().readEnd : -1
        var commands = LineReader()
        var packet = [UInt8](repeating: 0, count: 65_536)
        var descriptors = [tunA, tunB, stop].map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        if let control { descriptors.append(pollfd(fd: control, events: Int16(POLLIN), revents: 0)) }

        while true {
            let next = [ab.nextDeparture, ba.nextDeparture].compactMap { $0 }.min()
            let timeout = next.map { Int32(max(0, min(1_000, (($0 - Self.now()) * 1000).rounded(.up)))) } ?? 1_000
            for index in descriptors.indices { descriptors[index].revents = 0 }
            if poll(&descriptors, nfds_t(descriptors.count), timeout) < 0, errno != EINTR {
                throw WireError("poll failed: \(String(cString: strerror(errno)))")
            }
            let broken = Int16(POLLERR | POLLHUP | POLLNVAL)
            if descriptors[0].revents & broken != 0 || descriptors[1].revents & broken != 0 {
                throw WireError("a TUN device failed (its namespace was removed?)")
            }
            let now = Self.now()
            if descriptors[0].revents != 0 { drain(tunA, into: &ab, buffer: &packet, at: now) }
            if descriptors[1].revents != 0 { drain(tunB, into: &ba, buffer: &packet, at: now) }
            for outgoing in ab.due(at: now) { _ = outgoing.withUnsafeBytes { write(tunB, $0.baseAddress, $0.count) } }
            for outgoing in ba.due(at: now) { _ = outgoing.withUnsafeBytes { write(tunA, $0.baseAddress, $0.count) } }
            if descriptors[2].revents != 0 { return }
            if let control, descriptors[3].revents != 0 {
                let count = read(control, &packet, packet.count)
                if count <= 0 { return }
                for line in commands.take(packet[0..<count]) {
                    guard let answer = perform(line) else { return }
                    report(answer)
                }
            }
        }
    }

    /// What each direction did, as one JSON object.
    public var statistics: String {
        #"{"ab":\#(ab.statistics.json),"ba":\#(ba.statistics.json)}"#
    }

    /// Closes both devices (the link goes with them) and removes the namespaces this wire made.
    public func close() {
        for fd in [tunA, tunB] where fd >= 0 { _ = Glibc.close(fd) }
        tunA = -1
        tunB = -1
        created.forEach { $0.delete() }
        created = []
    }

    /// Answers a control line; nil to stop.
    private func perform(_ line: String) -> String? {
        let words = line.split(separator: " ", maxSplits: 2).map(String.init)
        switch words.first {
        case "quit"?: return nil
        case "stats"?: return statistics
        case "set"?:
            let target = words.count > 2 && (words[1] == "ab" || words[1] == "ba") ? words[1] : nil
            let spec = target == nil ? words.dropFirst().joined(separator: " ") : words[2]
            do {
                let impairment = try Impairment(spec: spec)
                if target != "ba" { ab.change(to: impairment) }
                if target != "ab" { ba.change(to: impairment) }
                return "ok \(target ?? "both") \(impairment)"
            } catch {
                return "error: \(error)"
            }
        default:
            return "error: unknown command '\(line)': set [ab|ba] <spec>, stats, quit"
        }
    }

    private func drain(_ fd: Int32, into direction: inout WireDirection, buffer: inout [UInt8], at now: Double) {
        while true {
            let count = read(fd, &buffer, buffer.count)
            guard count > 0 else { return }
            direction.admit(Array(buffer[0..<count]), at: now)
        }
    }

    static func now() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }
}

/// Lines out of a byte stream.
private struct LineReader {
    private var pending: [UInt8] = []

    mutating func take(_ bytes: ArraySlice<UInt8>) -> [String] {
        pending.append(contentsOf: bytes)
        var lines: [String] = []
        while let end = pending.firstIndex(of: UInt8(ascii: "\n")) {
            let line = String(decoding: pending[..<end], as: UTF8.self).trimmingWhitespace
            pending.removeSubrange(...end)
            if !line.isEmpty { lines.append(line) }
        }
        return lines
    }
}

/// SIGINT and SIGTERM, readable as a file descriptor for poll.
private struct SignalPipe {
    let readEnd: Int32

    init() throws {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw WireError("cannot make a pipe") }
        readEnd = ends[0]
        signalWriteEnd = ends[1]
        // A reader of our output that went away must not kill the wire before it cleans up.
        Glibc.signal(SIGPIPE, SIG_IGN)
        for signal in [SIGINT, SIGTERM] {
            Glibc.signal(signal) { _ in
                var byte: UInt8 = 1
                _ = write(signalWriteEnd, &byte, 1)
            }
        }
    }
}

nonisolated(unsafe) private var signalWriteEnd: Int32 = -1
