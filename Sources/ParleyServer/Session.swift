import DequeModule
import ParleyProtocol

/// A signaling session of one device: its frame numbering, the frames kept for resume, and the
/// answers remembered for idempotent request ids. A value: it lives in the hub's `SessionTable`.
struct Session {
    struct Buffered: Equatable, Codable {
        var seq: Int
        var text: String
    }

    let id: String
    let key: DeviceKey
    var name: String?
    /// The address of the connection that said hello last (shown to a LAN listener's user).
    var address: String?
    var platform: Platform?
    /// The live connection, or nil while the session is held for resume.
    var connectionID: UInt64?
    private(set) var nextSeq = 1
    /// Frames sent and not yet acknowledged, oldest first.
    private(set) var buffer: Deque<Buffered> = []
    /// The highest seq dropped from a full buffer before the client acknowledged it: a resume
    /// from before it cannot be served without loss, so it gets a new session instead.
    private(set) var lostThrough = 0
    /// Requests being worked on (an AudioBridge join waits for Janus); a repeat of one is not run again.
    var inFlight: Set<String> = []
    private var answers: [String: ServerMessage] = [:]
    private var answerOrder: Deque<String> = []
    private let bufferLimit: Int
    private let answerLimit: Int

    init(id: String, key: DeviceKey, bufferLimit: Int, answerLimit: Int) {
        self.id = id
        self.key = key
        self.bufferLimit = bufferLimit
        self.answerLimit = answerLimit
    }

    /// The session as another node takes it over (`handover`): numbering, unacknowledged frames and
    /// remembered answers go on there as they would have here. Without a connection.
    init(_ handover: SessionHandover, bufferLimit: Int, answerLimit: Int, decode: (String) -> ServerMessage?) {
        self.init(id: handover.id, key: handover.key, bufferLimit: bufferLimit, answerLimit: answerLimit)
        name = handover.name
        address = handover.address
        platform = handover.platform
        nextSeq = handover.nextSeq
        lostThrough = handover.lostThrough
        buffer = Deque(handover.buffer)
        for answer in handover.answers {
            if let message = decode(answer.frame) { remember(message, for: answer.request) }
        }
    }

    /// What another node needs to go on with this session (`encode`: an answer as a frame's text).
    func handover(encode: (ServerMessage) -> String) -> SessionHandover {
        SessionHandover(id: id, key: key, name: name, address: address, platform: platform, nextSeq: nextSeq,
                        lostThrough: lostThrough, buffer: Array(buffer),
                        answers: answerOrder.compactMap { request in answers[request].map { .init(request: request, frame: encode($0)) } })
    }

    /// Numbers a frame and keeps it for resume; answers the frame with its seq.
    mutating func number(_ encode: (Int) -> String) -> Buffered {
        let frame = Buffered(seq: nextSeq, text: encode(nextSeq))
        nextSeq += 1
        buffer.append(frame)
        if buffer.count > bufferLimit, let dropped = buffer.popFirst() {
            lostThrough = dropped.seq
        }
        return frame
    }

    /// The client has every frame up to `seq`.
    mutating func acknowledge(through seq: Int) {
        while let first = buffer.first, first.seq <= seq { buffer.removeFirst() }
    }

    /// Whether a resume after `lastSeq` can be served with nothing lost.
    func canResume(after lastSeq: Int) -> Bool {
        lastSeq >= lostThrough && lastSeq < nextSeq
    }

    func frames(after lastSeq: Int) -> [Buffered] {
        buffer.filter { $0.seq > lastSeq }
    }

    func answer(for requestID: String) -> ServerMessage? { answers[requestID] }

    mutating func remember(_ answer: ServerMessage, for requestID: String) {
        if answers.updateValue(answer, forKey: requestID) == nil { answerOrder.append(requestID) }
        if answerOrder.count > answerLimit, let oldest = answerOrder.popFirst() { answers[oldest] = nil }
    }
}

/// A device's session, handed from the node that held it to the node its resume reached
/// (`NodeMessage.handover`): everything `Session` keeps but its connection.
public struct SessionHandover: Sendable, Equatable, Codable {
    struct Answer: Sendable, Equatable, Codable {
        var request: String
        /// The answer, as a server frame's text without `seq`.
        var frame: String
    }

    var id: String
    var key: DeviceKey
    var name: String?
    var address: String?
    var platform: Platform?
    var nextSeq: Int
    var lostThrough: Int
    var buffer: [Session.Buffered]
    /// Remembered answers, oldest first.
    var answers: [Answer]
}

