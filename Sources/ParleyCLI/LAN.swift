import ArgumentParser
import Foundation
import ParleyAvahi
import ParleyKit
import ParleyProtocol

/// `parley lan`: who listens for calls on this network.
struct LAN: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lan",
        abstract: "List the devices listening for calls on this network (parley listen --lan), found with DNS-SD.",
        discussion: "Example: parley lan --watch    (then: parley call bob --lan)"
    )

    @Option(help: "How long to look before printing the list.")
    var seconds: Double = 3

    @Flag(help: "Keep watching: a line as each device appears (+) or leaves (-), until interrupted.")
    var watch = false

    func validate() throws {
        guard seconds > 0, seconds <= 3600 else { throw ValidationError("--seconds is more than 0 and at most 3600") }
    }

    func run() async throws {
        let discovery: AvahiDiscovery
        do { discovery = try AvahiDiscovery() } catch { throw fail("\(error)") }
        var directory = LANDirectory()
        let events = discovery.browse()
        if watch {
            Console.say("watching for Parley devices on this network (Ctrl-C stops)")
            do {
                for try await event in events {
                    let before = directory.listeners
                    guard directory.apply(event) else { continue }
                    switch event {
                    case .found(let listener): Console.say("+ \(Self.line(listener))")
                    case .lost(let instance): Console.say("- \(before[instance].map(Self.line) ?? instance)")
                    }
                }
            } catch {
                throw fail("\(error)")
            }
            return
        }
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        do {
            try await Self.collect(events, into: &directory, until: deadline)
        } catch {
            throw fail("\(error)")
        }
        if directory.listeners.isEmpty {
            Console.say("no device is listening for calls on this network (start one with: parley listen --lan --as <user>)")
        }
        for listener in directory.sorted { Console.say(Self.line(listener)) }
    }

    static func line(_ listener: LANListener) -> String {
        "\(listener.user)\(listener.name.map { " (\($0))" } ?? "")  \"\(listener.instance)\"  \(listener.host):\(listener.port)"
            + (listener.pinRequired ? "  PIN" : "")
    }

    /// Applies a browse's events until `deadline`, or until `done` says the directory has what is wanted.
    static func collect(_ events: AsyncThrowingStream<LANDiscoveryEvent, any Error>, into directory: inout LANDirectory,
                        until deadline: ContinuousClock.Instant, done: (LANDirectory) -> Bool = { _ in false }) async throws {
        let (timer, tick) = AsyncStream<Void>.makeStream()
        let sleeper = Task {
            try? await Task.sleep(until: deadline)
            tick.finish()
        }
        defer { sleeper.cancel() }
        // Events and the deadline, merged: whichever comes first.
        let merged = AsyncThrowingStream<LANDiscoveryEvent?, any Error> { continuation in
            let reader = Task {
                do {
                    for try await event in events { continuation.yield(event) }
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            let waiter = Task {
                for await _ in timer {}
                continuation.yield(nil)
            }
            continuation.onTermination = { _ in reader.cancel(); waiter.cancel() }
        }
        for try await event in merged {
            guard let event else { return }
            directory.apply(event)
            if done(directory) { return }
        }
    }

    /// The listener to call: the one advertised for `callee` (a user id, display name or instance
    /// name), looked for up to `timeout`.
    static func find(_ callee: String, timeout: Duration) async throws -> LANListener {
        let discovery = try AvahiDiscovery()
        var directory = LANDirectory()
        try await collect(discovery.browse(), into: &directory, until: .now + timeout) { !$0.matching(callee).isEmpty }
        let matches = directory.matching(callee)
        guard let first = matches.first else {
            let others = directory.sorted.map { $0.user.rawValue }
            throw fail("nobody called \(callee) is listening on this network"
                       + (others.isEmpty ? " (nobody is: parley listen --lan starts one)" : " (listening: \(others.joined(separator: ", ")))"))
        }
        if matches.count > 1 {
            Console.say("\(matches.count) devices listen as \(callee); calling \"\(first.instance)\" (name another with its quoted name)")
        }
        return first
    }
}
