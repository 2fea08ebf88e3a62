import Foundation
#if canImport(Glibc)
import Glibc
#endif

public struct TestFailure: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}


/// Waits until `condition` holds, checking every 5 ms; throws `TestFailure` naming `message` when
/// `timeout` passes first.
public func eventually(timeout: Duration = .seconds(10), _ message: @autoclosure () -> String = "condition",
                       _ condition: () async throws -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(5))
    }
    throw TestFailure("\(message()) did not become true in time")
}

/// Runs blocking work (a socket read, waiting for a process) on a thread of its own: blocking the
/// cooperative pool (two threads on a two-core machine) starves everything else in the process,
/// an in-process server included.
public func offThePool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}

/// Stops a child process by its PID: `signal` first, SIGKILL if it is still running after `grace`;
/// returns once it has exited.
public func stopProcess(_ process: Process, with signal: Int32, grace: TimeInterval) {
    guard process.isRunning else { return }
    kill(process.processIdentifier, signal)
    let deadline = Date().addingTimeInterval(grace)
    while process.isRunning, Date() < deadline { usleep(20_000) }
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    process.waitUntilExit()
}
