import ArgumentParser
import Foundation
import ParleyWire

/// `parley-wire`: an impaired link between two network namespaces, for the quality benchmark and
/// the tests (this kernel has no netem).
@main
struct WireCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "parley-wire",
        abstract: "Forwards IP packets between two network namespaces with delay, jitter, loss and a rate limit.",
        discussion: """
            Makes a TUN device in each namespace (and the namespaces, when they do not exist; those it \
            removes again at exit), joins them as a point-to-point link between --address-a and \
            --address-b, and forwards every packet through the impairment. Prints "ready" once the \
            link is up and, at exit, what each direction did as JSON. Needs root.

            Impairment specs: comma-separated delay=20ms, jitter=30ms (a further uniform 0-60 ms per \
            packet), reorder, loss=5%, burst=10%:3 (Gilbert-Elliott: 10% lost in bursts of 3 on \
            average), rate=24kbit, queue=200ms; or clean.

            With --control, standard input takes lines "set <spec>", "set ab <spec>", "set ba <spec>", \
            "stats" and "quit", each answered with one line.
            """)

    @Option(help: "The namespace of side a.") var namespaceA = "parley-a"
    @Option(help: "The namespace of side b.") var namespaceB = "parley-b"
    @Option(help: "Side a's address (in 198.51.100.0/24 or 203.0.113.0/24).") var addressA = "198.51.100.1"
    @Option(help: "Side b's address.") var addressB = "198.51.100.2"
    @Option(help: "The impairment both ways.") var impair = "clean"
    @Option(name: .customLong("impair-ab"), help: "a → b only (overrides --impair that way).") var impairAB: String?
    @Option(name: .customLong("impair-ba"), help: "b → a only.") var impairBA: String?
    @Option(help: "Seed of every random draw: the same seed repeats a run's losses and delays.") var seed: UInt64 = 1
    @Flag(help: "Take control lines on standard input.") var control = false

    func validate() throws {
        for address in [addressA, addressB] where !(address.hasPrefix("198.51.100.") || address.hasPrefix("203.0.113.")) {
            throw ValidationError("\(address) is outside the test ranges 198.51.100.0/24 and 203.0.113.0/24")
        }
        if getuid() != 0 { throw ValidationError("parley-wire needs root (network namespaces and TUN devices)") }
    }

    func run() throws {
        do {
            let both = try Impairment(spec: impair)
            let ab = try impairAB.map { try Impairment(spec: $0) } ?? both
            let ba = try impairBA.map { try Impairment(spec: $0) } ?? both
            let wire = try TunWire(a: .init(namespace: namespaceA, address: addressA),
                                   b: .init(namespace: namespaceB, address: addressB), ab: ab, ba: ba, seed: seed)
            defer { wire.close() }
            say("parley-wire: \(namespaceA) \(addressA) ⇄ \(namespaceB) \(addressB); a→b \(ab), b→a \(ba); seed \(seed)")
            say("ready")
            try wire.run(control: control ? STDIN_FILENO : nil, stopsOnSignals: true, report: say)
            say(wire.statistics)
        } catch let error as ImpairmentError {
            throw ValidationError(error.description)
        } catch let error as WireError {
            FileHandle.standardError.write(Data("parley-wire: \(error)\n".utf8))
            throw ExitCode.failure
        }
    }

    /// One line on standard output, at once (scripts wait for "ready").
    private func say(_ line: String) {
        // A reader that went away must not stop the wire before it removes its namespaces.
        try? FileHandle.standardOutput.write(contentsOf: Data((line + "\n").utf8))
    }
}
