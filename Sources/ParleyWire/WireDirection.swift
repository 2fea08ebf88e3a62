/// One direction of an impaired wire, without I/O: packets go in with their arrival time
/// (`admit`), and come out when their time is due (`due`). Every random draw comes from one seeded
/// generator, so the same seed and the same arrivals give the same losses and delays.
///
/// A packet passes, in order: the loss (independent, or the Gilbert–Elliott chain for bursts), the
/// bottleneck (serialised at `rateKbps` behind the packets before it, dropped when its wait would
/// exceed `queueMs`), then the delay and jitter.
public struct WireDirection: Sendable {
    public private(set) var impairment: Impairment
    public private(set) var statistics = WireStatistics()
    private var random: SeededRandom
    private var inBurst = false
    private var linkFreeAt = 0.0
    private var lastDeparture = 0.0
    private var arrivals: UInt64 = 0
    private var highestDelivered: UInt64?
    /// Waiting packets, latest departure first, so the next one due is at the end.
    private var waiting: [(departure: Double, arrival: UInt64, admitted: Double, packet: [UInt8])] = []

    public init(impairment: Impairment, seed: UInt64) {
        self.impairment = impairment
        random = SeededRandom(seed: seed)
    }

    /// Applies to packets admitted from now on; those already waiting keep their times.
    public mutating func change(to impairment: Impairment) {
        self.impairment = impairment
        inBurst = false
    }

    /// Takes a packet that arrived at `now` (seconds, any monotonic timeline).
    public mutating func admit(_ packet: [UInt8], at now: Double) {
        statistics.received += 1
        statistics.kinds[PacketKind(packet), default: 0] += 1
        arrivals += 1
        if isLost() { return }

        var departure = now
        if let rate = impairment.rateKbps {
            let start = max(now, linkFreeAt)
            if (start - now) * 1000 > impairment.queueMs {
                statistics.droppedByQueue += 1
                return
            }
            linkFreeAt = start + Double(packet.count * 8) / (rate * 1000)
            departure = linkFreeAt
        }
        departure += impairment.delayMs / 1000
        if impairment.jitterMs > 0 {
            departure += random.uniform(0, 2 * impairment.jitterMs) / 1000
        }
        if !impairment.reorder { departure = max(departure, lastDeparture) }
        lastDeparture = max(lastDeparture, departure)

        let entry = (departure: departure, arrival: arrivals, admitted: now, packet: packet)
        // Binary search for the place that keeps `waiting` sorted latest first; equal times keep arrival order.
        var low = 0, high = waiting.count
        while low < high {
            let middle = (low + high) / 2
            if waiting[middle].departure > departure || (waiting[middle].departure == departure && waiting[middle].arrival > entry.arrival) {
                low = middle + 1
            } else {
                high = middle
            }
        }
        waiting.insert(entry, at: low)
    }

    /// When the next waiting packet is due, if any is waiting.
    public var nextDeparture: Double? { waiting.last?.departure }

    /// The packets due by `now`, in the order they leave.
    public mutating func due(at now: Double) -> [[UInt8]] {
        var out: [[UInt8]] = []
        while let next = waiting.last, next.departure <= now {
            waiting.removeLast()
            let delay = (next.departure - next.admitted) * 1000
            statistics.forwarded += 1
            statistics.totalDelayMs += delay
            statistics.maxDelayMs = max(statistics.maxDelayMs, delay)
            if delay >= 0.5 { statistics.delayed += 1 }
            if let highest = highestDelivered, next.arrival < highest {
                statistics.reordered += 1
            } else {
                highestDelivered = next.arrival
            }
            out.append(next.packet)
        }
        return out
    }

    private mutating func isLost() -> Bool {
        let loss = impairment.lossPct / 100
        guard loss > 0 else { return false }
        guard let burstLength = impairment.burstLength else {
            if random.unit() < loss {
                statistics.droppedByLoss += 1
                return true
            }
            return false
        }
        // Gilbert–Elliott with every packet lost in the bad state and none in the good one: leave the
        // bad state with r = 1/burst (mean burst length), enter it with p = loss·r/(1 − loss), so the
        // chain spends `loss` of its time there.
        let leave = 1 / burstLength
        let enter = loss * leave / (1 - loss)
        inBurst = inBurst ? random.unit() >= leave : random.unit() < enter
        if inBurst { statistics.droppedInBursts += 1 }
        return inBurst
    }
}

/// What a wire direction actually did.
public struct WireStatistics: Hashable, Sendable {
    public var received = 0
    public var forwarded = 0
    public var droppedByLoss = 0
    public var droppedInBursts = 0
    public var droppedByQueue = 0
    /// Forwarded after waiting half a millisecond or more.
    public var delayed = 0
    /// Forwarded after a packet that arrived later than it.
    public var reordered = 0
    public var totalDelayMs = 0.0
    public var maxDelayMs = 0.0
    /// What the packets received were (before any loss), by kind.
    public var kinds: [PacketKind: Int] = [:]

    public var dropped: Int { droppedByLoss + droppedInBursts + droppedByQueue }
    public var meanDelayMs: Double { forwarded > 0 ? totalDelayMs / Double(forwarded) : 0 }

    /// One JSON object, for the wire's report.
    public var json: String {
        func number(_ value: Double) -> String { String(Double((value * 10).rounded()) / 10) }
        return #"{"received":\#(received),"forwarded":\#(forwarded),"dropped":\#(dropped),"droppedByLoss":\#(droppedByLoss),"#
            + #""droppedInBursts":\#(droppedInBursts),"droppedByQueue":\#(droppedByQueue),"delayed":\#(delayed),"#
            + #""reordered":\#(reordered),"meanDelayMs":\#(number(meanDelayMs)),"maxDelayMs":\#(number(maxDelayMs)),"#
            + #""kinds":{\#(PacketKind.allCases.map { #""\#($0.rawValue)":\#(kinds[$0] ?? 0)"# }.joined(separator: ","))}}"#
    }
}

/// What an IP packet carries, as far as a call's traffic goes: TCP (signaling), and for UDP what
/// RFC 7983 tells from the first byte of the payload (and RFC 5761 from the second, for RTCP).
/// SRTP and SRTCP keep these bytes in the clear, so the wire can count media without keys.
public enum PacketKind: String, CaseIterable, Hashable, Sendable {
    case tcp, stun, dtls, turnChannel, rtp, rtcp, otherUDP, other

    public init(_ packet: [UInt8]) {
        guard packet.count >= 20, packet[0] >> 4 == 4 else { self = .other; return }
        let header = Int(packet[0] & 0x0F) * 4
        switch packet[9] {
        case 6: self = .tcp
        case 17:
            let payload = header + 8
            guard packet.count > payload else { self = .otherUDP; return }
            switch packet[payload] {
            case 0...3: self = .stun
            case 20...63: self = .dtls
            case 64...79: self = .turnChannel
            case 128...191:
                let type = packet.count > payload + 1 ? packet[payload + 1] : 0
                self = (192...223).contains(type) ? .rtcp : .rtp
            default: self = .otherUDP
            }
        default: self = .other
        }
    }
}

/// SplitMix64: small, fast, and the same sequence for the same seed on every machine.
public struct SeededRandom: Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    mutating func unit() -> Double { Double(next() >> 11) / Double(1 << 53) }

    mutating func uniform(_ low: Double, _ high: Double) -> Double { low + (high - low) * unit() }
}
