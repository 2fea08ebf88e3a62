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
                let task = dataTask(with: request) { data, response, error in
                    if let error {
                        continuation.resume(throwing: error)
                    } else if let data, let response {
                        continuation.resume(returning: (data, response))
                    } else {
                        continuation.resume(throwing: URLError(.badServerResponse))
                    }
                }
                pending.start(task)
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
private final class PendingDataTask: @unchecked Sendable {
    private let lock = NSLock()
    private var task: URLSessionDataTask?
    private var cancelled = false

    func start(_ task: URLSessionDataTask) {
        let cancelled = lock.withLock {
            self.task = task
            return self.cancelled
        }
        task.resume()
        if cancelled { task.cancel() }
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