/// The sessions of one node, by device, and the rules of protocol v1's session: which hello starts
/// a new session and which resumes one, which connection a hello replaces, when a user has too
/// many devices, which sessions wait for resume and since when.
///
/// A value, like `HubCall`: its methods decide and change state and return what the hub
/// must do (close a connection, replay frames, write a frame on a connection); the hub does it,
/// and keeps the metrics.
struct SessionTable {
    /// What a `hello` comes to.
    enum HelloOutcome: Equatable {
        /// The user has `devices` sessions already, the most one may have: the connection is closed
        /// and no session is made.
        case refused(devices: Int)
        /// A session for the device, on this connection from now on. `replaced`: the device's
        /// previous connection, to close with 4009. `replay`: the frames a resumed session
        /// re-sends. `created`: a device that had no session here (a new one, not a replacement
        /// of a session that could not be resumed).
        case welcomed(session: String, resumed: Bool, created: Bool, replaced: UInt64?, replay: [Session.Buffered])
    }

    private(set) var sessions: [DeviceKey: Session] = [:]
    private var devicesByUser: [UserID: Set<DeviceID>] = [:]
    /// Sessions without a live connection, and since when.
    private var held: [DeviceKey: Duration] = [:]
    private let bufferLimit: Int
    private let answerLimit: Int

    /// - Parameters:
    ///   - bufferLimit: frames each session keeps for resume.
    ///   - answerLimit: answers each session remembers, by request id.
    init(bufferLimit: Int, answerLimit: Int) {
        self.bufferLimit = bufferLimit
        self.answerLimit = answerLimit
    }

    subscript(key: DeviceKey) -> Session? { sessions[key] }

    var count: Int { sessions.count }

    /// The user's devices with a session here, live or held for resume.
    func devices(of user: UserID) -> Set<DeviceID> { devicesByUser[user] ?? [] }

    /// Whether the device has a session here with a live connection.
    func isConnected(_ key: DeviceKey) -> Bool { sessions[key]?.connectionID != nil }

    /// A `hello` on a connection: resumes the device's session when the client asks for it and the
    /// session still has every frame after `lastSeq`; otherwise starts a new one (a resume that
    /// cannot be served gets a new session, never a session with a gap).
    mutating func hello(_ key: DeviceKey, resume: ResumeRequest?, on connection: UInt64, devicesPerUser: Int) -> HelloOutcome {
        if sessions[key] == nil, devices(of: key.user).count >= devicesPerUser {
            // Each device is rung on every call: one token must not hold thousands of sessions.
            return .refused(devices: devices(of: key.user).count)
        }
        // Taken out of the table, so that resuming changes it in place rather than a copy of its buffers.
        var existing = sessions.removeValue(forKey: key)
        let created = existing == nil
        let replaced = existing?.connectionID.flatMap { $0 == connection ? nil : $0 }
        var session: Session
        let resumed: Bool
        var replay: [Session.Buffered] = []
        if let resume, var kept = existing, kept.id == resume.session, kept.canResume(after: resume.lastSeq) {
            existing = nil
            kept.acknowledge(through: resume.lastSeq)
            replay = kept.frames(after: resume.lastSeq)
            session = kept
            resumed = true
        } else {
            session = Session(id: Self.newSessionID(), key: key, bufferLimit: bufferLimit, answerLimit: answerLimit)
            devicesByUser[key.user, default: []].insert(key.device)
            resumed = false
        }
        session.connectionID = connection
        sessions[key] = session
        held[key] = nil
        return .welcomed(session: session.id, resumed: resumed, created: created, replaced: replaced, replay: replay)
    }

    /// Changes a session in place; nil when the device has none. One lookup of the key: every
    /// frame a relay handles changes two sessions.
    @discardableResult
    mutating func modify<R>(_ key: DeviceKey, _ body: (inout Session) -> R) -> R? {
        guard let index = sessions.index(forKey: key) else { return nil }
        return body(&sessions.values[index])
    }

    /// Changes a session in place if it is still the one named `id` (a request may outlive the
    /// session it came in: the session expires, or a hello replaces it); nil otherwise.
    @discardableResult
    mutating func modify<R>(_ key: DeviceKey, ifSession id: String, _ body: (inout Session) -> R) -> R? {
        guard let index = sessions.index(forKey: key), sessions.values[index].id == id else { return nil }
        return body(&sessions.values[index])
    }

