import ParleyProtocol

/// One reading of a peer connection's statistics. Counters are cumulative, as WebRTC reports them.
public struct MediaStatsSample: Hashable, Sendable {
    /// When the reading was taken, on any monotonic timeline.
    public var at: Duration
    public var roundTripTimeMs: Double?
    public var jitterMs: Double?
    public var packetsReceived: Int
    public var packetsLost: Int
    public var bytesSent: Int
    public var bytesReceived: Int
    /// 0…1, of the received audio.
    public var audioLevel: Double?
    /// The share of what we send that the far side lost, percent, from its last receiver report
    /// (RTCP); nil before the first. This, not what we lose receiving, is what our encoder adapts to.
    public var remoteLossPct: Double?
    public var packetsSent: Int
    /// Packets we sent that the far side asked for again (RTCP NACK). Where retransmission repairs
    /// the loss its receiver reports show none; these asks still count what the network dropped.
    public var retransmissionsAsked: Int
    /// Of the packets the listener missed (`packetsLost`), those the engine saw as gaps in what its
    /// jitter buffer let out, and in how many runs of consecutive packets: how bursty the loss is
    /// (G.107's BurstR). Both 0 where the engine cannot tell, which reads as random loss.
    public var gapPackets: Int
    public var gapRuns: Int

    public init(at: Duration, roundTripTimeMs: Double? = nil, jitterMs: Double? = nil, packetsReceived: Int = 0,
                packetsLost: Int = 0, bytesSent: Int = 0, bytesReceived: Int = 0, audioLevel: Double? = nil,
                remoteLossPct: Double? = nil, packetsSent: Int = 0, retransmissionsAsked: Int = 0,
                gapPackets: Int = 0, gapRuns: Int = 0) {
        self.at = at
        self.roundTripTimeMs = roundTripTimeMs
        self.jitterMs = jitterMs
        self.packetsReceived = packetsReceived
        self.packetsLost = packetsLost
        self.bytesSent = bytesSent
        self.bytesReceived = bytesReceived
        self.audioLevel = audioLevel
        self.remoteLossPct = remoteLossPct
        self.packetsSent = packetsSent
        self.retransmissionsAsked = retransmissionsAsked
        self.gapPackets = gapPackets
        self.gapRuns = gapRuns
    }
}

/// A call's quality over the last interval, smoothed.
public struct QualityReport: Hashable, Sendable {
    /// Mean opinion score, 1…4.5, from the E-model (see `EModel`): conversational quality, which
    /// counts the mouth-to-ear delay as well as what is lost.
    public var mos: Double
    /// 1…5 bars, from the E-model's user-satisfaction bands.
    public var score: Int
    /// The round trip, smoothed for the E-model; 0 until one was measured (`latestRttMs`).
    public var rttMs: Double
    /// The newest round trip measured, nil before the first: what decisions use (a smoothed value
    /// that averages in the time before any was measured reads low).
    public var latestRttMs: Double?
    public var jitterMs: Double
    public var lossPct: Double
    /// Received bitrate.
    public var bitrateKbps: Double
    public var audioLevel: Double?
    /// What the far side lost of what we send, percent, before any retransmission repaired it: the
    /// larger of its reports and its asks for packets again (see `MediaStatsSample`), smoothed.
    public var remoteLossPct: Double?
    /// The last interval's loss, far-side loss and jitter, unsmoothed: a change of path shows here a
    /// window before the means above have taken it in (see `BitrateController.update(_:now:)`).
    public var latestLossPct: Double = 0
    public var latestRemoteLossPct: Double?
    public var latestJitterMs: Double = 0
    /// What a listener hears, with the delay left out (`EModel.listeningRating`): the figure a
    /// listening test such as PESQ scores, and the one the E-model's Opus values are fitted to.
    public var listeningMos: Double = 4.5
    /// The mean of the round trips measured in the window, nil before the first: a queue raises it,
    /// where jitter only spreads single round trips around it.
    public var meanMeasuredRttMs: Double?
    /// How bursty the loss in the window was: the mean run of consecutive lost packets over the mean
    /// run random loss of the same rate would make (G.107's BurstR); 1 for random loss or none.
    public var burstRatio: Double = 1
    /// The highest `bitrateKbps` of the last ten seconds: what the far side's codec runs at while it
    /// speaks (the E-model's Ie grows below 20 kbit/s, `EModel.fullQualityKbps`).
    public var codecKbps: Double = 0
    /// Packets received in the latest interval. None: nothing to rate, and no MOS is shown.
    public var receivedPackets: Int = 0

