/// The client frames a call reads most, read by hand: `call.signal`, the client's `ack`, `ping`,
/// `call.ringing`, `call.accept` and `call.hangup`. `JSONDecoder` spends most of a relayed frame's
/// cost on generic machinery; this reader goes through the bytes once.
///
/// What it answers is what `JSONDecoder` decodes from the same bytes (`FrameReaderTests` compare
/// the two on many frames, and the `client-frame` fuzz target on every input it makes). It answers
/// nil for anything it is not sure of, and the codec then asks `JSONDecoder`: another type, a field
/// it does not know (which `JSONDecoder` ignores), a key twice (it keeps the first), a number that
/// is not a plain integer, and every mistake (a lone surrogate, bytes that are not UTF-8, ...), whose
/// error a client then reads as before.
enum FrameReader {
    static func read(_ bytes: UnsafeBufferPointer<UInt8>) -> ClientMessage? {
        var scanner = Scanner(bytes: bytes)
        guard let fields = scanner.document() else { return nil }
        var frame = Fields(fields)
        guard let type = frame.string("type") else { return nil }
        let message: ClientMessage? = switch type {
        case "call.signal": frame.callSignal()
        case "ack": frame.integer("seq").map { .ack(SeqAck(seq: $0)) }
        case "ping": frame.string("id").map { .ping(Ping(id: $0)) }
        case "call.ringing": frame.callRinging()
        case "call.accept": frame.callRequest().map(ClientMessage.callAccept)
        case "call.hangup": frame.callHangup()
        default: nil
        }
        // Every field read, and no other: one it does not know is `JSONDecoder`'s to ignore.
        return frame.unread == 0 ? message : nil
    }

    /// A JSON value of the shapes these frames have; an array, or a number with a fraction or an
    /// exponent, is not one (the scanner answers nil).
    enum Value: Equatable {
        case string(String)
        case integer(Int)
        case bool(Bool)
        case null
        case object([String: Value])
    }

    /// An object's fields, each read at most once; `unread` counts the rest.
    struct Fields {
        private var fields: [String: Value]
        private(set) var unread: Int

        init(_ fields: [String: Value]) {
            self.fields = fields
            unread = fields.count
        }

        /// The field's value, counted as read; nil when absent.
        private mutating func take(_ key: String) -> Value? {
            guard let value = fields.removeValue(forKey: key) else { return nil }
            unread -= 1
            return value
        }

        /// A required string.
        mutating func string(_ key: String) -> String? {
            guard case .string(let text)? = take(key) else { return nil }
            return text
        }

        /// A required integer.
        mutating func integer(_ key: String) -> Int? {
            guard case .integer(let value)? = take(key) else { return nil }
            return value
        }

        /// An optional field: `.some(nil)` when absent or null (as `decodeIfPresent` reads it), nil
        /// when of another shape than `read` takes.
        private mutating func optional<T>(_ key: String, _ read: (Value) -> T?) -> T?? {
            switch take(key) {
            case nil, .null?: .some(nil)
            case let value?: read(value).map { .some($0) }
            }
        }

        mutating func optionalString(_ key: String) -> String?? {
            optional(key) { if case .string(let text) = $0 { text } else { nil } }
        }

        mutating func optionalInteger(_ key: String) -> Int?? {
            optional(key) { if case .integer(let value) = $0 { value } else { nil } }
        }

        mutating func optionalBool(_ key: String) -> Bool?? {
            optional(key) { if case .bool(let value) = $0 { value } else { nil } }
        }

        mutating func call() -> CallID? {
            string("call").flatMap(CallID.init(rawValue:))
        }

        mutating func callRequest() -> CallRequest? {
            guard let id = string("id"), let call = call() else { return nil }
            return CallRequest(id: id, call: call)
        }

        mutating func callRinging() -> ClientMessage? {
            guard let id = string("id"), let call = call(), let early = optionalBool("early") else { return nil }
            return .callRinging(CallRingingRequest(id: id, call: call, early: early))
        }

