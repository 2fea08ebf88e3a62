/// Adaptive audio bitrate: what the encoder should run at, from the loss of what we send and the
/// round trip.
///
/// Loss alone does not lower the bitrate: random loss (radio, a busy Wi-Fi) is not cured by sending
/// less; in-band FEC answers it, and FEC needs bits, so on a lossy path measured not to queue the
/// bitrate rises at once to `lossyKbps`. The bitrate comes down when the path is congested, which
/// shows as queueing: the round trip `queueingMs` above the lowest one measured, with loss above
/// `decreaseAbovePct`, or twice that much queueing with no loss yet (a bottleneck's queue filling
/// before it drops). (Heavy loss alone is no sign either: at 20 % random loss, dropping to 12 kbit/s
/// and 60 ms frames scored PESQ 1.28 where keeping 48 kbit/s with FEC does better.)
///
/// No round trip at all `feedbackTimeout` after the first report means the far side's receiver
/// reports are not getting through: the path is choked (a bottleneck's queue fills before the first
/// report can cross it), and the bitrate comes down as for congestion, as libwebrtc does when its
/// feedback stops. The boost to `lossyKbps` needs a round trip under `lossyBelowRttMs`: a first
/// round trip measured through a full queue would otherwise pass for the path's own. Nor is a path
/// that has queued once in the call boosted again: its rate rises only by the slow increases.
///
/// No path's own round trip is longer than `longestPathRttMs` (a geostationary satellite hop is
/// about 600 ms): whatever a round trip has above it is queue, even when that round trip is the
/// lowest measured (one report crossing a full bottleneck is all a choked call may get).
///
/// A queue deeper than `drainQueueMs` drains only if we send well under the link's rate: the bitrate
/// falls to `minKbps` at once rather than step by step behind a round trip that grows with it.
///
/// At low bitrates the packets' own headers (IP, UDP, RTP, SRTP: about 50 bytes, 20 kbit/s at 50
/// packets a second) cost more than the speech: below `longerFramesBelowKbps` a frame carries 40 ms,
/// below `longestFramesBelowKbps` 60 ms.
///
/// - Down ×`decreaseFactor` when congested; up ×`increaseFactor` when loss is below
///   `increaseBelowPct`, a measured RTT is under `increaseBelowRttMs` and nothing queues (never on
///   an RTT not yet measured); always within `minKbps…maxKbps`.
/// - Hysteresis: a condition must hold for `confirmations` reports in a row before it acts.
/// - Hold-off: after any change, no increase for `increaseHoldOff` and no further decrease for
///   `decreaseHoldOff`, so one burst of loss does not send the rate up and down.
/// - Opus in-band FEC turns on, with the measured loss as the encoder's expected-loss hint, once
///   loss exceeds `fecAbovePct`, and off again once it stays below `fecOffBelowPct`.
public struct BitrateController: Sendable {
    public struct Configuration: Hashable, Sendable {
        public var minKbps: Double = 12
        public var maxKbps: Double = 64
        /// Where the encoder starts (`MediaEngineConfiguration.opusBitrate` is the same 32 kbit/s).
        public var startKbps: Double = 32
        public var decreaseAbovePct: Double = 3
        public var lossyKbps: Double = 48
        public var lossyBelowRttMs: Double = 250
        public var feedbackTimeout: Duration = .seconds(5)
        public var longestPathRttMs: Double = 700
        /// How many times the interarrival jitter a round trip may rise above the lowest without
        /// counting as queue. Delays spread evenly over 0–80 ms each way (jitter read as about 18 ms)
        /// put round trips up to 160 ms and on average 80 ms above the lowest; at twice the jitter
        /// that read as a queue, and 15 % loss with it lowered the rate to 18 kbit/s for nothing.
        public var jitterAllowance: Double = 4
        public var longerFramesBelowKbps: Double = 20
        public var longestFramesBelowKbps: Double = 14
        public var decreaseFactor: Double = 0.75
        public var queueingMs: Double = 40
        public var drainQueueMs: Double = 300
        public var increaseBelowPct: Double = 1
        /// A jittery path's round trips spread far above its lowest without any queue (0–80 ms of
        /// jitter each way on a 40 ms path: 40–360 ms), and the queue test allows for that; this
        /// bound keeps a rise off a path whose lowest round trip may itself have crossed a queue.
        /// At 150 ms such a path stayed at the start's 32 kbit/s for the whole call (PESQ 3.86
        /// against 4.06 on a clean wire).
        public var increaseBelowRttMs: Double = 300
        public var increaseFactor: Double = 1.15
        public var confirmations: Int = 2
        public var increaseHoldOff: Duration = .seconds(6)
        public var decreaseHoldOff: Duration = .seconds(2)
        public var fecAbovePct: Double = 1
        public var fecOffBelowPct: Double = 0.5
        /// The bounds of the expected-loss hint while FEC is on.
        public var minExpectedLossPct = 5
        public var maxExpectedLossPct = 25

