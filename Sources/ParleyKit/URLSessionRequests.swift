import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

extension URLSession {
    /// `data(for:)`, which a cancelled caller can stop on every platform.
    ///
    /// On Linux, swift-corelibs-foundation's `data(for:)` cancels its request from inside the
    /// task's cancellation handler, which runs under the task's status lock, and waits there on the
    /// session's queue; the completion on that queue resumes the continuation, which needs the same
    /// lock: the two wait for each other for good (seen in the tests, leaving the test process
    /// unable to exit). Here the request is a data task whose cancellation is sent from another
    /// thread. On Apple platforms this is `data(for:)`.
    public func dataCancellably(for request: URLRequest) async throws -> (Data, URLResponse) {
        #if canImport(FoundationNetworking)
        let pending = PendingDataTask()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<(Data, URLResponse), any Error>) in
                let started = pending.start {
                    dataTask(with: request) { data, response, error in
                        if let error {
                            continuation.resume(throwing: error)
                        } else if let data, let response {
                            continuation.resume(returning: (data, response))
                        } else {
                            continuation.resume(throwing: URLError(.badServerResponse))
                        }
                    }
                }
                // Cancelled before it began: no task is made, as `data(for:)` would end.
                if !started { continuation.resume(throwing: URLError(.cancelled)) }
            }
        } onCancel: {
            DispatchQueue.global().async { pending.cancel() }
        }
        #else
        return try await data(for: request)
        #endif
    }
}

#if canImport(FoundationNetworking)
/// A data task and whether it was cancelled, either first.
///
/// A request cancelled before it began is never made: corelibs-foundation's `cancel()` right after
/// `resume()` races the task's own end (a refused connection ends it at once), and a cancel that
/// comes after the session has let the task go stops the process ("Trying to access a behaviour for
/// a task that in not in the registry", seen in CI when a sign-out cancelled a registration).
private final class PendingDataTask: @unchecked Sendable {
    private let lock = NSLock()
    private var task: URLSessionDataTask?
    private var cancelled = false

    /// Makes the task with `make` and resumes it, unless the request was cancelled first (false).
    func start(_ make: () -> URLSessionDataTask) -> Bool {
        // Resumed under the lock, so a cancel never reaches a task that was not resumed yet.
        lock.withLock {
            guard !cancelled else { return false }
            let task = make()
            self.task = task
            task.resume()
            return true
        }
    }

    func cancel() {
        let task = lock.withLock {
            cancelled = true
            return self.task
        }
        task?.cancel()
    }
}
#endif
