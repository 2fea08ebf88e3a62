import Foundation
import Logging
import NIOConcurrencyHelpers
import ParleyProtocol

/// Writes the hub's calls to the store off the hub's path.
///
/// The hub hands over a call each time it changes (`save`) and goes on at once; a task of the
/// writer's own writes what has gathered, one transaction a batch, so a slow or locked database
/// delays records, never signaling. Only the newest state of a call is written: a call that rang,
/// was answered and ended while the previous batch was being written is one row in the next.
/// A failed batch stays queued and is retried with backoff, merged with newer states; `flush()`
/// waits until everything handed over is in the store (graceful shutdown, tests).
///
/// What a crash can lose is the batch being written at that instant: milliseconds of changes, and
/// never a call's existence once it has been written once.
public final class CallRecordWriter: Sendable {
    private struct State {
        var pending: [CallID: StoredCall] = [:]
        /// First-handed-over order, so calls are written in the order they started.
        var order: [CallID] = []
        var writing = false
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter: UInt64 = 0
        var inFlight: Set<CallID> = []
    }

    private let store: any SignalingStore
    private let logger: Logger
    private let state = NIOLockedValueBox(State())
    private let maxBackoff: Duration

    public init(store: any SignalingStore, logger: Logger, maxBackoff: Duration = .seconds(5)) {
        self.store = store
        self.logger = logger
        self.maxBackoff = maxBackoff
    }

    /// Queues the newest state of a call; returns at once.
    public func save(_ call: StoredCall) {
        let start: Bool = state.withLockedValue { state in
            if state.pending.updateValue(call, forKey: call.record.call) == nil { state.order.append(call.record.call) }
            guard !state.writing else { return false }
            state.writing = true
            return true
        }
        if start { startWriting() }
    }

    /// Whether a call has changes not yet in the store.
    public func isPending(_ call: CallID) -> Bool {
        state.withLockedValue { $0.pending[call] != nil || $0.inFlight.contains(call) }
    }

    /// Returns once everything saved before the call is in the store, or when the task is cancelled
    /// (a store that keeps failing must not hold a shutdown forever).
    public func flush() async {
        let id = state.withLockedValue { state in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let done: Bool = state.withLockedValue { state in
                    guard state.writing, !Task.isCancelled else { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if done { continuation.resume() }
            }
        } onCancel: {
            state.withLockedValue { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }

    private func startWriting() {
        // Detached: the hub's actor hands over and goes on; the writes never run on it.
        Task.detached { [self] in await writeUntilDrained() }
    }

    private func writeUntilDrained() async {
        var backoff = Duration.milliseconds(50)
        while true {
            let batch: [StoredCall] = state.withLockedValue { state in
                let batch = state.order.compactMap { state.pending[$0] }
                state.inFlight = Set(state.order)
                state.pending = [:]
                state.order = []
                return batch
            }
            if batch.isEmpty {
                let waiters: [CheckedContinuation<Void, Never>]? = state.withLockedValue { state in
                    // Something may have arrived since the batch was taken: keep going then.
                    guard state.pending.isEmpty else { return nil }
                    state.writing = false
                    state.inFlight = []
                    defer { state.waiters = [:] }
                    return Array(state.waiters.values)
                }
                guard let waiters else { continue }
                for waiter in waiters { waiter.resume() }
                return
            }
            do {
                try await store.saveCalls(batch)
                backoff = .milliseconds(50)
                state.withLockedValue { $0.inFlight = [] }
            } catch {
                logger.error("could not store call records; retrying", metadata: ["calls.count": "\(batch.count)", "error": "\(error)"])
                state.withLockedValue { state in
                    // Newer states handed over meanwhile win over the failed batch's.
                    for call in batch where state.pending[call.record.call] == nil {
                        state.pending[call.record.call] = call
                        state.order.append(call.record.call)
                    }
                }
                // Not cancellable: the writer ends only when everything is written.
                try? await Task.sleep(for: backoff)
                backoff = min(backoff * 2, maxBackoff)
            }
        }
    }
}
