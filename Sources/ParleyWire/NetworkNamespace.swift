import CParleyNet
import Foundation

/// A named network namespace (`ip netns`), for tests and benchmarks that put each end of a call
/// on its own side of a wire. Needs root.
public struct NetworkNamespace: Hashable, Sendable {
    public let name: String

    public init(_ name: String) { self.name = name }

    public var exists: Bool { FileManager.default.fileExists(atPath: "/run/netns/\(name)") }

    /// Makes the namespace with its loopback up, and IPv6 off so that only the test's IPv4
    /// addresses take part in ICE.
    public static func create(_ name: String) throws -> NetworkNamespace {
        let namespace = NetworkNamespace(name)
        try runIP(["netns", "add", name])
        do {
            try runIP(["-n", name, "link", "set", "lo", "up"])
            // A kernel without IPv6 has nothing to turn off.
            if FileManager.default.fileExists(atPath: "/proc/sys/net/ipv6") {
                try namespace.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])
            }
        } catch {
            namespace.delete()
            throw error
        }
        return namespace
    }

    /// Removes the name; processes still inside keep the namespace until they exit.
    public func delete() {
        try? Self.runIP(["netns", "delete", name])
    }

    /// The command line that runs `arguments` inside this namespace.
    public func command(_ arguments: [String]) -> [String] { ["ip", "netns", "exec", name] + arguments }

    /// Runs a command inside this namespace to its end, throwing with its error output when it fails.
    public func run(_ arguments: [String]) throws {
        try Self.runIP(["netns", "exec", name] + arguments)
    }

    /// Runs `body` on a thread of its own inside this namespace: the sockets it opens belong to
    /// the namespace for their whole life, whichever thread uses them later.
    public func perform<T: Sendable>(_ body: @escaping @Sendable () throws -> T) throws -> T {
        let path = "/run/netns/\(name)"
        let box = ResultBox<T>()
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            defer { done.signal() }
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                box.result = .failure(WireError("cannot open \(path): \(String(cString: strerror(errno)))"))
                return
            }
            defer { close(fd) }
            guard parley_enter_network_namespace(fd) == 0 else {
                box.result = .failure(WireError("cannot enter the network namespace \(name): \(String(cString: strerror(errno)))"))
                return
            }
            box.result = Result { try body() }
        }
        thread.start()
        done.wait()
        return try box.result!.get()
    }

    /// Runs `ip` with `arguments` to its end, throwing with its error output when it fails.
    public static func runIP(_ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["ip"] + arguments
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let message = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw WireError("ip \(arguments.joined(separator: " ")) failed: \(message.trimmingWhitespace)")
        }
    }
}

private final class ResultBox<T>: @unchecked Sendable {
    var result: Result<T, any Error>?
}

public struct WireError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}
