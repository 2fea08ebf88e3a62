import Foundation
import ParleyGStreamer
import ParleyJanus
import ParleyProtocol
import ParleyServer

/// What the fuzzers feed bytes to: each target decodes its input as the real code path does and
/// checks what must hold of the result (a frame that decodes re-encodes to itself; an error says what
/// is wrong; a token verifies only as the one it was made from). A crash (a trap in Parley's code,
/// or under AddressSanitizer a bad access) is a finding too.
///
/// `scripts/fuzz.sh` runs them under libFuzzer (`parley-fuzz`, built with `--sanitize=fuzzer`); the
/// test suite replays every seed and every saved finding through them (`Fuzz/findings/<target>/`).
public enum FuzzTarget: String, CaseIterable, Sendable {
    /// A client's WebSocket frame, as the server decodes it (`WireCodec.decodeClientMessage`).
    case clientFrame = "client-frame"
    /// A server's frame, as the SDK decodes it (`WireCodec.decodeServerFrame`).
    case serverFrame = "server-frame"
    /// The JSON bodies of the HTTP API: a device registration, a development token request.
    case httpBody = "http-body"
    /// An access token, as the server verifies it (`TokenAuthority.verify`).
    case token
    /// An SDP description, through the few helpers the engine reads and rewrites SDP with.
    case sdp
    /// A WAV file, as `parley call --play` and the tests read one (`WAV.decode`).
    case wav
    /// A frame from Janus, as the Janus client reads it (`JanusInbound`), and an AudioBridge event
    /// made of it (`AudioBridgeEvent.from`).
    case janus
    /// The signaling hub as a whole: a script of steps by three devices, with its rules checked after
    /// each (`HubScript`).
    case hub

    /// Where the seeds for this target are, relative to the package's root.
    public var seedFolders: [String] {
        switch self {
        case .clientFrame: ["Tests/ParleyProtocolTests/Golden"]
        case .serverFrame: ["Tests/ParleyProtocolTests/Golden"]
        case .httpBody, .token, .sdp, .wav, .janus, .hub: ["Fuzz/seeds/\(rawValue)"]
        }
    }

    /// Whether a seed file belongs to this target (the golden frames hold both directions).
    public func takes(seed name: String) -> Bool {
        switch self {
        case .clientFrame: name.hasPrefix("client-")
        case .serverFrame: name.hasPrefix("server-")
        default: !name.hasPrefix(".")
        }
    }
}

/// What the input broke: a rule that must hold of every input did not.
public struct FuzzFailure: Error, CustomStringConvertible {
    public var target: FuzzTarget
    public var description: String
}

extension FuzzTarget {
    /// Feeds `data` to the target; throws what the input broke.
    public func run(_ data: Data) async throws(FuzzFailure) {
        func fail(_ text: String) -> FuzzFailure { FuzzFailure(target: self, description: text) }
        switch self {
        case .token: try await token(data, fail)
        case .hub: try await HubScript.run(data, fail)
        default:
            try runOnThisThread(data)
        }
    }

    /// Whether the target needs a task (the token key and the hub are actors).
    public var isAsync: Bool { self == .token || self == .hub }

    /// Feeds `data` to a target that needs no task (`isAsync` false), on the calling thread: without a
    /// task and a wait per input, libFuzzer ran 54,000 inputs a second here instead of 155.
    public func runOnThisThread(_ data: Data) throws(FuzzFailure) {
        func fail(_ text: String) -> FuzzFailure { FuzzFailure(target: self, description: text) }
        switch self {
        case .clientFrame: try clientFrame(data, fail)
        case .serverFrame: try serverFrame(data, fail)
        case .httpBody: try httpBody(data, fail)
        case .sdp: try sdp(data, fail)
        case .wav: try wav(data, fail)
        case .janus: try janus(data, fail)
        case .token, .hub: preconditionFailure("\(rawValue) needs a task: use run(_:)")
        }
    }

