import ArgumentParser
import Foundation
import Logging
import ParleyGStreamer
import ParleyProtocol
import ParleyServer
import ParleyLocalServices
import ParleySoftphone
#if canImport(Glibc)
import Glibc
#endif

/// AudioBridge rooms of growing size on a real Janus: how long joining takes, and what the mixer
/// and the clients cost.
struct BenchRooms: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rooms",
        abstract: "Rooms of 2, 4, 8, 16 Linux clients on a private Janus: time to join and to webrtcup, Janus CPU, client CPU.",
        discussion: """
            Starts Debian's janus with a private configuration on a veth pair it creates (Janus on \
            198.51.100.1, clients on 198.51.100.2), so it must run as root in a network namespace of its \
            own: scripts/bench-rooms.sh does that. Every client sends a tone; CPU is measured over a \
            steady window with everyone in the room.
            """
    )

    @Option(help: "Room sizes, comma-separated.")
    var sizes: String = "2,4,8,16"

    @Option(help: "Seconds of the steady window over which CPU is measured.")
    var steady: Double = 8

    func run() async throws {
        let sizes = self.sizes.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !sizes.isEmpty, sizes.allSatisfy({ (1...64).contains($0) }) else { throw ValidationError("--sizes takes numbers from 1 to 64") }
        if let reason = TestNetwork.unavailable { throw fail("\(reason) (run scripts/bench-rooms.sh)") }
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        defer { janus.stop() }
        var logger = Logger(label: "parley.bench")
        logger.logLevel = .error
        let server = try await EmbeddedServer.start(database: nil, janus: JanusSettings(url: janus.url), logger: logger)
        progress("server on \(server.base.absoluteString), Janus \(janus.url)")
        var rows: [Row] = []
        for size in sizes {
            rows.append(try await room(of: size, server: server.base, janus: janus, logger: logger))
        }
        await server.stop()
        print(table(rows))
    }

    struct Row {
        var size: Int
        var join: [Double] = []
        var webrtcUp: [Double] = []
        var janusCPU = 0.0
        var clientCPU = 0.0
        var failures = 0
    }

    private func room(of size: Int, server: URL, janus: JanusServer, logger: Logger) async throws -> Row {
        var phones: [Softphone] = []
        for index in 0..<size {
            var media = MediaEngineConfiguration()
            media.input = .tone(hertz: Double(300 + 40 * index))
            media.output = .null
            media.localAddresses = [TestNetwork.clientAddress]
            let phone = try Softphone(options: SoftphoneOptions(server: server, user: UserID(rawValue: "bench-\(index)")!, media: media), logger: logger)
            try await phone.start()
            phones.append(phone)
        }
        var row = Row(size: size)
        var sessions: [RoomSession] = []
        let room = RoomID(rawValue: "bench-\(size)")!
        // One after another, as people arrive: each join timed from `room.join` to Janus's `joined`
        // (ready to send an offer) and to `webrtcup` (media up).
        for phone in phones {
            guard let signaling = await phone.signalingClient else { continue }
            let session = try RoomSession(room: room, display: phone.options.user.rawValue, signaling: signaling, media: phone.options.media, logger: logger)
            let started = ContinuousClock.now
            let connected = Task { () -> Duration? in
                for await event in session.events { if event == .connected { return ContinuousClock.now - started } }
                return nil
            }
            do {
                try await session.join()
                row.join.append((ContinuousClock.now - started).seconds * 1000)
                let up = await withTaskGroup(of: Duration?.self) { group in
                    group.addTask { await connected.value }
                    group.addTask { try? await Task.sleep(for: .seconds(10)); return nil }
                    let first = await group.next() ?? nil
                    group.cancelAll()
                    return first
                }
                if let up { row.webrtcUp.append(up.seconds * 1000) } else { row.failures += 1 }
            } catch {
                row.failures += 1
                progress("join failed: \(error)")
            }
            connected.cancel()
            sessions.append(session)
        }
        try await Task.sleep(for: .seconds(1))
        let janusBefore = janus.cpuSeconds, clientBefore = cpuSeconds(pid: getpid())
        try await Task.sleep(for: .seconds(steady))
        row.janusCPU = (janus.cpuSeconds - janusBefore) / steady * 100
        row.clientCPU = (cpuSeconds(pid: getpid()) - clientBefore) / steady * 100 / Double(size)
        for session in sessions { await session.leave() }
        for phone in phones { await phone.stop() }
        progress("room of \(size): done")
        return row
    }

    private func table(_ rows: [Row]) -> String {
        let (median, cell) = (BenchTable.median, BenchTable.cell)
        var lines = ["", String(format: "rooms on Janus AudioBridge; medians over the room's joins; CPU over %.0f s with everyone in, in %% of one core", steady)]
        lines.append("clients   join→joined   join→webrtcup   Janus CPU   per client CPU   failed")
        for row in rows {
            lines.append(String(format: "%7d", row.size) + "   " + cell(median(row.join), "%8.0f ms") + "   " + cell(median(row.webrtcUp), "%10.0f ms")
                         + "   " + String(format: "%7.1f %%", row.janusCPU) + "   " + String(format: "%12.1f %%", row.clientCPU) + "   \(row.failures)")
        }
        lines.append("join→joined: room.join on the Parley server (which admits the device on Janus) plus the Janus session, handle and join;")
        lines.append("join→webrtcup: and the offer, Janus's answer, ICE and DTLS. Client CPU: this process (every client, the server) / clients.")
        return lines.joined(separator: "\n")
    }

    private func progress(_ text: String) {
        try? FileHandle.standardError.write(contentsOf: Data("bench: \(text)\n".utf8))
    }
}
