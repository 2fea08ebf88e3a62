import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ParleyProtocol
import ServiceLifecycle

/// Writes the hub's calls to the store off the hub's path.
///
/// The hub hands over a call each time it changes (`save`) and goes on at once; the writer's
/// `run()`, a service of the server's, writes what has gathered, one transaction a batch, so a slow
/// or locked database delays records, never signaling. A batch gathers for `gathering` (5 ms) from
/// the first change handed over after the last batch was written, then goes in: many calls' changes
/// in one statement, not one each. Only the newest state of a call is written: a call that rang, was
/// answered and ended within one batch's time is one row. A failed batch stays queued and is retried
/// with backoff, merged with newer states; `flush()` waits until everything handed over is in the
/// store (graceful shutdown, tests).
///
/// What a crash can lose is the batch gathering or being written at that instant: milliseconds of
/// changes, and never a call's existence once it has been written once.
public final class CallRecordWriter: Service, Sendable {
    private struct State {
        var pending: [CallID: StoredCall] = [:]
        /// First-handed-over order, so calls are written in the order they started.
        var order: [CallID] = []
        var writing = false
        /// Changes handed over so far, counted; those up to `writtenThrough` are in the store, those
        /// up to `takenThrough` were in a batch taken.
        var handedOver: UInt64 = 0
        var takenThrough: UInt64 = 0
        var writtenThrough: UInt64 = 0
        /// `flush()`es waiting, each for the changes up to its count.
        var waiters: [UInt64: (through: UInt64, continuation: CheckedContinuation<Void, Never>)] = [:]
        var nextWaiter: UInt64 = 0
        var inFlight: Set<CallID> = []
        /// A graceful shutdown began: a failed batch is not retried any more, the last try is next.
        var stopping = false
    }

    private let store: any SignalingStore
    private let logger: Logger
    private let state = NIOLockedValueBox(State())
    private let maxBackoff: Duration
    private let gathering: Duration
    private let pause: @Sendable (Duration) async -> Void
    /// Wakes `run()` when a call is handed over while it has nothing to write.
    private let wakeups: AsyncStream<Void>
    private let wake: AsyncStream<Void>.Continuation

    /// `pause` waits out a batch's gathering (tests hold it to see what gathers).
    public init(store: any SignalingStore, logger: Logger, maxBackoff: Duration = .seconds(5),
                gathering: Duration = .milliseconds(5),
                pause: @escaping @Sendable (Duration) async -> Void = CallRecordWriter.pauseOnEventLoop) {
        self.store = store
        self.logger = logger
        self.maxBackoff = maxBackoff
        self.gathering = gathering
        self.pause = pause
        (wakeups, wake) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Writes what is handed over until the task is cancelled, or until a graceful shutdown: then
    /// what is left gets one more try (a store that keeps failing must not hold the process; what
    /// is not written is logged, and its calls end by resume expiry at the next start). The server
    /// stops it after the hub has flushed, and before it closes the store.
    public func run() async {
        await withGracefulShutdownHandler {
            for await _ in wakeups { await writeUntilDrained(retrying: true) }
            guard !Task.isCancelled else { return }
            await writeUntilDrained(retrying: false)
        } onGracefulShutdown: {
            self.state.withLockedValue { $0.stopping = true }
            self.wake.finish()
        }
    }

    /// Waits `duration` (or until the task is cancelled) on a timer of one of NIO's event loops,
    /// kept in its own wait for sockets. On Linux a `Task.sleep` arms a dispatch timer through
    /// libdispatch's manager thread, woken for each: for a writer that gathers some 150 batches a
    /// second, that was 0.8 % of a busy server's CPU (docs/benchmarks.md).
    @Sendable public static func pauseOnEventLoop(_ duration: Duration) async {
        let timer = MultiThreadedEventLoopGroup.singleton.any().scheduleTask(in: TimeAmount(duration)) {}
        await withTaskCancellationHandler {
            _ = try? await timer.futureResult.get()
        } onCancel: {
            timer.cancel()
        }
    }

    /// Queues the newest state of a call; returns at once.
    public func save(_ call: StoredCall) {
        let start: Bool = state.withLockedValue { state in
            state.handedOver += 1
            if state.pending.updateValue(call, forKey: call.record.call) == nil { state.order.append(call.record.call) }
            guard !state.writing else { return false }
            state.writing = true
            return true
        }
        if start { wake.yield() }
    }

    /// Whether a call has changes not yet in the store.
    public func isPending(_ call: CallID) -> Bool {
        state.withLockedValue { $0.pending[call] != nil || $0.inFlight.contains(call) }
    }

    /// Returns once everything saved before the call is in the store (written by `run()`; what is
    /// saved meanwhile is not waited for), or when the task is cancelled (a store that keeps failing
    /// must not hold a shutdown, or a read of the history, forever). A batch that someone waits for
    /// does not gather.
    public func flush() async {
        let (id, through) = state.withLockedValue { state in
            state.nextWaiter += 1
            return (state.nextWaiter, state.handedOver)
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let done: Bool = state.withLockedValue { state in
                    guard state.writtenThrough < through, !Task.isCancelled else { return true }
                    state.waiters[id] = (through, continuation)
                    return false
                }
                if done { continuation.resume() }
            }
        } onCancel: {
            state.withLockedValue { $0.waiters.removeValue(forKey: id) }?.continuation.resume()
        }
    }