    private func clientFrame(_ data: Data, _ fail: (String) -> FuzzFailure) throws(FuzzFailure) {
        let codec = WireCodec()
        // The frames read by hand are read as `JSONDecoder` reads them, mistakes included.
        let byHand = Result { () throws(ProtocolError) in try codec.decodeClientMessage(data) }
        let byFoundation = Result { () throws(ProtocolError) in try codec.decodeClientMessage(data, byHand: false) }
        guard byHand == byFoundation else {
            throw fail("the frame read by hand is \(byHand), by JSONDecoder \(byFoundation)")
        }
        try roundTrip(data, "a frame", decode: { (data) throws(ProtocolError) in try codec.decodeClientMessage(data) }, encode: codec.encode, fail)
    }

    private func serverFrame(_ data: Data, _ fail: (String) -> FuzzFailure) throws(FuzzFailure) {
        let codec = WireCodec()
        try roundTrip(data, "a server frame", decode: codec.decodeServerFrame, encode: codec.encode, fail)
    }

    /// What decodes must decode again, to the same value, once re-encoded; what does not must be
    /// refused with an error that says why.
    private func roundTrip<T: Equatable>(_ data: Data, _ what: String, decode: (Data) throws(ProtocolError) -> T,
                                         encode: (T) -> Data, _ fail: (String) -> FuzzFailure) throws(FuzzFailure) {
        let value: T
        do {
            value = try decode(data)
        } catch {
            try check(error, fail)
            return
        }
        let again: T
        do { again = try decode(encode(value)) } catch {
            throw fail("\(what) that decoded did not decode again once re-encoded: \(error)")
        }
        guard again == value else { throw fail("\(what) changed through a re-encoding: \(value) became \(again)") }
    }

    /// The first byte picks the body (even: a device registration, odd: a token request), as a route
    /// picks it; the rest is the body.
    private func httpBody(_ data: Data, _ fail: (String) -> FuzzFailure) throws(FuzzFailure) {
        guard let first = data.first else { return }
        let body = Data(data.dropFirst())
        func roundTrip<T: Codable & Equatable>(_ type: T.Type) throws(FuzzFailure) {
            let value: T
            do {
                value = try JSONDecoder().decode(T.self, from: body)
            } catch {
                // What the route answers with: it must say something, and never echo a huge id.
                try check(WireCodec.describe(error, in: body), fail)
                return
            }
            do {
                let again = try JSONDecoder().decode(T.self, from: JSONEncoder().encode(value))
                guard again == value else { throw fail("\(T.self) changed through a re-encoding") }
            } catch let failure as FuzzFailure {
                throw failure
            } catch {
                throw fail("\(T.self) that decoded did not decode again once re-encoded: \(error)")
            }
        }
        if first % 2 == 0 { try roundTrip(DeviceRegistration.self) } else { try roundTrip(DevTokenRequest.self) }
    }

    private func token(_ data: Data, _ fail: (String) -> FuzzFailure) async throws(FuzzFailure) {
        let fixture = await TokenFixture.shared.ready()
        let text = String(decoding: data, as: UTF8.self)
        let identity: Identity
        do {
            identity = try await fixture.authority.verify(text, now: fixture.now)
        } catch {
            guard !error.message.isEmpty else { throw fail("a refused token without a reason") }
            return
        }
        // Only a token with the fixture's signature verifies, and it says what the fixture's said.
        guard identity == fixture.identity else {
            throw fail("a token verified as \(identity) that the key never signed (signed: \(fixture.identity))")
        }
    }

    private func sdp(_ data: Data, _ fail: (String) -> FuzzFailure) throws(FuzzFailure) {
        let text = String(decoding: data, as: UTF8.self)
        let mids = SDPText.mids(text)
        _ = SDPText.payloadType(of: "opus", in: text)
        let hadUfrag = SDPText.iceUfrag(text) != nil
        let rewritten = SDPText.replacingIceCredentials(in: text, ufrag: "fuzzUfrag", password: "fuzzPasswordOf22Chars+/")
        guard SDPText.mids(rewritten) == mids else { throw fail("an ICE restart's rewrite changed the m-sections' ids") }
        guard SDPText.iceUfrag(rewritten) == (hadUfrag ? "fuzzUfrag" : nil) else {
            throw fail("an ICE restart's rewrite left the old username fragment")
        }
    }

