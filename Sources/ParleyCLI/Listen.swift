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

    @Option(name: .customLong("register-voip"),
            help: "Register this --device for VoIP pushes with this token (hex), then exit: calls to you now push to it.")
    var voipToken: String?

    @Option(name: .customLong("voip-topic"), help: "The app's bundle id the VoIP token belongs to.")
    var voipTopic = "net.parley.app"

    @Option(name: .customLong("voip-environment"), help: "sandbox (a development build's token) or production.")
    var voipEnvironment = "sandbox"

    @Option(name: .customLong("woken-by"),
            help: "Start as a device woken by this VoIP push (the payload PushKit hands the app, a JSON file): report the call, connect, then answer as --answer says.")
    var wokenBy: String?

    func validate() throws {
        if let voipToken, voipToken.isEmpty || !voipToken.allSatisfy(\.isHexDigit) {
            throw ValidationError("--register-voip takes the device token in hex")
        }
        if voipToken != nil, phone.device == nil {
            throw ValidationError("--register-voip needs --device: pushes go to a device that stays the same")
        }
        guard VoIPRegistration.Environment(rawValue: voipEnvironment) != nil else {
            throw ValidationError("--voip-environment is sandbox or production")
        }
        if let wokenBy, !FileManager.default.isReadableFile(atPath: wokenBy) { throw ValidationError("--woken-by: cannot read \(wokenBy)") }
    }

    func run() async throws {
        if let voipToken {
            let options = phone.options()
            let registration = VoIPRegistration(token: voipToken.lowercased(), topic: voipTopic,
                                                environment: VoIPRegistration.Environment(rawValue: voipEnvironment)!)
            do {
                try await Softphone.registerForVoIPPushes(registration, options: options)
            } catch {
                throw fail("\(error)")
            }
            Console.say("registered device \(options.device) of \(phone.user) for VoIP pushes (\(voipEnvironment)); it is offline now: a call to \(phone.user) pushes to it")
            return
        }
        let softphone: Softphone
        if let wokenBy {
            softphone = try Softphone(options: phone.options(), logger: phone.logger)
            Console.say("woken by a VoIP push as \(phone.user) (device \(softphone.options.device))")
            do {
                try await softphone.handleVoIPPush(Data(contentsOf: URL(fileURLWithPath: wokenBy)))
            } catch {
                throw fail("\(error)")
            }
        } else {
            softphone = try await phone.startSoftphone()
        }
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
            if let timeline = await runCall(softphone, call, duration: phone.duration, recording: phone.recordingOptions) {
                for line in Console.summary(timeline) { Console.say(line) }
            }
            if once { break calls }
            Console.say("listening again")
        }
        await softphone.stop()
    }
}
