import Logging
import NIOConcurrencyHelpers

/// Who may try a LAN listener's PIN: `pinAttempts` tries per address at once, then one every
/// `lockout / pinAttempts`, right or wrong; and, since addresses are cheap on a LAN, no more than
/// `networkFailures` wrong PINs from the whole network within `lockout × 10` — past that, nobody
/// gets a token until the window has passed, and the listener's log says why.
final class LANGate: Sendable {
    enum Admission: Equatable {
        case admitted
        /// `everyone`: the whole network is locked out, not just this address.
        case wait(Duration, everyone: Bool)
    }

    static let networkFailures = 20

    private let perAddress: AddressRateLimiter
    private let window: Duration
    private let failures = NIOLockedValueBox<[ContinuousClock.Instant]>([])
    private let logger: Logger

    init(settings: LANSettings, logger: Logger) {
        let lockout = max(Double(settings.lockout.components.seconds), 1)
        perAddress = AddressRateLimiter(rate: Double(settings.pinAttempts) / lockout, burst: Double(settings.pinAttempts))
        window = settings.lockout * 10
        self.logger = logger
    }

    func admit(address: String, now: ContinuousClock.Instant = .now) -> Admission {
        let locked: Duration? = failures.withLockedValue { failures in
            failures.removeAll { now - $0 >= window }
            guard failures.count >= Self.networkFailures, let oldest = failures.first else { return nil }
            return window - (now - oldest)
        }
        if let locked { return .wait(locked, everyone: true) }
        if let wait = perAddress.admit(address) { return .wait(wait, everyone: false) }
        return .admitted
    }

    func failed(now: ContinuousClock.Instant = .now) {
        let count = failures.withLockedValue { failures in
            failures.append(now)
            return failures.count
        }
        if count == Self.networkFailures {
            logger.warning("\(count) wrong PINs from this network: no caller gets a token for a while; is someone guessing?")
        }
    }

    /// Control and format characters (terminal escapes, new lines, bidirectional overrides).
    static func hasControlCharacters(_ text: String) -> Bool {
        text.unicodeScalars.contains {
            switch $0.properties.generalCategory {
            case .control, .format, .lineSeparator, .paragraphSeparator: true
            default: false
            }
        }
    }
}
