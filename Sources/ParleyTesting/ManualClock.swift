import Foundation

/// A clock that moves only when a test moves it, so a 45-second timeout runs in no time.
/// Sleepers wake (within a millisecond) once `advance(by:)` has moved the clock past their deadline.
public final class ManualClock: Clock, @unchecked Sendable {
    public struct Instant: InstantProtocol, Hashable {
        public var offset: Duration
        public func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        public func duration(to other: Instant) -> Duration { other.offset - offset }
        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private let lock = NSLock()
    private var current = Instant(offset: .zero)
    /// Unix milliseconds at offset zero.
    public let wallOrigin: Int64 = 1_767_225_600_000

    public init() {}

    public var now: Instant { lock.withLock { current } }
    public var minimumResolution: Duration { .milliseconds(1) }

    public func advance(by duration: Duration) {
        lock.withLock { current = current.advanced(by: duration) }
    }

    /// Unix milliseconds now: the wall clock moves with this clock.
    public var wallNow: Int64 {
        let offset = now.offset.components
        return wallOrigin + offset.seconds * 1000 + offset.attoseconds / 1_000_000_000_000_000
    }

    public func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        lock.withLock { sleepers[deadline, default: 0] += 1 }
        defer {
            lock.withLock {
                sleepers[deadline, default: 1] -= 1
                if sleepers[deadline] == 0 { sleepers[deadline] = nil }
            }
        }
        while now < deadline {
            try await Task.sleep(for: .milliseconds(1))
        }
    }

    private var sleepers: [Instant: Int] = [:]

    /// Whether something sleeps until `deadline` now: a test waits for this before advancing the
    /// clock, or a sleep that starts after the advance would wait from the later time.
    public func hasSleeper(until deadline: Instant) -> Bool {
        lock.withLock { sleepers[deadline] != nil }
    }
}
