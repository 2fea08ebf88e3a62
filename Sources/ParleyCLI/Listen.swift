import ArgumentParser
import Foundation
import ParleyProtocol
import ParleySoftphone

struct Listen: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Wait for calls as a device of your user, and answer them.",
        discussion: "Example: parley listen --as bob --play tone:660 --record heard.wav --once"
    )

    enum Answer: String, ExpressibleByArgument, CaseIterable {
        case auto, ask, never
    }

    @OptionGroup var phone: SoftphoneArguments

    @Option(help: "auto: answer every call; ask: ask on the terminal (the default when interactive); never: decline.")
    var answer: Answer?

    @Flag(help: "Exit after the first call.")
    var once = false

    func run() async throws {
        let softphone = try await phone.startSoftphone()
        let mode = answer ?? (Console.interactive ? .ask : .auto)
        Console.say("listening as \(phone.user) (device \(softphone.options.device)) on \(phone.server); answer: \(mode.rawValue)")
        calls: for await event in softphone.events {
            guard case .incoming(let call, let caller, let name) = event else { continue }
            Console.say("incoming call from \(name.map { "\($0) (\(caller))" } ?? caller.rawValue)")
            switch mode {
            case .auto:
                await softphone.answer(call)
            case .never:
                await softphone.hangUp(call)
                Console.say("declined")
                if once { break calls } else { continue }
            case .ask:
                Console.say("answer? [y/n] ")
                let line = readLine()?.lowercased() ?? "n"
                guard line.hasPrefix("y") else {
                    await softphone.hangUp(call)
                    Console.say("declined")
                    if once { break calls } else { continue }
                }
                await softphone.answer(call)
            }
            if let timeline = await runCall(softphone, call, duration: phone.duration) {
                for line in Console.summary(timeline) { Console.say(line) }
            }
            if once { break calls }
            Console.say("listening again")
        }
        await softphone.stop()
    }
}