        mutating func callHangup() -> ClientMessage? {
            guard let id = string("id"), let call = call(), let reason = optionalString("reason") else { return nil }
            return .callHangup(CallHangup(id: id, call: call, reason: reason))
        }

        mutating func callSignal() -> ClientMessage? {
            guard let id = string("id"), let call = call(), let device = optionalString("device"),
                  let restartIce = optionalBool("restartIce") else { return nil }
            var signal = SignalPayload(restartIce: restartIce ?? false)
            switch take("description") {
            case nil, .null?: break
            case .object(let fields)?:
                var description = Fields(fields)
                guard let type = description.string("type"), let sdp = description.string("sdp"), description.unread == 0 else { return nil }
                signal.description = SessionDescription(type: type, sdp: sdp)
            default: return nil
            }
            switch take("candidate") {
            case nil: break
            case .null?: signal.candidate = .endOfCandidates
            case .object(let fields)?:
                var candidate = Fields(fields)
                guard let text = candidate.string("candidate"), let mid = candidate.optionalString("sdpMid"),
                      let index = candidate.optionalInteger("sdpMLineIndex"),
                      let fragment = candidate.optionalString("usernameFragment"), candidate.unread == 0 else { return nil }
                signal.candidate = .candidate(IceCandidate(candidate: text, sdpMid: mid, sdpMLineIndex: index, usernameFragment: fragment))
            default: return nil
            }
            let deviceID: DeviceID?
            if let device {
                guard let valid = DeviceID(rawValue: device) else { return nil }
                deviceID = valid
            } else {
                deviceID = nil
            }
            return .callSignal(CallSignal(id: id, call: call, signal: signal, device: deviceID))
        }
    }

    /// Strict JSON (RFC 8259) of the shapes above, objects nested at most two deep.
    struct Scanner {
        let bytes: UnsafeBufferPointer<UInt8>
        var index = 0

        /// One object, with nothing but whitespace around it.
        mutating func document() -> [String: Value]? {
            skipWhitespace()
            guard let fields = object(depth: 1) else { return nil }
            skipWhitespace()
            return index == bytes.count ? fields : nil
        }

        private mutating func skipWhitespace() {
            while index < bytes.count {
                switch bytes[index] {
                case 0x20, 0x09, 0x0A, 0x0D: index += 1
                default: return
                }
            }
        }

        private mutating func consume(_ byte: UInt8) -> Bool {
            guard index < bytes.count, bytes[index] == byte else { return false }
            index += 1
            return true
        }

        private mutating func object(depth: Int) -> [String: Value]? {
            guard consume(UInt8(ascii: "{")) else { return nil }
            // Room for a frame's fields from the start: growing from empty rehashes three times.
            var fields = [String: Value](minimumCapacity: 8)
            skipWhitespace()
            if consume(UInt8(ascii: "}")) { return fields }
            while true {
                skipWhitespace()
                guard let key = string() else { return nil }
                skipWhitespace()
                guard consume(UInt8(ascii: ":")) else { return nil }
                skipWhitespace()
                guard let value = value(depth: depth), fields.updateValue(value, forKey: key) == nil else { return nil }
                skipWhitespace()
                if consume(UInt8(ascii: ",")) { continue }
                return consume(UInt8(ascii: "}")) ? fields : nil
            }
        }

        private mutating func value(depth: Int) -> Value? {
            guard index < bytes.count else { return nil }
            switch bytes[index] {
            case UInt8(ascii: "\""): return string().map(Value.string)
            case UInt8(ascii: "{"): return depth < 2 ? object(depth: depth + 1).map(Value.object) : nil
            case UInt8(ascii: "t"): return literal("true") ? .bool(true) : nil
            case UInt8(ascii: "f"): return literal("false") ? .bool(false) : nil
            case UInt8(ascii: "n"): return literal("null") ? .null : nil
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return integer().map(Value.integer)
            default: return nil
            }
        }

