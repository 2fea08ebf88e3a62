/// Adaptive audio bitrate: what the encoder should run at, from the call's measured loss and RTT.
///
/// - Down ×`decreaseFactor` when loss is above `decreaseAbovePct`; up ×`increaseFactor` when loss is
///   below `increaseBelowPct` and a measured RTT under `increaseBelowRttMs` (never on an RTT not yet
///   measured); always within `minKbps…maxKbps`.
/// - Hysteresis: a condition must hold for `confirmations` reports in a row before it acts.
/// - Hold-off: after any change, no increase for `increaseHoldOff` and no further decrease for
///   `decreaseHoldOff`, so one burst of loss does not send the rate up and down.
/// - Opus in-band FEC turns on, with the measured loss as the encoder's expected-loss hint, once
///   loss exceeds `fecAbovePct`, and off again once it stays below `fecOffBelowPct`.
public struct BitrateController: Sendable {
    public struct Configuration: Hashable, Sendable {
        public var minKbps: Double = 32
        public var maxKbps: Double = 256
        /// Where the encoder starts (`MediaEngineConfiguration.opusBitrate` is the same 32 kbit/s).
        public var startKbps: Double = 32
        public var decreaseAbovePct: Double = 5
        public var decreaseFactor: Double = 0.8
        public var increaseBelowPct: Double = 1
        public var increaseBelowRttMs: Double = 100
        public var increaseFactor: Double = 1.2
        public var confirmations: Int = 2
        public var increaseHoldOff: Duration = .seconds(6)
        public var decreaseHoldOff: Duration = .seconds(2)
        public var fecAbovePct: Double = 1
        public var fecOffBelowPct: Double = 0.5

        public init() {}
    }

    /// What the encoder should do now.
    public struct Setting: Hashable, Sendable {
        public var bitrateKbps: Double
        public var fec: Bool
        /// Opus's packet-loss-percentage hint, 0…100.
        public var expectedLossPct: Int

        public init(bitrateKbps: Double, fec: Bool, expectedLossPct: Int) {
            self.bitrateKbps = bitrateKbps
            self.fec = fec
            self.expectedLossPct = expectedLossPct
        }
    }

    public let configuration: Configuration
    public private(set) var setting: Setting
    private var lastChange: Duration?
    private var pendingDirection = 0
    private var pendingCount = 0

    public init(configuration: Configuration = Configuration()) {
        precondition(configuration.minKbps <= configuration.maxKbps, "minKbps must not exceed maxKbps")
        self.configuration = configuration
        let start = min(configuration.maxKbps, max(configuration.minKbps, configuration.startKbps))
        setting = Setting(bitrateKbps: start, fec: false, expectedLossPct: 0)
    }

    /// Takes a quality report at time `now`: the loss of what we send, and the round trip, nil while
    /// none was measured. Answers the new setting when it changed.
    public mutating func update(lossPct: Double, rttMs: Double?, now: Duration) -> Setting? {
        let c = configuration
        var next = setting

        if lossPct > c.fecAbovePct {
            next.fec = true
            next.expectedLossPct = min(100, Int(lossPct.rounded(.up)))
        } else if lossPct < c.fecOffBelowPct {
            next.fec = false
            next.expectedLossPct = 0
        }

        let direction = lossPct > c.decreaseAbovePct ? -1
            : (lossPct < c.increaseBelowPct && (rttMs.map { $0 < c.increaseBelowRttMs } ?? false) ? 1 : 0)
        if direction == 0 || direction != pendingDirection {
            pendingDirection = direction
            pendingCount = direction == 0 ? 0 : 1
        } else {
            pendingCount += 1
        }
        let holdOff = direction > 0 ? c.increaseHoldOff : c.decreaseHoldOff
        let heldOff = lastChange.map { now - $0 < holdOff } ?? false
        if direction != 0, pendingCount >= c.confirmations, !heldOff {
            let factor = direction > 0 ? c.increaseFactor : c.decreaseFactor
            let rate = min(c.maxKbps, max(c.minKbps, setting.bitrateKbps * factor))
            if rate != setting.bitrateKbps {
                next.bitrateKbps = rate
                lastChange = now
                pendingCount = 0
            }
        }
        guard next != setting else { return nil }
        setting = next
        return next
    }
}