    /// The form `call.report` carries.
    public var callQuality: CallQuality {
        CallQuality(mos: (mos * 100).rounded() / 100, rttMs: rttMs.rounded(), jitterMs: jitterMs.rounded(),
                    lossPct: (lossPct * 10).rounded() / 10, bitrateKbps: bitrateKbps.rounded())
    }
}

/// The ITU-T G.107 E-model, simplified as in Cole & Rosenbluth, "Voice over IP performance
/// monitoring" (ACM CCR 31(2), 2001), with every parameter but delay and loss at its G.107 default:
///
///     R   = 93.2 − Id − Ie,eff
///     Id  = 0.024·d + 0.11·(d − 177.3)·H(d − 177.3)        d: one-way mouth-to-ear delay, ms
///     Ie,eff = Ie + (95 − Ie) · Ppl / (Ppl + Bpl)           Ppl: packet loss, %
///     MOS = 1 + 0.035·R + 7·10⁻⁶·R·(R − 60)·(100 − R)       (1 below R = 0, 4.5 above R = 100)
///
/// with G.107's burst ratio in the loss term, `Ie,eff = Ie + (95 − Ie) · Ppl / (Ppl / BurstR + Bpl)`,
/// and an Ie that grows below a codec bitrate: `Ie + k · max(0, full − kbit/s)`.
///
/// The one-way delay is half the round trip plus the jitter buffer (taken as twice the jitter) plus
/// the codec's framing and look-ahead. G.113 lists no Ie/Bpl for Opus. `opus` uses Ie = 11,
/// Bpl = 19 and 5 per kbit/s below 20 kbit/s, fitted to PESQ (P.862.2 wideband) over the impairment
/// matrix of `scripts/bench-quality.sh` (docs/quality.md) with Ie held where a clean call scores as
/// PESQ hears it: in that run the estimate strays at most 0.37 from PESQ in any cell, and fitted on
/// two of its three runs it strays at most 0.46 in the third. The loss it takes is what the
/// listener missed (before FEC's repair), so Bpl carries Parley's FEC and concealment.
public struct EModel: Hashable, Sendable {
    public var equipmentImpairment: Double
    public var packetLossRobustness: Double
    /// Framing plus look-ahead of the codec, ms.
    public var codecDelayMs: Double
    /// The codec bitrate (kbit/s) from which the codec sounds as `equipmentImpairment` says; below
    /// it, each missing kbit/s adds `impairmentPerMissingKbps` (Opus at 12 kbit/s in 60 ms frames is
    /// not Opus at 32). 0: one Ie for every bitrate.
    public var fullQualityKbps: Double
    public var impairmentPerMissingKbps: Double

    public static let opus = EModel(equipmentImpairment: 11, packetLossRobustness: 19, codecDelayMs: 26.5,
                                    fullQualityKbps: 20, impairmentPerMissingKbps: 5)

    public init(equipmentImpairment: Double, packetLossRobustness: Double, codecDelayMs: Double,
                fullQualityKbps: Double = 0, impairmentPerMissingKbps: Double = 0) {
        self.equipmentImpairment = equipmentImpairment
        self.packetLossRobustness = packetLossRobustness
        self.codecDelayMs = codecDelayMs
        self.fullQualityKbps = fullQualityKbps
        self.impairmentPerMissingKbps = impairmentPerMissingKbps
    }

    /// Ie at a codec bitrate (nil or 0: not known, Ie as it is).
    public func impairment(atKbps kbps: Double?) -> Double {
        guard let kbps, kbps > 0 else { return equipmentImpairment }
        return equipmentImpairment + impairmentPerMissingKbps * max(0, fullQualityKbps - kbps)
    }

    public func rating(rttMs: Double, jitterMs: Double, lossPct: Double, burstRatio: Double = 1, codecKbps: Double? = nil) -> Double {
        let delay = rttMs / 2 + 2 * jitterMs + codecDelayMs
        let delayImpairment = 0.024 * delay + (delay > 177.3 ? 0.11 * (delay - 177.3) : 0)
        return listeningRating(lossPct: lossPct, burstRatio: burstRatio, codecKbps: codecKbps) - delayImpairment
    }

