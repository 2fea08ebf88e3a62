import Foundation
import Logging
import ParleyGStreamer
import ParleyKit
import ParleyProtocol
import ParleyServer
import ParleyServerTesting
import ParleySoftphone
import Testing

/// A real Janus in the tests' network namespace, a Parley server that provisions its rooms there,
/// and Linux clients joining them.
final class RoomLab: @unchecked Sendable {
    let janus: JanusServer
    let server: LiveServer
    let directory: URL
    private var phones: [Softphone] = []
    private var sessions: [RoomSession] = []

    static let enabled = JanusServer.testsCanRun("room tests")

    static func run(_ body: (RoomLab) async throws -> Void) async throws {
        try TestNetwork.janusLink()
        let janus = try await JanusServer.start()
        let server: LiveServer
        do {
            server = try await LiveServer.start {
                var settings = JanusSettings(url: janus.url)
                settings.emptyRoomGrace = .seconds(1)
                $0.janus = settings
            }
        } catch {
            janus.stop()
            throw error
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-room-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let lab = RoomLab(janus: janus, server: server, directory: directory)
        do {
            try await body(lab)
        } catch {
            print("janus log:\n\(janus.output.suffix(ProcessInfo.processInfo.environment["PARLEY_JANUS_DEBUG"] == nil ? 2000 : 200_000))")
            await lab.close()
            throw error
        }
        await lab.close()
    }

    private init(janus: JanusServer, server: LiveServer, directory: URL) {
        self.janus = janus
        self.server = server
        self.directory = directory
    }

    /// A signed-in softphone whose microphone plays `input`, recording what it hears when asked.
    func phone(_ user: UserID, input: AudioInput, record: Bool = false) async throws -> Softphone {
        let phone = try await Self.phone(server, user, input: input, record: record ? recording(user) : nil)
        phones.append(phone)
        return phone
    }

    static func phone(_ server: LiveServer, _ user: UserID, input: AudioInput, record: URL?) async throws -> Softphone {
        var media = MediaEngineConfiguration()
        media.input = input
        media.output = record.map { .file($0) } ?? .null
        media.localAddresses = [TestNetwork.clientAddress]
        let phone = try Softphone(options: SoftphoneOptions(server: URL(string: server.baseURL)!, user: user, media: media), logger: testLogger)
        try await phone.start()
        return phone
    }

    func recording(_ user: UserID) -> URL { directory.appendingPathComponent("\(user.rawValue).wav") }

    /// Joins `room` as `phone`'s user; the session's events are recorded.
    func join(_ phone: Softphone, room: RoomID = "lobby") async throws -> (RoomSession, RoomEvents) {
        let joined = try await Self.join(phone, room: room)
        sessions.append(joined.0)
        return joined
    }

    static func join(_ phone: Softphone, room: RoomID = "lobby") async throws -> (RoomSession, RoomEvents) {
        let signaling = try #require(await phone.signalingClient)
        let session = try RoomSession(room: room, display: phone.options.user.rawValue, signaling: signaling, media: phone.options.media,
                                      logger: testLogger)
        let events = RoomEvents(session.events)
        try await session.join()
        return (session, events)
    }

    /// One second of 440 Hz, then two of silence: a speaker in bursts.
    static func writeBursts(to url: URL) throws {
        let rate = 48_000
        let samples = (0..<(rate * 3)).map { i -> Float in i < rate ? Float(0.5 * sin(2 * Double.pi * 440 * Double(i) / Double(rate))) : 0 }
        try WAV.write(WAV.Audio(sampleRate: rate, channels: 1, samples: samples), to: url)
    }

    func close() async {
        for session in sessions { await session.leave() }
        for phone in phones { await phone.stop() }
        try? await server.stop()
        janus.stop()
        try? FileManager.default.removeItem(at: directory)
    }
}

/// Everything a room session reported, for waiting on with a deadline.
final class RoomEvents: @unchecked Sendable {
    private let lock = NSLock()
    private var events: [(at: ContinuousClock.Instant, event: RoomEvent)] = []

    init(_ stream: AsyncStream<RoomEvent>) {
        Task { [weak self] in
            for await event in stream { self?.lock.withLock { self?.events.append((.now, event)) } }
        }
    }

    var all: [RoomEvent] { lock.withLock { events.map(\.event) } }

    /// When the first event matching came, waiting up to `timeout` for it.
    @discardableResult
    func wait(_ what: String, timeout: Duration = .seconds(10), _ matches: @escaping (RoomEvent) -> Bool) async throws -> ContinuousClock.Instant {
        var found: ContinuousClock.Instant?
        do {
            try await eventually(timeout: timeout, what) {
                found = self.lock.withLock { self.events.first { matches($0.event) }?.at }
                return found != nil
            }
        } catch {
            throw TestFailure("\(what): not among \(all)")
        }
        return found!
    }

    /// When the last event matching came, if one did.
    func last(_ matches: (RoomEvent) -> Bool) -> ContinuousClock.Instant? {
        lock.withLock { events }.last { matches($0.event) }?.at
    }

    /// How many events matching came after `since`.
    func count(since: ContinuousClock.Instant, _ matches: (RoomEvent) -> Bool) -> Int {
        lock.withLock { events }.filter { $0.at > since && matches($0.event) }.count
    }

    /// Talking changes of `display`, in order (only those after `since`, when given).
    func talking(of display: String, since: ContinuousClock.Instant? = nil) -> [Bool] {
        lock.withLock { events }.compactMap { entry in
            guard since.map({ entry.at > $0 }) ?? true, case .talking(let member, let talking) = entry.event, member.display == display else { return nil }
            return talking
        }
    }
}
