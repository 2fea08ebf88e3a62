/// The few SDP facts the engine reads or rewrites. webrtcbin parses SDP itself; this is only for
/// what its API does not expose (ICE restart credentials, payload types, m-line ids). Package-wide
/// so the fuzzers (`ParleyFuzzTargets`) reach it.
package enum SDPText {
    /// The first `a=ice-ufrag` value.
    package static func iceUfrag(_ sdp: String) -> String? { attribute("ice-ufrag", in: sdp).first }

    /// The `a=mid` of each m-section, in order (nil where a section has none).
    package static func mids(_ sdp: String) -> [String?] {
        var mids: [String?] = []
        for line in lines(sdp) {
            if line.hasPrefix("m=") { mids.append(nil) }
            else if line.hasPrefix("a=mid:"), !mids.isEmpty { mids[mids.count - 1] = String(line.dropFirst(6)) }
        }
        return mids
    }

    /// The RTP payload type the description maps to `codec` (case-insensitive, e.g. "opus").
    package static func payloadType(of codec: String, in sdp: String) -> Int? {
        for value in attribute("rtpmap", in: sdp) {
            // "111 opus/48000/2"
            let parts = value.split(separator: " ", maxSplits: 1)
            guard parts.count == 2, let type = Int(parts[0]) else { continue }
            if parts[1].lowercased().hasPrefix(codec.lowercased() + "/") { return type }
        }
        return nil
    }

    /// Replaces every ICE username fragment and password: an ICE restart (RFC 8839 §4.4.1.1.1),
    /// which webrtcbin 1.22's create-offer cannot ask for itself.
    package static func replacingIceCredentials(in sdp: String, ufrag: String, password: String) -> String {
        let rewritten = lines(sdp).map { line -> String in
            if line.hasPrefix("a=ice-ufrag:") { return "a=ice-ufrag:" + ufrag }
            if line.hasPrefix("a=ice-pwd:") { return "a=ice-pwd:" + password }
            return line
        }
        return rewritten.joined(separator: "\r\n") + "\r\n"
    }

    /// Replaces every `a=fingerprint` value with `fingerprint` ("sha-256 AB:…").
    package static func replacingFingerprint(in sdp: String, with fingerprint: String) -> String {
        let rewritten = lines(sdp).map { line in line.hasPrefix("a=fingerprint:") ? "a=fingerprint:" + fingerprint : line }
        return rewritten.joined(separator: "\r\n") + "\r\n"
    }

    /// The first `a=fingerprint` value.
    package static func fingerprint(_ sdp: String) -> String? { attribute("fingerprint", in: sdp).first }

    /// Fresh ICE credentials from the ice-char set (RFC 8839: ufrag ≥ 4, password ≥ 22 characters).
    package static func newIceCredentials() -> (ufrag: String, password: String) {
        let chars = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/")
        func random(_ count: Int) -> String { String((0..<count).map { _ in chars.randomElement()! }) }
        return (random(8), random(24))
    }

    private static func attribute(_ name: String, in sdp: String) -> [String] {
        let prefix = "a=\(name):"
        return lines(sdp).filter { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }
    }

    /// Lines end in CRLF, or LF. Every carriage return at a line's end goes with it: dropping just
    /// one made a rewrite change a line that ended in several (the fuzzer's find), since the rewrite
    /// ends each line in CRLF again.
    private static func lines(_ sdp: String) -> [String] {
        sdp.split(omittingEmptySubsequences: true, whereSeparator: { $0 == "\n" || $0 == "\r\n" })
            .map { line in
                var line = Substring(line)
                while line.hasSuffix("\r") { line = line.dropLast() }
                return String(line)
            }
    }
}