    /// The rating without the delay impairment: listening quality (P.800.1's MOS-LQE beside the
    /// E-model's conversational MOS-CQE). A listening test cannot hear delay: over a 24 kbit/s link
    /// with a 2 s queue PESQ scored 1.5 what the E-model, counting 1.5 s mouth to ear, scored 1.0.
    ///
    /// `burstRatio` is G.107's BurstR (1: random loss): losses in runs are worse than the same rate
    /// scattered, as concealment and FEC bridge one packet and not three.
    public func listeningRating(lossPct: Double, burstRatio: Double = 1, codecKbps: Double? = nil) -> Double {
        let loss = max(0, min(100, lossPct))
        let burst = max(1, burstRatio)
        let ie = impairment(atKbps: codecKbps)
        return 93.2 - (ie + (95 - ie) * loss / (loss / burst + packetLossRobustness))
    }

    /// G.107's BurstR from counted loss: the mean run of consecutive lost packets over the mean run
    /// (1 / (1 − p)) random loss at the same rate p makes. 1 without runs.
    public static func burstRatio(lostPackets: Int, runs: Int, lossPct: Double) -> Double {
        guard runs > 0, lostPackets > 0 else { return 1 }
        let p = max(0, min(0.99, lossPct / 100))
        return max(1, Double(lostPackets) / Double(runs) * (1 - p))
    }

    public static func mos(rating r: Double) -> Double {
        if r <= 0 { return 1 }
        if r >= 100 { return 4.5 }
        return 1 + 0.035 * r + 7e-6 * r * (r - 60) * (100 - r)
    }

    /// G.107 Annex B's user-satisfaction bands as 1…5: R ≥ 90 very satisfied (5), ≥ 80 satisfied (4),
    /// ≥ 70 some users dissatisfied (3), ≥ 60 many dissatisfied (2), below that nearly all (1).
    public static func score(rating r: Double) -> Int {
        switch r {
        case 90...: 5
        case 80..<90: 4
        case 70..<80: 3
        case 60..<70: 2
        default: 1
        }
    }
}

/// Turns cumulative statistics into per-interval quality, smoothed over the last `window` intervals.
public struct QualityMonitor: Sendable {
    public let model: EModel
    public let window: Int
    private var previous: MediaStatsSample?
    private var latestRtt: Double?
    private var recent: [(rating: Double, listening: Double, rtt: Double, jitter: Double, loss: Double, bitrate: Double,
                          gapPackets: Int, gapRuns: Int)] = []
    private var recentMeasuredRtt: [Double?] = []
    /// The far side's reported loss over the same window: one report swings with a couple of packets.
    private var recentRemoteLoss: [Double] = []
    /// The window's mean received bitrate at each of the last ten intervals: their highest is the
    /// codec's bitrate (speech lifts it; a pause, whose frames Opus makes small, does not lower it
    /// for ten seconds).
    private var recentBitrates: [Double] = []

    public init(model: EModel = .opus, window: Int = 5) {
        self.model = model
        self.window = max(1, window)
    }

