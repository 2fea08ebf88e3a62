import ArgumentParser
import Foundation
import ParleyAvahi
import ParleyKit
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

    @Option(name: .customLong("answer-after"),
            help: "With --answer auto: let each call ring this many seconds first (connecting while it rings, the answer then finds the path ready).")
    var answerAfter: Double = 0

    @Option(name: .customLong("lan-port"), help: "With --lan: the port callers connect to (0: any free one; it is advertised).")
    var lanPort = 0

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
        guard answerAfter.isFinite, (0...3600).contains(answerAfter) else {
            throw ValidationError("--answer-after takes seconds, from 0 to 3600")
        }
        if let voipToken, voipToken.isEmpty || !voipToken.allSatisfy(\.isHexDigit) {
            throw ValidationError("--register-voip takes the device token in hex")
        }
        if voipToken != nil, phone.device == nil {
            throw ValidationError("--register-voip needs --device: pushes go to a device that stays the same")
        }
        guard VoIPRegistration.Environment(rawValue: voipEnvironment) != nil else {
            throw ValidationError("--voip-environment is sandbox or production")
        }
        if phone.lan, voipToken != nil || wokenBy != nil { throw ValidationError("--lan takes calls on the local network: no VoIP pushes there") }
        guard (0...65535).contains(lanPort) else { throw ValidationError("--lan-port is a port number") }
        if lanPort != 0, !phone.lan { throw ValidationError("--lan-port goes with --lan") }
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
        var lan: (server: EmbeddedServer, advertisement: any LANAdvertisement, discovery: AvahiDiscovery)?
        let softphone: Softphone
        if phone.lan {
            let user = UserID(rawValue: phone.user)!
            let discovery: AvahiDiscovery
            do { discovery = try AvahiDiscovery() } catch { throw fail("\(error)") }
            let server = try await EmbeddedServer.startLAN(user: user, pin: phone.pin, port: lanPort, logger: phone.logger)
            // The softphone is up before the device is advertised: nobody finds it and gets "offline".
            let token = try await server.server.mintToken(user: user, name: phone.name, lifetime: .seconds(365 * 24 * 3600))
            do {
                softphone = try await phone.startSoftphone(phone.options(server: server.base, token: token))
            } catch {
                await server.stop()
                throw error
            }
            let host = ProcessInfo.processInfo.hostName.split(separator: ".").first.map(String.init) ?? "this computer"
            let advertisement: any LANAdvertisement
            do {
                advertisement = try await discovery.advertise(
                    instance: "\(phone.name ?? phone.user) on \(host)", port: server.port,
                    txt: LANService.txt(user: user, name: phone.name, pinRequired: phone.pin != nil)
                ) { error in
                    try? FileHandle.standardError.write(contentsOf: Data("parley: \(error); this device can no longer be found on the network\n".utf8))
                }
            } catch {
                await softphone.stop()
                await server.stop()
                throw fail("\(error)")
            }
            lan = (server, advertisement, discovery)
            Console.say("on the local network as \"\(advertisement.instance)\", port \(server.port)\(phone.pin == nil ? "" : ", PIN required")")
        } else if let wokenBy {
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
        // On a LAN anyone may call: without a terminal to ask on, nobody is answered unless told.
        let mode = answer ?? (Console.interactive ? .ask : lan == nil ? .auto : .never)
        if lan != nil, answer == nil, !Console.interactive {
            Console.say("no terminal to ask on: every call is declined (pass --answer auto to answer every caller on this network)")
        }
        Console.say("listening as \(phone.user) (device \(softphone.options.device)) \(lan == nil ? "on \(phone.server)" : "with no server"); answer: \(mode.rawValue)")
        calls: for await event in softphone.events {
            guard case .incoming(let call, let caller, let name, let address) = event else { continue }
            Console.say("incoming call from \(name.map { "\($0) (\(caller))" } ?? caller.rawValue)\(address.map { " at \($0)" } ?? "")")
            switch mode {
            case .auto:
                // Stopped while it rings (Ctrl-C): nobody is answered.
                if answerAfter > 0 { do { try await Task.sleep(for: .seconds(answerAfter)) } catch { break calls } }
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
        if let lan {
            await lan.advertisement.stop()
            await lan.server.stop()
        }
    }
}
