/// How long the receive jitter buffer holds packets, adapted to the network as NetEQ adapts
/// libwebrtc's: long enough that packets the network delays still arrive in time, and no longer.
///
/// - The target is `jitterMultiple` × the measured interarrival jitter (RFC 3550's running
///   estimate, the mean deviation: for delays spread evenly over a range, that range is about three
///   times it) plus `marginMs`, within `minimumMs…maximumMs`.
/// - Packets that arrived too late to play mean the buffer is short whatever the estimate says:
///   the latency grows by `lateGrowth` at once, and does not shrink back to where packets came late
///   until none has for `lateMemory`. (Without that memory it sawed: the estimate, which reads short
///   of the delays' spread, shrank it 3 s after each growth to where the next late packets waited.
///   Under 15 % loss with 40 ms of jitter a listener lost 2–3 % more than the wire dropped.)
/// - While lost packets are being asked for again (NACK), it also waits for their retransmission:
///   the round trip a retransmission took, plus `jitterMultiple` × jitter and `retransmissionMarginMs`
///   (the ask leaves a little after the packet was due). NetEQ does not wait so (Chromium asks for no
///   audio again); on a 40 ms round trip it costs some 50 ms of delay and repairs nearly every loss.
/// - It grows at once and shrinks slowly: only after the target stayed `shrinkMarginMs` below the
///   latency (or at the floor) for `shrinkAfter`, and then by at most `shrinkStepMs`, so one quiet moment does not
///   undo what a burst of jitter taught.
public struct JitterBufferController: Sendable {
    public struct Configuration: Hashable, Sendable {
        public var minimumMs = 50
        public var maximumMs = 300
        public var jitterMultiple = 3.0
        public var marginMs = 10.0
        public var lateGrowth = 1.5
        public var shrinkMarginMs = 15
        public var shrinkAfter: Duration = .seconds(3)
        public var shrinkStepMs = 10
        public var lateMemory: Duration = .seconds(20)
        public var retransmissionMarginMs = 30.0

        public init() {}
    }

    public let configuration: Configuration
    public private(set) var latencyMs: Int
    private var late: UInt64 = 0
    private var asked: UInt64 = 0
    private var shrinkingSince: Duration?
    /// The latency packets came too late at, and when they last did.
    private var tooShort: (latencyMs: Int, at: Duration)?

    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
        latencyMs = configuration.minimumMs
    }

    /// Takes the jitter buffers' figures at `now` (any monotonic timeline): the running jitter, the
    /// count of packets that came too late so far, of packets asked for again so far, and how long
    /// a retransmission took (nil before one came). Answers the new latency when it changes.
    public mutating func update(jitterMs: Double?, lateSoFar: UInt64, askedAgainSoFar: UInt64 = 0,
                                retransmissionRttMs: Double? = nil, now: Duration) -> Int? {
        let c = configuration
        let newlyLate = lateSoFar > late
        late = lateSoFar
        let asking = askedAgainSoFar > asked
        asked = askedAgainSoFar
        var target = jitterMs.map { Int((c.jitterMultiple * $0 + c.marginMs).rounded(.up)) } ?? c.minimumMs
        if asking, let rtt = retransmissionRttMs, rtt > 0 {
            target = max(target, Int((rtt + c.jitterMultiple * (jitterMs ?? 0) + c.retransmissionMarginMs).rounded(.up)))
        }
        if newlyLate {
            tooShort = (latencyMs, now)
            target = max(target, Int((Double(latencyMs) * c.lateGrowth).rounded(.up)))
        }
        if let tooShort, now - tooShort.at < c.lateMemory { target = max(target, tooShort.latencyMs + c.shrinkMarginMs) }
        target = min(c.maximumMs, max(c.minimumMs, target))

        var next = latencyMs
        if target > latencyMs {
            next = target
            shrinkingSince = nil
        } else if target <= latencyMs - c.shrinkMarginMs || (target == c.minimumMs && latencyMs > target) {
            let since = shrinkingSince ?? now
            shrinkingSince = since
            if now - since >= c.shrinkAfter {
                next = max(target, latencyMs - c.shrinkStepMs)
                shrinkingSince = now
            }
        } else {
            shrinkingSince = nil
        }
        guard next != latencyMs else { return nil }
        latencyMs = next
        return next
    }
}