    /// The changes up to `through` are in the store: the flushes waiting for no more are answered.
    private func written(through: UInt64) {
        let answered: [CheckedContinuation<Void, Never>] = state.withLockedValue { state in
            state.writtenThrough = max(state.writtenThrough, through)
            let done = state.waiters.filter { $0.value.through <= state.writtenThrough }
            for id in done.keys { state.waiters[id] = nil }
            return done.values.map(\.continuation)
        }
        for continuation in answered { continuation.resume() }
    }

    /// Writes batches until nothing is left; a failed batch is tried again with backoff while
    /// `retrying` and the task is not cancelled.
    private func writeUntilDrained(retrying: Bool) async {
        var backoff = Duration.milliseconds(50)
        let stopping = { self.state.withLockedValue { $0.stopping } }
        while true {
            // Gathers only with something to gather (a writer with nothing to write goes idle at
            // once); the last try at a stop writes at once.
            if retrying, !stopping(), gathering > .zero, state.withLockedValue({ !$0.pending.isEmpty && $0.waiters.isEmpty }) {
                await pause(gathering)
            }
            let batch: [StoredCall] = state.withLockedValue { state in
                let batch = state.order.compactMap { state.pending[$0] }
                state.takenThrough = state.handedOver
                state.inFlight = Set(state.order)
                state.pending = [:]
                state.order = []
                return batch
            }
            if batch.isEmpty {
                let idle: UInt64? = state.withLockedValue { state in
                    // Something may have arrived since the batch was taken: keep going then.
                    guard state.pending.isEmpty else { return nil }
                    state.writing = false
                    state.inFlight = []
                    return state.handedOver
                }
                guard let idle else { continue }
                // Nothing pending and nothing in flight: everything handed over is written.
                written(through: idle)
                return
            }
            do {
                try await store.saveCalls(batch)
                backoff = .milliseconds(50)
                let through = state.withLockedValue { state in
                    state.inFlight = []
                    return state.takenThrough
                }
                written(through: through)
            } catch {
                state.withLockedValue { state in
                    // Newer states handed over meanwhile win over the failed batch's.
                    for call in batch where state.pending[call.record.call] == nil {
                        state.pending[call.record.call] = call
                        state.order.append(call.record.call)
                    }
                    state.inFlight = []
                }
                let metadata: Logger.Metadata = ["calls.count": "\(batch.count)", "error": "\(error)"]
                if retrying, !stopping() { logger.error("could not store call records; retrying", metadata: metadata) }
                // The backoff ends early at a graceful shutdown, and the retries with it: the last try
                // comes next (`run()`).
                guard retrying, !stopping(),
                      (try? await cancelWhenGracefulShutdown({ [backoff] in try await Task.sleep(for: backoff) })) != nil,
                      !stopping() else {
                    if !retrying || Task.isCancelled {
                        logger.error("could not store call records; they stay unwritten as the writer stops", metadata: metadata)
                    }
                    return
                }
                backoff = min(backoff * 2, maxBackoff)
            }
        }
    }
}