        public init() {}
    }

    /// What the encoder should do now.
    public struct Setting: Hashable, Sendable {
        public var bitrateKbps: Double
        public var fec: Bool
        /// Opus's packet-loss-percentage hint, 0…100.
        public var expectedLossPct: Int
        /// Audio per packet: 20, 40 or 60 ms.
        public var frameMs: Int

        public init(bitrateKbps: Double, fec: Bool, expectedLossPct: Int, frameMs: Int = 20) {
            self.bitrateKbps = bitrateKbps
            self.fec = fec
            self.expectedLossPct = expectedLossPct
            self.frameMs = frameMs
        }
    }

    public let configuration: Configuration
    public private(set) var setting: Setting
    /// The lowest round trip measured so far: the path's own, without queues.
    public var baseRttMs: Double? { lowestRttMs }
    private var lastChange: Duration?
    private var pendingDirection = 0
    private var pendingCount = 0
    private var lowestRttMs: Double?
    private var firstReport: Duration?
    private var queuedBefore = false

    public init(configuration: Configuration = Configuration()) {
        precondition(configuration.minKbps <= configuration.maxKbps, "minKbps must not exceed maxKbps")
        self.configuration = configuration
        let start = min(configuration.maxKbps, max(configuration.minKbps, configuration.startKbps))
        setting = Setting(bitrateKbps: start, fec: false, expectedLossPct: 0)
    }

    /// Takes a call's quality report at time `now`. Loss and jitter are taken fast up, slow down: the
    /// larger of the last interval's figure and the window's mean. A path turning bad then acts within
    /// a report (FEC on, its expected-loss hint at the loss seen, the jitter allowance wide enough for
    /// the new spread), not as the mean creeps up over the window; a path turning good acts only once
    /// the window agrees. (With the means alone, 15 % loss arriving mid-call had FEC on 2 s late and its
    /// hint at 5 % for the next 2 s, while a round trip spread by new jitter, set against the old
    /// jitter's mean, passed for a queue and lowered the rate.) The loss of what we send is the far
    /// side's, and the loss we receive stands in for it until its first receiver report.
    public mutating func update(_ report: QualityReport, now: Duration) -> Setting? {
        let receivedLoss = max(report.lossPct, report.latestLossPct)
        let sentLoss = [report.remoteLossPct, report.latestRemoteLossPct].compactMap { $0 }.max() ?? receivedLoss
        return update(lossPct: sentLoss, receivedLossPct: receivedLoss, rttMs: report.latestRttMs,
                      jitterMs: max(report.jitterMs, report.latestJitterMs), meanRttMs: report.meanMeasuredRttMs, now: now)
    }

