/// The frames a server writes most, written by hand: an ack with nothing more to say, a
/// `call.signal` relayed to the far side, and what every call setup writes (the invite's ack,
/// `call.incoming` without metadata, `call.ringing`, `call.accepted`, `call.ended`). Byte for byte what `WireCodec`'s `JSONEncoder`
/// writes (sorted keys, slashes as they are, a whole number without ".0"), at a fraction of its
/// cost: the relay path writes two frames for every one it reads, and a call setup seven of these
/// (`FrameWriterTests` compare the two, byte for byte, on many values, awkward strings among them).
enum FrameWriter {
    /// The frame as `JSONEncoder` would write it, when it is one of the shapes written here.
    static func encode(_ frame: ServerFrame) -> String? {
        switch frame.message {
        case .ack(let ack):
            var text = "{"
            switch ack.result {
            case .done:
                break
            case .callInvite(let invite):
                text += #""call":"#
                appendString(invite.call.rawValue, to: &text)
                text += #","devices":"#
                text += String(invite.devices)
                text += #","expiresAt":"#
                text += String(invite.expiresAt)
                text += #","pushed":"#
                text += String(invite.pushed)
                text += ","
            default:
                return nil
            }
            text += #""re":"#
            appendString(ack.re, to: &text)
            end(&text, seq: frame.seq, type: "ack")
            return text
        case .callIncoming(let incoming):
            // Metadata is any JSON the caller sent: JSONEncoder writes it.
            guard incoming.metadata == nil else { return nil }
            var text = #"{"call":"#
            appendString(incoming.call.rawValue, to: &text)
            text += #","expiresAt":"#
            text += String(incoming.expiresAt)
            text += #","from":"#
            appendParty(incoming.from, to: &text)
            text += incoming.media.audio ? #","media":{"audio":true"# : #","media":{"audio":false"#
            text += incoming.media.video ? #","video":true}"# : #","video":false}"#
            end(&text, seq: frame.seq, type: "call.incoming")
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
            text += #","from":"#
            appendParty(signal.from, to: &text)
            if signal.signal.restartIce { text += #","restartIce":true"# }
            end(&text, seq: frame.seq, type: "call.signal")
            return text
        case .callRinging(let ringing):
            var text = #"{"call":"#
            appendString(ringing.call.rawValue, to: &text)
            if let device = ringing.device {
                text += #","device":"#
                appendString(device.rawValue, to: &text)
            }
            if let early = ringing.early { text += early ? #","early":true"# : #","early":false"# }
            end(&text, seq: frame.seq, type: "call.ringing")
            return text
        case .callAccepted(let accepted):
            var text = #"{"call":"#
            appendString(accepted.call.rawValue, to: &text)
            text += #","device":"#
            appendString(accepted.device.rawValue, to: &text)
            end(&text, seq: frame.seq, type: "call.accepted")
            return text
        case .callEnded(let ended):
            // JSONEncoder refuses what JSON cannot say; it answers for itself.
            if let duration = ended.duration, !duration.isFinite { return nil }
            var text = #"{"call":"#
            appendString(ended.call.rawValue, to: &text)
            if let detail = ended.detail {
                text += #","detail":"#
                appendString(detail, to: &text)
            }
            if let duration = ended.duration {
                text += #","duration":"#
                // As JSONEncoder writes a Double: its description, without a whole number's ".0".
                let number = duration.description
                text += number.hasSuffix(".0") ? String(number.dropLast(2)) : number
            }
            text += #","endedAt":"#
            text += String(ended.endedAt)
            text += #","reason":"#
            appendString(ended.reason.rawValue, to: &text)
            end(&text, seq: frame.seq, type: "call.ended")
            return text
        default:
            return nil
        }
    }

    /// A `Party` object, its keys sorted.
    private static func appendParty(_ party: Party, to text: inout String) {
        text += "{"
        if let address = party.address {
            text += #""address":"#
            appendString(address, to: &text)
            text += ","
        }
        text += #""device":"#
        appendString(party.device.rawValue, to: &text)
        if let name = party.name {
            text += #","name":"#
            appendString(name, to: &text)
        }
        text += #","user":"#
        appendString(party.user.rawValue, to: &text)
        text += "}"
    }

    /// Ends a frame: its `seq` if it has one, then its `type` (the keys' order).
    private static func end(_ text: inout String, seq: Int?, type: String) {
        appendSeq(seq, to: &text)
        text += #""type":""#
        text += type
        text += "\"}"
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
