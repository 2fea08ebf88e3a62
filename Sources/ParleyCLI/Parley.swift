import ArgumentParser

@main
struct Parley: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "parley",
        abstract: "Parley: voice and video calling, from signaling server to softphone.",
        subcommands: [Serve.self, Demo.self, Call.self, Listen.self, LAN.self, Room.self, Token.self, PushCommand.self, Doctor.self, Bench.self]
    )
}
