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
    /// What this build does with what other nodes send it, published with its address
    /// (`cluster_node.lines`), shown when it links to another node (`NodeLinks.versionHeader`) and
    /// in the number of every line it sends (`PostgresCluster.shown(by:)`): 1 reads JSON lines
    /// only; 2 reads compact lines too; 3 also runs the requests sent to it
    /// unanswered in the order they come, as it reads them.
    static let version = 3
    /// The version from which a node reads compact lines.
    static let compactSince = 2
    /// The version from which a node runs requests sent unanswered in the order they come (a node
    /// of an earlier build runs each in a task of its own, so two may overtake each other).
    static let unansweredSince = 3

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
        var rest = line.dropFirst(2)
        switch line.first {
        case "D":
            guard let user = word(&rest), let device = word(&rest), let from = word(&rest), let type = word(&rest),
                  let callWord = word(&rest), !rest.isEmpty, let to = key(user, device) else { return nil }
            let call = callWord == "-" ? nil : CallID(rawValue: String(callWord))
            guard callWord == "-" || call != nil else { return nil }
            return .deliver(to: to, frame: String(rest), from: String(from), about: DeliveredFrame(type: String(type), call: call))
        case "Q":
            guard let idWord = word(&rest), let id = UInt64(idWord), let from = word(&rest), let user = word(&rest),
                  let device = word(&rest), !rest.isEmpty, let sender = key(user, device) else { return nil }
            return .request(id: id, from: String(from), sender: sender, frame: String(rest))
        case "A":
            return UInt64(rest).map { .reply(id: $0, result: .done, error: nil) }
        default:
            return nil
        }
    }

    /// Whether a frame can be a line's last word: not empty, and without a control character.
    private static func fits(_ frame: String) -> Bool {
        !frame.isEmpty && !frame.utf8.contains { $0 < 0x20 }
    }

    /// The next word of `rest`, which then starts after the space that ends it; nil when no space
    /// follows (the last word, a line's frame, is what is left).
    private static func word(_ rest: inout Substring) -> Substring? {
        guard let space = rest.utf8.firstIndex(of: UInt8(ascii: " ")) else { return nil }
        defer { rest = rest[rest.utf8.index(after: space)...] }
        return rest[..<space]
    }

    private static func key(_ user: Substring, _ device: Substring) -> DeviceKey? {
        guard let user = UserID(rawValue: String(user)), let device = DeviceID(rawValue: String(device)) else { return nil }
        return DeviceKey(user: user, device: device)
    }
}
