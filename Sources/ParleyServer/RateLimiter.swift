/// A token bucket per connection (protocol v1: 50 frames/s sustained, burst 200) and the count
/// of refused frames that closes a flooding connection (more than 100 within 2 s → 4008).
/// A rate of 0 admits everything (an operator's choice, for a benchmark).
struct RateLimiter {
    enum Verdict: Equatable {
        case allow
        case refuse
        /// Refused, and the connection has been refused too often: close it.
        case close
    }

    private let rate: Double
    private let burst: Double
    private let maxRefused: Int
    private let refusedWindow: Duration
    private var tokens: Double
    private var lastRefill: Duration
    private var refusals: [Duration] = []

    /// `now` is any monotonic time, as a duration since a fixed origin.
    init(rate: Double, burst: Double, maxRefused: Int, refusedWindow: Duration, now: Duration) {
        self.rate = rate
        self.burst = burst
        self.maxRefused = maxRefused
        self.refusedWindow = refusedWindow
        self.tokens = burst
        self.lastRefill = now
    }

    mutating func admit(now: Duration) -> Verdict {
        guard rate > 0 else { return .allow }
        let elapsed = now - lastRefill
        if elapsed > .zero {
            tokens = min(burst, tokens + rate * Self.seconds(elapsed))
            lastRefill = now
        }
        if tokens >= 1 {
            tokens -= 1
            return .allow
        }
        refusals.removeAll { now - $0 > refusedWindow }
        refusals.append(now)
        return refusals.count > maxRefused ? .close : .refuse
    }

    private static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}
