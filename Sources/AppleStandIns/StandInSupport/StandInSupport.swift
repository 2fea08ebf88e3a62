// Plumbing shared by the stand-ins for Apple's frameworks (Linux only; not an Apple module).

import Foundation

/// A value behind a lock: the system state a stand-in keeps.
public final class StandInLockedBox<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    public init(_ value: Value) { self.value = value }

    public func withLock<T>(_ body: (inout Value) throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

/// Objects the system hands to another queue (a delegate and its arguments), as Apple's frameworks
/// do without Swift's checking.
public struct StandInUnchecked<Value>: @unchecked Sendable {
    public let value: Value
    public init(_ value: Value) { self.value = value }
}