    /// Whether the device has a session here, live or held for resume.
    func contains(_ key: DeviceKey) -> Bool { sessions.index(forKey: key) != nil }

    /// The id of the device's session, if it has one.
    func id(of key: DeviceKey) -> String? { sessions.index(forKey: key).map { sessions.values[$0].id } }

    /// What a request that arrives in a session comes to.
    enum RequestStart: Equatable {
        /// Its id was answered already: the answer is sent again, and nothing runs again.
        case answered(ServerMessage)
        /// Its id is being worked on: its answer comes when that work is done.
        case running
        /// It runs, and is in flight until `answer`; from the device, as its session names it now.
        case started(name: String?, address: String?)
    }

    /// A request arrives in the device's session: a repeated id is not run twice (protocol v1's
    /// idempotent request ids). Nil without a session.
    mutating func begin(_ requestID: String, in key: DeviceKey) -> RequestStart? {
        modify(key) { session in
            if let answer = session.answer(for: requestID) { return .answered(answer) }
            guard session.inFlight.insert(requestID).inserted else { return .running }
            return .started(name: session.name, address: session.address)
        }
    }

    /// A request's answer, in the session it came in (`id`): no longer in flight, remembered for a
    /// repeat of its id, and numbered and kept for resume like every frame. Answers the frame's
    /// text and the connection to write it on, as `number` does; nil when that session is gone.
    mutating func answer(_ requestID: String, with answer: ServerMessage, ifSession id: String, in key: DeviceKey,
                         _ encode: (Int) -> String) -> (text: String, connection: UInt64?)? {
        modify(key, ifSession: id) { session in
            session.inFlight.remove(requestID)
            session.remember(answer, for: requestID)
            return (session.number(encode).text, session.connectionID)
        }
    }

    /// A session with no connection for a device that has none here, held for resume from `now`
    /// (calls restored after a restart, or taken over from a node that is gone). False when the
    /// device has a session already.
    mutating func hold(_ key: DeviceKey, now: Duration) -> Bool {
        guard sessions[key] == nil else { return false }
        sessions[key] = Session(id: Self.newSessionID(), key: key, bufferLimit: bufferLimit, answerLimit: answerLimit)
        devicesByUser[key.user, default: []].insert(key.device)
        held[key] = now
        return true
    }

    /// A session another node handed over, held here for resume from `now`; false (and nothing
    /// changed) when the device has a session here already.
    mutating func adopt(_ handover: SessionHandover, now: Duration, decode: (String) -> ServerMessage?) -> Bool {
        guard sessions[handover.key] == nil else { return false }
        sessions[handover.key] = Session(handover, bufferLimit: bufferLimit, answerLimit: answerLimit, decode: decode)
        devicesByUser[handover.key.user, default: []].insert(handover.key.device)
        held[handover.key] = now
        return true
    }

    /// The connection ended: if it is the session's, the session is held for resume from `now`.
    mutating func detach(_ key: DeviceKey, connection: UInt64, now: Duration) {
        guard sessions[key]?.connectionID == connection else { return }
        sessions[key]?.connectionID = nil
        held[key] = now
    }

    /// Ends a session (expired, or the device is held by another node now).
    mutating func remove(_ key: DeviceKey) -> Session? {
        guard let session = sessions.removeValue(forKey: key) else { return nil }
        held[key] = nil
        devicesByUser[key.user]?.remove(key.device)
        if devicesByUser[key.user]?.isEmpty == true { devicesByUser[key.user] = nil }
        return session
    }

    /// Sessions held for at least `window` without a connection: theirs to expire.
    func expired(at now: Duration, window: Duration) -> [DeviceKey] {
        held.compactMap { key, since in now - since >= window ? key : nil }
    }

    /// Numbers a frame in the device's session and keeps it for resume; answers its text and the
    /// connection to write it on (nil while the session is held). Nil without a session.
    mutating func number(for key: DeviceKey, _ encode: (Int) -> String) -> (text: String, connection: UInt64?)? {
        modify(key) { session in (session.number(encode).text, session.connectionID) }
    }

    private static func newSessionID() -> String {
        var generator = SystemRandomNumberGenerator()
        return (0..<2).map { _ in String(generator.next() as UInt64, radix: 36) }.joined(separator: "-")
    }
}
