/// The frames a relay writes most, written by hand: an ack with nothing more to say, and a
/// `call.signal` relayed to the far side. Byte for byte what `WireCodec`'s `JSONEncoder` writes
/// (sorted keys, slashes as they are), at a fraction of its cost: the relay path writes two frames
/// for every one it reads (`FrameWriterTests` compare the two, byte for byte, on many values, awkward
/// strings among them).
enum FrameWriter {
    /// The frame as `JSONEncoder` would write it, when it is one of the shapes written here.
    static func encode(_ frame: ServerFrame) -> String? {
        switch frame.message {
        case .ack(let ack):
            guard case .done = ack.result else { return nil }
            var text = #"{"re":"#
            appendString(ack.re, to: &text)
            appendSeq(frame.seq, to: &text)
            text += #""type":"ack"}"#
            return text
        case .callSignal(let signal):
            var text = #"{"call":"#
            appendString(signal.call.rawValue, to: &text)
            switch signal.signal.candidate {
            case .candidate(let candidate)?:
                text += #","candidate":{"candidate":"#
                appendString(candidate.candidate, to: &text)
                if let index = candidate.sdpMLineIndex {
                    text += #","sdpMLineIndex":"#
                    text += String(index)
                }
                if let mid = candidate.sdpMid {
                    text += #","sdpMid":"#
                    appendString(mid, to: &text)
                }
                if let fragment = candidate.usernameFragment {
                    text += #","usernameFragment":"#
                    appendString(fragment, to: &text)
                }
                text += "}"
            case .endOfCandidates?:
                text += #","candidate":null"#
            case nil:
                break
            }
            if let description = signal.signal.description {
                text += #","description":{"sdp":"#
                appendString(description.sdp, to: &text)
                text += #","type":"#
                appendString(description.type, to: &text)
                text += "}"
            }
            text += #","from":{"#
            let from = signal.from
            if let address = from.address {
                text += #""address":"#
                appendString(address, to: &text)
                text += ","
            }
            text += #""device":"#
            appendString(from.device.rawValue, to: &text)
            if let name = from.name {
                text += #","name":"#
                appendString(name, to: &text)
            }
            text += #","user":"#
            appendString(from.user.rawValue, to: &text)
            text += "}"
            if signal.signal.restartIce { text += #","restartIce":true"# }
            appendSeq(frame.seq, to: &text)
            text += #""type":"call.signal"}"#
            return text
        default:
            return nil
        }
    }

    /// `,"seq":N,` or `,` (the separator before `type` either way).
    private static func appendSeq(_ seq: Int?, to text: inout String) {
        if let seq {
            text += #","seq":"#
            text += String(seq)
        }
        text += ","
    }

    /// A JSON string as Foundation writes it: quotes, backslashes and control characters escaped,
    /// everything else (slashes, non-ASCII) as it is.
    static func appendString(_ value: String, to text: inout String) {
        text += "\""
        var clean = true
        for byte in value.utf8 where byte < 0x20 || byte == 0x22 || byte == 0x5C {
            clean = false
            break
        }
        if clean {
            text += value
        } else {
            for scalar in value.unicodeScalars {
                switch scalar {
                case "\"": text += "\\\""
                case "\\": text += "\\\\"
                case "\n": text += "\\n"
                case "\r": text += "\\r"
                case "\t": text += "\\t"
                case "\u{08}": text += "\\b"
                case "\u{0C}": text += "\\f"
                case _ where scalar.value < 0x20:
                    text += "\\u00"
                    text += scalar.value < 0x10 ? "0" : "1"
                    text += String(scalar.value & 0xF, radix: 16)
                default:
                    text.unicodeScalars.append(scalar)
                }
            }
        }
        text += "\""
    }
}
