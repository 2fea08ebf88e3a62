import Foundation

/// A clock that moves only when a test moves it, so timeouts run in no time.
final class ManualClock: Clock, @unchecked Sendable {
    struct Instant: InstantProtocol {
        var offset: Duration
        func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        func duration(to other: Instant) -> Duration { other.offset - offset }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private let lock = NSLock()
    private var current = Instant(offset: .zero)
    /// Unix milliseconds at offset zero.
    let wallOrigin: Int64 = 1_767_225_600_000

    var now: Instant { lock.withLock { current } }
    var minimumResolution: Duration { .milliseconds(1) }

    func advance(by duration: Duration) {
        lock.withLock { current = current.advanced(by: duration) }
    }

    /// Unix milliseconds now: the wall clock moves with this clock.
    var wallNow: Int64 {
        let offset = now.offset.components
        return wallOrigin + offset.seconds * 1000 + offset.attoseconds / 1_000_000_000_000_000
    }

    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        while now < deadline {
            try await Task.sleep(for: .milliseconds(1))
        }
    }
}
