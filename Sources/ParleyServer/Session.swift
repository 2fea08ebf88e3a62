import DequeModule
import ParleyProtocol

/// A signaling session of one device: its frame numbering, the frames kept for resume, and the
/// answers remembered for idempotent request ids. Owned and mutated only by the hub actor.
final class Session {
    struct Buffered {
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

    /// Numbers a frame and keeps it for resume; answers the frame with its seq.
    func number(_ encode: (Int) -> String) -> Buffered {
        let frame = Buffered(seq: nextSeq, text: encode(nextSeq))
        nextSeq += 1
        buffer.append(frame)
        if buffer.count > bufferLimit, let dropped = buffer.popFirst() {
            lostThrough = dropped.seq
        }
        return frame
    }

    /// The client has every frame up to `seq`.
    func acknowledge(through seq: Int) {
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

    func remember(_ answer: ServerMessage, for requestID: String) {
        if answers.updateValue(answer, forKey: requestID) == nil { answerOrder.append(requestID) }
        if answerOrder.count > answerLimit, let oldest = answerOrder.popFirst() { answers[oldest] = nil }
    }
}