    /// Takes a reading; answers the smoothed report once there are two readings to compare. A
    /// report of an interval in which nothing arrived (`receivedPackets` 0) rates nothing: with no
    /// loss and no jitter its MOS would read as a perfect call nobody heard, and it is not shown
    /// (`CallManager`); what it says of the far side's reception still steers the encoder.
    public mutating func add(_ sample: MediaStatsSample) -> QualityReport? {
        defer { previous = sample }
        guard let previous, sample.at > previous.at else { return nil }
        let seconds = (sample.at - previous.at).seconds
        let received = max(0, sample.packetsReceived - previous.packetsReceived)
        let lost = max(0, sample.packetsLost - previous.packetsLost)
        let loss = received + lost > 0 ? 100 * Double(lost) / Double(received + lost) : 0
        let bitrate = seconds > 0 ? Double(max(0, sample.bytesReceived - previous.bytesReceived)) * 8 / 1000 / seconds : 0
        if let measured = sample.roundTripTimeMs { latestRtt = measured }
        let rtt = sample.roundTripTimeMs ?? recent.last?.rtt ?? 0
        let jitter = sample.jitterMs ?? recent.last?.jitter ?? 0
        let gapPackets = max(0, sample.gapPackets - previous.gapPackets), gapRuns = max(0, sample.gapRuns - previous.gapRuns)
        let burst = EModel.burstRatio(lostPackets: gapPackets, runs: gapRuns, lossPct: loss)
        // The window's mean bitrate, this interval's included, kept for ten intervals.
        let windowBitrates = recent.suffix(window - 1).map(\.bitrate) + [bitrate]
        recentBitrates.append(windowBitrates.reduce(0, +) / Double(windowBitrates.count))
        if recentBitrates.count > 10 { recentBitrates.removeFirst(recentBitrates.count - 10) }
        let codec = recentBitrates.max() ?? 0
        recent.append((model.rating(rttMs: rtt, jitterMs: jitter, lossPct: loss, burstRatio: burst, codecKbps: codec),
                       model.listeningRating(lossPct: loss, burstRatio: burst, codecKbps: codec), rtt, jitter, loss, bitrate, gapPackets, gapRuns))
        if recent.count > window { recent.removeFirst(recent.count - window) }
        recentMeasuredRtt.append(sample.roundTripTimeMs)
        if recentMeasuredRtt.count > window { recentMeasuredRtt.removeFirst(recentMeasuredRtt.count - window) }
        let measured = recentMeasuredRtt.compactMap { $0 }
        // What the far side lost of what we sent: its report, or its asks for packets again where
        // retransmission hid the loss from its report.
        let sent = max(0, sample.packetsSent - previous.packetsSent)
        let asked = max(0, sample.retransmissionsAsked - previous.retransmissionsAsked)
        let askedPct = sent > 0 && asked > 0 ? min(100, 100 * Double(asked) / Double(sent)) : nil
        let remote = [sample.remoteLossPct, askedPct].compactMap { $0 }.max()
        if let remote { recentRemoteLoss.append(remote) }
        if recentRemoteLoss.count > window { recentRemoteLoss.removeFirst(recentRemoteLoss.count - window) }

        func mean(_ values: [Double]) -> Double { values.reduce(0, +) / Double(values.count) }
        let rating = mean(recent.map(\.rating))
        return QualityReport(mos: EModel.mos(rating: rating), score: EModel.score(rating: rating),
                             rttMs: mean(recent.map(\.rtt)), latestRttMs: latestRtt, jitterMs: mean(recent.map(\.jitter)),
                             lossPct: mean(recent.map(\.loss)), bitrateKbps: mean(recent.map(\.bitrate)),
                             audioLevel: sample.audioLevel, remoteLossPct: recentRemoteLoss.isEmpty ? nil : mean(recentRemoteLoss),
                             latestLossPct: loss, latestRemoteLossPct: remote, latestJitterMs: jitter,
                             listeningMos: EModel.mos(rating: mean(recent.map(\.listening))),
                             meanMeasuredRttMs: measured.isEmpty ? nil : mean(measured),
                             burstRatio: EModel.burstRatio(lostPackets: recent.map(\.gapPackets).reduce(0, +),
                                                           runs: recent.map(\.gapRuns).reduce(0, +), lossPct: mean(recent.map(\.loss))),
                             codecKbps: codec, receivedPackets: received)
    }
}

extension Duration {
    /// The duration in seconds, as a `Double`.
    public var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}

/// Whether packets arrive, from a connected call's statistics: silence is `silenceAfter` with no
/// packet received (from the first reading on, so a call that never receives anything counts).
public struct MediaArrivals: Hashable, Sendable {
    public let silenceAfter: Duration
    private var packets = 0
    private var lastArrival: Duration?
    public private(set) var receiving = true

    public init(silenceAfter: Duration) { self.silenceAfter = silenceAfter }

    /// Takes a reading; answers the new state when it changes.
    public mutating func add(_ sample: MediaStatsSample) -> Bool? {
        // A counter that moved arrived, down too: after seconds without a packet GStreamer's RTP
        // session forgets the far side's source, and counts afresh when it comes back.
        let arrived = sample.packetsReceived != packets && sample.packetsReceived > 0
        packets = sample.packetsReceived
        if arrived || lastArrival == nil { lastArrival = sample.at }
        if arrived, !receiving {
            receiving = true
            return true
        }
        if !arrived, receiving, let lastArrival, sample.at - lastArrival >= silenceAfter {
            receiving = false
            return false
        }
        return nil
    }
}
