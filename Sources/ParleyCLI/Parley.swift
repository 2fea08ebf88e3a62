import ArgumentParser

@main
struct Parley: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "parley",
        abstract: "Parley: voice and video calling, from signaling server to softphone.",
        subcommands: commands
    )

    #if os(Linux)
    static let commands: [any ParsableCommand.Type] = [Serve.self, Demo.self, Call.self, Listen.self, LAN.self, Room.self, Token.self,
                                                       PushCommand.self, Doctor.self, Bench.self]
    #else
    /// The server's side: the softphone and the benchmarks run on Linux (Package.swift says why).
    static let commands: [any ParsableCommand.Type] = [Serve.self, Token.self, PushCommand.self]
    #endif
}
