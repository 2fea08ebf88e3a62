import ParleyProtocol

/// The compact form of the node messages every call setup sends many of, for a direct link to a
/// node that reads it (`cluster_node.lines` 2 and up): words separated by single spaces, and a
/// client's or server's frame as its last word, as is — not a JSON string inside a JSON object,
/// escaped on one side and unescaped on the other. The identifiers in them (users, devices,
/// nodes, call ids, types) never hold a space; a frame in a line holds no control character (a
/// newline would end the line; JSON allows them only as whitespace, and the server's frames have none).
///
/// - `D <user> <device> <from> <type> <call or -> <frame>`: `deliver`, with what it is about.
/// - `Q <id> <from> <user> <device> <frame>`: `request`.
/// - `A <id>`: a `reply` that is a plain ack (`.done`).
///
/// Every other message, and these when they do not fit the form, go as JSON (a line that starts
/// with `{`), which every node reads.
enum NodeLine {
    /// The version of lines this build reads, published with its address.
    static let version = 2

    /// The compact line of a message, if it has one.
    static func compact(_ message: NodeMessage) -> String? {
        switch message {
        case .deliver(let to, let frame, let from, let about?):
            guard fits(frame) else { return nil }
            return "D \(to.user) \(to.device) \(from) \(about.type) \(about.call?.rawValue ?? "-") \(frame)"
        case .request(let id, let from, let sender, let frame):
            guard fits(frame) else { return nil }
            return "Q \(id) \(from) \(sender.user) \(sender.device) \(frame)"
        case .reply(let id, .done?, .none):
            return "A \(id)"
        default:
            return nil
        }
    }

    /// The message of a compact line; nil for one that is not (JSON, or malformed).
    static func parse(_ line: Substring) -> NodeMessage? {
        guard line.utf8.count >= 3, line.dropFirst().first == " " else { return nil }
        let body = line.dropFirst(2)
        switch line.first {
        case "D":
            guard let (words, frame) = split(body, words: 5), let to = key(words[0], words[1]) else { return nil }
            let call = words[4] == "-" ? nil : CallID(rawValue: String(words[4]))
            guard words[4] == "-" || call != nil else { return nil }
            return .deliver(to: to, frame: String(frame), from: String(words[2]),
                            about: DeliveredFrame(type: String(words[3]), call: call))
        case "Q":
            guard let (words, frame) = split(body, words: 4), let id = UInt64(words[0]), let sender = key(words[2], words[3]) else {
                return nil
            }
            return .request(id: id, from: String(words[1]), sender: sender, frame: String(frame))
        case "A":
            return UInt64(body).map { .reply(id: $0, result: .done, error: nil) }
        default:
            return nil
        }
    }

    /// Whether a frame can be a line's last word: not empty, and without a control character.
    private static func fits(_ frame: String) -> Bool {
        !frame.isEmpty && !frame.utf8.contains { $0 < 0x20 }
    }

    /// The first `count` words of `text` and the rest after them (which may hold spaces).
    private static func split(_ text: Substring, words count: Int) -> ([Substring], Substring)? {
        var words: [Substring] = []
        var rest = text
        while words.count < count {
            guard let space = rest.firstIndex(of: " ") else { return nil }
            words.append(rest[..<space])
            rest = rest[rest.index(after: space)...]
        }
        return rest.isEmpty ? nil : (words, rest)
    }

    private static func key(_ user: Substring, _ device: Substring) -> DeviceKey? {
        guard let user = UserID(rawValue: String(user)), let device = DeviceID(rawValue: String(device)) else { return nil }
        return DeviceKey(user: user, device: device)
    }
}