    /// Takes a quality report at time `now`: the loss of what we send, the loss we see receiving
    /// (FEC turns on at the first sign of loss either way: the far side's reports come a second
    /// apart at best), the round trip, nil while none was measured, and the interarrival jitter
    /// (a jittery path's round trips spread above its lowest without any queue: `jitterAllowance` × the jitter
    /// is not counted as queueing). Answers the new setting when it changed.
    ///
    /// `meanRttMs`, the mean round trip of the last few reports, when given, bounds the round trip the
    /// queue is judged by: a queue raises the mean, where jitter throws single round trips above it
    /// (15 % loss with 0–80 ms of jitter each way put one round trip in four 130 ms above the lowest,
    /// and two such in a row lowered the rate in two calls of three). A round trip past
    /// `longestPathRttMs` counts as queue on its own.
    public mutating func update(lossPct: Double, receivedLossPct: Double = 0, rttMs: Double?, jitterMs: Double = 0,
                                meanRttMs: Double? = nil, now: Duration) -> Setting? {
        let c = configuration
        var next = setting

        let seenLoss = max(lossPct, receivedLossPct)
        if seenLoss > c.fecAbovePct {
            next.fec = true
            // Opus spends LBRR bits by this hint: the loss seen, but at least enough for Opus to
            // protect every frame.
            next.expectedLossPct = min(c.maxExpectedLossPct, max(c.minExpectedLossPct, Int(seenLoss.rounded(.up))))
        } else if seenLoss < c.fecOffBelowPct {
            next.fec = false
            next.expectedLossPct = 0
        }

        if let rttMs, rttMs > 0 { lowestRttMs = min(lowestRttMs ?? rttMs, rttMs) }
        var queueing = 0.0
        if let rttMs, let lowest = lowestRttMs {
            let judged = min(rttMs, meanRttMs ?? rttMs)
            queueing = max(0, judged - lowest - c.jitterAllowance * jitterMs, rttMs - c.longestPathRttMs)
        }
        let start = firstReport ?? now
        firstReport = start
        let feedbackLost = rttMs == nil && now - start >= c.feedbackTimeout
        let congested = (lossPct > c.decreaseAbovePct && queueing > c.queueingMs) || queueing > 2 * c.queueingMs || feedbackLost
        let direction = congested ? -1
            : (lossPct < c.increaseBelowPct && queueing < c.queueingMs / 2 && (rttMs.map { $0 < c.increaseBelowRttMs } ?? false) ? 1 : 0)
        if direction == 0 || direction != pendingDirection {
            pendingDirection = direction
            pendingCount = direction == 0 ? 0 : 1
        } else {
            pendingCount += 1
        }
        let holdOff = direction > 0 ? c.increaseHoldOff : c.decreaseHoldOff
        let heldOff = lastChange.map { now - $0 < holdOff } ?? false
        if direction != 0, pendingCount >= c.confirmations, !heldOff {
            let factor = direction > 0 ? c.increaseFactor : (queueing > c.drainQueueMs ? 0 : c.decreaseFactor)
            let rate = min(c.maxKbps, max(c.minKbps, setting.bitrateKbps * factor))
            if direction < 0 { queuedBefore = true }
            if rate != setting.bitrateKbps {
                next.bitrateKbps = rate
                lastChange = now
                pendingCount = 0
            }
        }
        // Loss without congestion: give FEC its bits now rather than one step every hold-off (and
        // as soon as a round trip shows the path does not queue, if FEC came on before one did).
        let boostHeldOff = lastChange.map { now - $0 < c.increaseHoldOff } ?? false
        if next.fec, !congested, !queuedBefore, let rttMs, rttMs < c.lossyBelowRttMs, queueing < c.queueingMs / 2, next.bitrateKbps < c.lossyKbps,
           !setting.fec || !boostHeldOff {
            next.bitrateKbps = min(c.maxKbps, c.lossyKbps)
            lastChange = now
            pendingCount = 0
        }
        next.frameMs = next.bitrateKbps < c.longestFramesBelowKbps ? 60 : (next.bitrateKbps < c.longerFramesBelowKbps ? 40 : 20)
        guard next != setting else { return nil }
        setting = next
        return next
    }
}