        private mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard bytes.count - index >= count else { return false }
            for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] { return false }
            index += count
            return true
        }

        /// `-?(0|[1-9][0-9]*)` within `Int`, not followed by a fraction or an exponent.
        private mutating func integer() -> Int? {
            let negative = consume(UInt8(ascii: "-"))
            let start = index
            var value = 0
            while index < bytes.count, case UInt8(ascii: "0")...UInt8(ascii: "9") = bytes[index] {
                let digit = Int(bytes[index] - UInt8(ascii: "0"))
                let (times, overflow) = value.multipliedReportingOverflow(by: 10)
                let (sum, overflowAgain) = negative ? times.subtractingReportingOverflow(digit) : times.addingReportingOverflow(digit)
                guard !overflow, !overflowAgain else { return nil }
                value = sum
                index += 1
            }
            let digits = index - start
            guard digits > 0, digits == 1 || bytes[start] != UInt8(ascii: "0") else { return nil }
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") || bytes[index] | 0x20 == UInt8(ascii: "e") { return nil }
            return value
        }

        /// A string; its escapes decoded. Nil for a raw control character, a bad escape, a lone
        /// surrogate, or bytes that are not UTF-8.
        private mutating func string() -> String? {
            guard consume(UInt8(ascii: "\"")) else { return nil }
            let start = index
            var ascii = true
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    let run = UnsafeBufferPointer(rebasing: bytes[start..<index])
                    index += 1
                    return ascii ? String(decoding: run, as: UTF8.self) : Self.validUTF8(run)
                }
                if byte == UInt8(ascii: "\\") { return escaped(from: start) }
                if byte < 0x20 { return nil }
                if byte >= 0x80 { ascii = false }
                index += 1
            }
            return nil
        }

        /// The rest of a string with escapes, from its first byte.
        private mutating func escaped(from start: Int) -> String? {
            var decoded: [UInt8] = []
            decoded.reserveCapacity(index - start + 16)
            decoded.append(contentsOf: bytes[start..<index])
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    return decoded.withUnsafeBufferPointer(Self.validUTF8)
                case UInt8(ascii: "\\"):
                    guard index < bytes.count else { return nil }
                    let escape = bytes[index]
                    index += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): decoded.append(escape)
                    case UInt8(ascii: "b"): decoded.append(0x08)
                    case UInt8(ascii: "f"): decoded.append(0x0C)
                    case UInt8(ascii: "n"): decoded.append(0x0A)
                    case UInt8(ascii: "r"): decoded.append(0x0D)
                    case UInt8(ascii: "t"): decoded.append(0x09)
                    case UInt8(ascii: "u"):
                        guard let scalar = unicodeEscape() else { return nil }
                        decoded.append(contentsOf: String(Character(scalar)).utf8)
                    default: return nil
                    }
                default:
                    if byte < 0x20 { return nil }
                    decoded.append(byte)
                }
            }
            return nil
        }

        /// The text, if the bytes are UTF-8 (`String(validating:)` is newer than iOS 17): decoding
        /// repairs what is not, so a text whose bytes are the input's was valid.
        private static func validUTF8(_ bytes: UnsafeBufferPointer<UInt8>) -> String? {
            let text = String(decoding: bytes, as: UTF8.self)
            return text.utf8.elementsEqual(bytes) ? text : nil
        }

        /// After `\u`: four hex digits, and a low surrogate's escape after a high one.
        private mutating func unicodeEscape() -> Unicode.Scalar? {
            guard let unit = hex4() else { return nil }
            switch unit {
            case 0xD800..<0xDC00:
                guard consume(UInt8(ascii: "\\")), consume(UInt8(ascii: "u")), let low = hex4(), (0xDC00..<0xE000).contains(low) else { return nil }
                return Unicode.Scalar(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
            case 0xDC00..<0xE000:
                return nil
            default:
                return Unicode.Scalar(unit)
            }
        }

        private mutating func hex4() -> UInt32? {
            guard bytes.count - index >= 4 else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = bytes[index]
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
                default: return nil
                }
                value = value << 4 | UInt32(digit)
                index += 1
            }
            return value
        }
    }
}
