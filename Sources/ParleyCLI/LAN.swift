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

    /// A listener on one line; what it advertises is printed without control characters, so no
    /// record can rewrite the terminal.
    static func line(_ listener: LANListener) -> String {
        "\(listener.user)\(listener.name.map { " (\(LANService.plainText($0)))" } ?? "")  \"\(LANService.plainText(listener.instance))\""
            + "  \(listener.host):\(listener.port)" + (listener.pinRequired ? "  PIN" : "")
    }

    /// Applies a browse's events until the deadline `until` answers for what has been seen so far
    /// (it may move it closer, or later).
    static func collect(_ events: AsyncThrowingStream<LANDiscoveryEvent, any Error>, into directory: inout LANDirectory,
                        until deadline: (LANDirectory) -> ContinuousClock.Instant) async throws {
        // Events and a tick every 100 ms, merged: the deadline is looked at on either.
        let (merged, continuation) = AsyncThrowingStream<LANDiscoveryEvent?, any Error>.makeStream()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                do {
                    for try await event in events { continuation.yield(event) }
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            group.addTask {
                while (try? await Task.sleep(for: .milliseconds(100))) != nil { continuation.yield(nil) }
            }
            defer { group.cancelAll() }
            for try await event in merged {
                if let event { directory.apply(event) }
                if ContinuousClock.now >= deadline(directory) { return }
            }
        }
    }

    static func collect(_ events: AsyncThrowingStream<LANDiscoveryEvent, any Error>, into directory: inout LANDirectory,
                        until deadline: ContinuousClock.Instant) async throws {
        try await collect(events, into: &directory) { _ in deadline }
    }

    /// The listener to call: the one advertised for `callee` (a user id, display name or instance
    /// name), looked for up to `timeout`, and then a second longer, in case another answers to the
    /// same name: anyone on the network can advertise "bob", so two are not told apart by guessing.
    static func find(_ callee: String, timeout: Duration) async throws -> LANListener {
        let discovery = try AvahiDiscovery()
        var directory = LANDirectory()
        let giveUp = ContinuousClock.now + timeout
        var firstSeen: ContinuousClock.Instant?
        try await collect(discovery.browse(), into: &directory) { directory in
            if firstSeen == nil, !directory.matching(callee).isEmpty { firstSeen = .now }
            return firstSeen.map { $0 + .seconds(1) } ?? giveUp
        }
        let matches = directory.matching(callee)
        guard let first = matches.first else {
            let others = directory.sorted.map { $0.user.rawValue }
            throw fail("nobody called \(callee) is listening on this network"
                       + (others.isEmpty ? " (nobody is: parley listen --lan starts one)" : " (listening: \(others.joined(separator: ", ")))"))
        }
        guard matches.count == 1 else {
            throw fail("\(matches.count) devices answer to \(callee) on this network; call one by the name in quotes:\n"
                       + matches.map { "  " + line($0) }.joined(separator: "\n"))
        }
        return first
    }
}
