import ArgumentParser
import Foundation
import ParleyKit
import ParleyProtocol
import ParleySoftphone

struct Call: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Call a user: a softphone with a live status line, mute (m), hold (h) and hang up (q).",
        discussion: "Example, against `parley serve` on this machine: parley call bob --as alice --play tone:440 --record heard.wav --duration 10"
    )

    @Argument(help: "The user to call (with --lan: a user, display name or the name `parley lan` shows in quotes).")
    var callee: String

    @OptionGroup var phone: SoftphoneArguments

    func validate() throws {
        guard phone.lan || UserID(rawValue: callee) != nil else { throw ValidationError("'\(callee)' is not a user id") }
        guard callee != phone.user else { throw ValidationError("you cannot call yourself (you are '\(phone.user)'; pick another with --as)") }
    }

    func run() async throws {
        let softphone: Softphone
        let callee: UserID
        if phone.lan {
            let listener: LANListener
            do { listener = try await LAN.find(self.callee, timeout: .seconds(10)) } catch let exit as ExitCode { throw exit } catch { throw fail("\(error)") }
            guard listener.user.rawValue != phone.user else { throw fail("\(listener.user) is you: call it under another user id (--as)") }
            // Where the call and the PIN go, said before either does.
            Console.say("found \(LAN.line(listener))")
            var pin = phone.pin
            if listener.pinRequired, pin == nil {
                guard Console.interactive else { throw fail("\(listener.user) asks for a PIN: pass --pin") }
                Console.say("PIN for \(listener.user): ")
                pin = readLine()?.trimmingCharacters(in: .whitespaces)
            }
            var options = phone.options(server: listener.url)
            options.lan = LANAccess(pin: pin)
            softphone = try await phone.startSoftphone(options)
            callee = listener.user
            Console.say("calling \(listener) as \(phone.user), on the local network…")
        } else {
            softphone = try await phone.startSoftphone()
            callee = UserID(rawValue: self.callee)!
            Console.say("calling \(callee) as \(phone.user) via \(phone.server)…")
        }
        let call = await softphone.call(callee, video: phone.video)
        let (duration, recording) = (phone.duration, phone.recordingOptions)
        let timeline = await withTaskGroup(of: Void.self) { group in
            // What the far side does, said beside the call's status.
            group.addTask {
                for await event in softphone.events {
                    if case .calleeOffline(call) = event {
                        Console.say("\(callee) is not online and has no device to wake; hanging up")
                        await softphone.hangUp(call)
                    }
                    if case .remoteUpdated(call, let muted, let held) = event {
                        if let muted { Console.say("\(callee) \(muted ? "muted" : "unmuted") their microphone") }
                        if let held { Console.say("\(callee) \(held ? "put the call on hold" : "resumed the call")") }
                    }
                }
            }
            defer { group.cancelAll() }
            return await runCall(softphone, call, duration: duration, recording: recording)
        }
        if let timeline { for line in Console.summary(timeline) { Console.say(line) } }
        await softphone.stop()
        // A call that never connected (declined, busy, offline, no answer) is a failure for scripts,
        // and so is one that connected with nothing heard.
        if timeline?.connected == nil { throw ExitCode(2) }
        if timeline?.heardNothing == true { throw ExitCode(3) }
    }
}
