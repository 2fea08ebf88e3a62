import NIOConcurrencyHelpers

/// A step other services wait for: reached once, or failed with the reason (the cluster joined,
/// the server started, a store's pool closed). Any number of tasks wait; a waiting task that is
/// cancelled stops waiting with `CancellationError`.
final class Milestone: Sendable {
    private typealias Waiter = CheckedContinuation<Void, any Error>

    private enum State {
        case pending([UInt64: Waiter], next: UInt64)
        case settled((any Error)?)
    }

    private let state = NIOLockedValueBox(State.pending([:], next: 0))

    func reach() { settle(nil) }

    /// Fails the milestone, unless it was reached or failed before.
    func fail(_ error: any Error) { settle(error) }

    private func settle(_ failure: (any Error)?) {
        let waiters = state.withLockedValue { state -> [Waiter] in
            guard case .pending(let waiters, _) = state else { return [] }
            state = .settled(failure)
            return Array(waiters.values)
        }
        for waiter in waiters {
            if let failure { waiter.resume(throwing: failure) } else { waiter.resume() }
        }
    }

    /// Returns once the milestone is reached; throws why it failed.
    func wait() async throws {
        let id = state.withLockedValue { state -> UInt64 in
            guard case .pending(let waiters, let next) = state else { return 0 }
            state = .pending(waiters, next: next + 1)
            return next
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (waiter: Waiter) in
                let outcome = state.withLockedValue { state -> Result<Void, any Error>? in
                    switch state {
                    case .settled(let failure):
                        return failure.map { .failure($0) } ?? .success(())
                    case .pending(var waiters, let next):
                        // Cancelled before this wait was registered: the handler found nothing to end.
                        if Task.isCancelled { return .failure(CancellationError()) }
                        waiters[id] = waiter
                        state = .pending(waiters, next: next)
                        return nil
                    }
                }
                if let outcome { waiter.resume(with: outcome) }
            }
        } onCancel: {
            let waiter = state.withLockedValue { state -> Waiter? in
                guard case .pending(var waiters, let next) = state, let waiter = waiters.removeValue(forKey: id) else { return nil }
                state = .pending(waiters, next: next)
                return waiter
            }
            waiter?.resume(throwing: CancellationError())
        }
    }
}
