import ArgumentParser
import Foundation
import Logging
import ParleyGStreamer
import ParleyProtocol
import ParleySoftphone

struct Room: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Group voice rooms (Janus AudioBridge, through a server started with --janus).",
        subcommands: [RoomJoinCommand.self]
    )
}

struct RoomJoinCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "join",
        abstract: "Join a voice room and print who is in it and who is talking, live.",
        discussion: "Example: parley room join lobby --as carol --play tone:550 --record room.wav"
    )

    @Argument(help: "The room's name (1-64 characters of A-Z a-z 0-9 . _ : @ -).")
    var room: String

    @OptionGroup var phone: SoftphoneArguments

    @Option(help: "The name others see (default: your user id).")
    var display: String?

    @Flag(help: "Join muted.")
    var muted = false

    func validate() throws {
        guard RoomID(rawValue: room) != nil else { throw ValidationError("a room name is 1-64 characters of A-Z a-z 0-9 . _ : @ -") }
    }

    func run() async throws {
        let softphone = try await phone.startSoftphone()
        guard let signaling = await softphone.signalingClient else { throw fail("not connected to the server") }
        var logger = Logger(label: "parley.room")
        logger.logLevel = .error
        var media = softphone.options.media
        if phone.iceAddresses.isEmpty, let server = URL(string: phone.server), server.host == "127.0.0.1" || server.host == "localhost" {
            // Janus never answers on loopback: let the engine use every interface when the server is local.
            media.localAddresses = []
        }
        let session = try RoomSession(room: RoomID(rawValue: room)!, display: display ?? phone.user, signaling: signaling, media: media, logger: logger)
        let started = ContinuousClock.now
        @Sendable func stamp() -> String { String(format: "%6.1f s", (ContinuousClock.now - started).seconds) }
        do {
            try await session.join()
        } catch {
            await softphone.stop()
            throw fail("\(error)")
        }
        if muted { try? await session.setMuted(true) }

        let keyboard = Keyboard()
        defer { keyboard.restore() }
        if Console.interactive { Console.say("keys: m mute · q leave") }
        // The keys, Ctrl-C and the duration are heard beside the room's events, until it ends.
        let keys = keyboard.keys, duration = phone.duration
        let ended = await withTaskGroup(of: Void.self) { group in
            group.addTask {
                var isMuted = muted
                for await key in keys {
                    switch key {
                    case "m":
                        isMuted.toggle()
                        try? await session.setMuted(isMuted)
                        Console.say("\(stamp())  you are \(isMuted ? "muted" : "unmuted")")
                    case "q", "\n":
                        await session.leave()
                        return
                    default: break
                    }
                }
            }
            group.addTask { for await _ in Interrupt.signals() { await session.leave() } }
            if let duration {
                group.addTask {
                    guard (try? await Task.sleep(for: .seconds(duration))) != nil else { return }
                    await session.leave()
                }
            }
            defer { group.cancelAll() }
            var ended = "left"
            for await event in session.events {
                switch event {
                case .joined(let name, let people):
                    Console.say("\(stamp())  joined room \(name): " + people.map { $0.isSelf ? "\($0.display) (you)" : $0.display }.joined(separator: ", "))
                case .memberJoined(let member): Console.say("\(stamp())  \(member.display) joined")
                case .memberLeft(let member): Console.say("\(stamp())  \(member.display) left")
                case .talking(let member, let talking): Console.say("\(stamp())  \(member.display) \(talking ? "is talking" : "stopped talking")")
                case .muted(let member, let muted): Console.say("\(stamp())  \(member.display) \(muted ? "muted" : "unmuted")")
                case .connected: Console.say("\(stamp())  audio connected to the room")
                case .hearing: Console.say("\(stamp())  hearing the room")
                case .reconnecting(let reason): Console.say("\(stamp())  lost the voice server (\(reason)); joining again…")
                case .ended(let reason): ended = reason
                }
            }
            return ended
        }
        Console.say("\(stamp())  \(ended)")
        await softphone.stop()
        if let record = phone.record, let audio = try? WAV.read(URL(fileURLWithPath: record)) {
            Console.say(String(format: "recording %@: %.1f s", record, audio.duration))
        }
        if ended != "left" { throw ExitCode(2) }
    }
}