    private func wav(_ data: Data, _ fail: (String) -> FuzzFailure) throws(FuzzFailure) {
        let audio: WAV.Audio
        do {
            audio = try WAV.decode(data, name: "fuzz.wav")
        } catch {
            guard !error.description.isEmpty else { throw fail("a refused WAV file without a reason") }
            return
        }
        guard audio.channels > 0, audio.sampleRate > 0 else { throw fail("a WAV file read with \(audio.channels) channels at \(audio.sampleRate) Hz") }
        guard audio.samples.count <= data.count / 2 else { throw fail("more samples than the file holds") }
        let mono = audio.mono(from: 0.01, length: 0.5)
        guard mono.allSatisfy({ (-1...1).contains($0) }) else { throw fail("a sample outside -1…1") }
    }

    private func janus(_ data: Data, _ fail: (String) -> FuzzFailure) throws(FuzzFailure) {
        guard let inbound = JanusInbound(String(decoding: data, as: UTF8.self)) else { return }
        guard inbound.frame["janus"]?.stringValue == inbound.verb else { throw fail("a frame read with a verb it does not have") }
        guard let (sender, event) = inbound.handleEvent else { return }
        guard inbound.frame["sender"]?.int64 == sender else { throw fail("an event given to handle \(sender), which the frame does not name") }
        switch AudioBridgeEvent.from(event) {
        case .joined(_, let participants)?, .participantsUpdated(_, let participants)?, .roomChanged(_, _, let participants)?:
            // Each participant comes from one entry of the frame's list, and none without an id.
            guard case .plugin(let payload, _) = event, case .array(let listed)? = payload["participants"] else {
                guard participants.isEmpty else { throw fail("participants read from a frame that lists none") }
                return
            }
            guard participants.map(\.id) == listed.compactMap({ $0["id"]?.int64 }) else {
                throw fail("participants \(participants.map(\.id)) read from a list whose ids are \(listed.compactMap { $0["id"]?.int64 })")
            }
        default:
            break
        }
    }

    /// Whether `data` is a token the token target's key signed and that is valid at its time: what a
    /// seed for that target must be.
    public static func tokenVerifies(_ data: Data) async -> Bool {
        let fixture = await TokenFixture.shared.ready()
        return (try? await fixture.authority.verify(String(decoding: data, as: UTF8.self), now: fixture.now)) != nil
    }

    /// An error from decoding: says what is wrong, and never carries a request id longer than the limit.
    private func check(_ error: ProtocolError, _ fail: (String) -> FuzzFailure) throws(FuzzFailure) {
        guard !error.message.isEmpty else { throw fail("an error without a message: \(error)") }
        if let id = error.requestID, id.isEmpty || id.count > WireCodec.maxRequestIDLength {
            throw fail("an error echoes an id of \(id.count) characters")
        }
    }
}

/// One token authority and one token it signed, for the token target (made once: the key's setup is
/// slower than a verification).
actor TokenFixture {
    static let shared = TokenFixture()

    struct Ready: Sendable {
        var authority: TokenAuthority
        var identity: Identity
        var now: Date
    }

    private var ready: Ready?

    func ready() async -> Ready {
        if let ready { return ready }
        let now = Date(timeIntervalSince1970: 1_790_000_000)
        // Fixed, so the seeds (Fuzz/seeds/token) carry a token this key signed and that is valid at `now`.
        let authority = try! await TokenAuthority(key: .hs256(secret: "parley-fuzz-secret-0123456789abcdef"))
        let (token, _) = try! await authority.mint(user: UserID(rawValue: "alice")!, name: "Alice", lifetime: .seconds(3600), now: now)
        let identity = try! await authority.verify(token, now: now)
        let made = Ready(authority: authority, identity: identity, now: now)
        ready = made
        return made
    }
}
