import Foundation
import ParleyProtocol

/// How the client reaches Janus: text frames both ways (the WebSocket API, subprotocol `janus-protocol`).
public protocol JanusTransport: Sendable {
    func send(_ text: String) async throws
    /// Every frame from Janus, in order; finishes when the connection closes.
    var incoming: AsyncStream<String> { get }
    func close() async
}

/// An SDP offer or answer as Janus carries it (`jsep`).
public struct JSEP: Hashable, Sendable {
    public var type: String
    public var sdp: String
    public init(type: String, sdp: String) { self.type = type; self.sdp = sdp }

    var json: JSONValue { .object(["type": .string(type), "sdp": .string(sdp)]) }
    init?(_ value: JSONValue?) {
        guard let type = value?["type"]?.stringValue, let sdp = value?["sdp"]?.stringValue else { return nil }
        self.init(type: type, sdp: sdp)
    }
}

/// What a handle hears from Janus outside the answers to its requests.
public enum JanusHandleEvent: Hashable, Sendable {
    /// A plugin event (`plugindata.data`), with a JSEP when the plugin sends one.
    case plugin([String: JSONValue], jsep: JSEP?)
    /// The PeerConnection is up (ICE and DTLS done).
    case webrtcUp
    /// Janus started or stopped receiving a kind of media.
    case media(type: String, receiving: Bool)
    /// Janus sees packet loss (`uplink` true: in what it receives).
    case slowLink(uplink: Bool, lost: Int)
    /// The PeerConnection closed.
    case hangup(reason: String)
    /// The handle is gone.
    case detached
    /// A trickled candidate from Janus (`nil`: end of candidates).
    case trickle(candidate: String?, sdpMid: String?, sdpMLineIndex: Int?)
}

/// One Janus session over one connection: transactions (a plugin's answer may come as `success`,
/// or as `ack` then `event`, or `event` then `ack`), keepalives, handles and their events.
public actor JanusClient {
    public let transport: any JanusTransport
    public private(set) var sessionID: Int64?
    private let keepaliveInterval: Duration
    private let requestTimeout: Duration
    private var pending: [String: Pending] = [:]
    private var handles: [Int64: AsyncStream<JanusHandleEvent>.Continuation] = [:]
    /// The connection's one task, from the first request to the connection's end: its reader, its
    /// writer, its keepalives and its requests' timeouts are its children. `close()` ends it.
    private var connection: Task<Void, Never>?
    /// Frames for the writer, in the order they were asked for.
    private var outbox: AsyncStream<(text: String, transaction: String)>.Continuation?
    /// Whether the session is to be kept alive (from its creation or claim to its destruction).
    private var keepingAlive = false

    private struct Pending {
        var answer: CheckedContinuation<[String: JSONValue], any Error>
        var deadline: ContinuousClock.Instant
        /// The request, in words, for the error if it is not answered in time.
        var request: String
    }
    private let sessionEvents: AsyncStream<JanusError>.Continuation
    /// Ends of the session that no request caused: `sessionTimedOut`, `disconnected`.
    public nonisolated let sessionEnded: AsyncStream<JanusError>

    public init(transport: any JanusTransport, keepalive: Duration = .seconds(25), requestTimeout: Duration = .seconds(10)) {
        self.transport = transport
        self.keepaliveInterval = keepalive
        self.requestTimeout = requestTimeout
        (sessionEnded, sessionEvents) = AsyncStream<JanusError>.makeStream()
    }

    // MARK: Session

    /// Creates the session and starts keepalives.
    @discardableResult
    public func createSession() async throws -> Int64 {
        let answer = try await request(["janus": "create"], sessionless: true)
        guard let id = answer["data"]?["id"]?.int64 else { throw JanusError.malformed("create: no data.id") }
        sessionID = id
        keepingAlive = true
        return id
    }

    /// Takes over an existing session after a reconnect (`claim`), where the server still holds it.
    public func claim(session id: Int64) async throws {
        sessionID = id
        _ = try await request(["janus": "claim"])
        keepingAlive = true
    }

    public func keepaliveNow() async throws {
        _ = try await request(["janus": "keepalive"], acknowledged: true)
    }

    /// Destroys the session; its handles are detached by Janus.
    public func destroy() async throws {
        keepingAlive = false
        defer { finish(.disconnected, notify: false) }
        _ = try await request(["janus": "destroy"])
    }

    /// Closes the connection without telling Janus (it times the session out).
    public func close() async {
        keepingAlive = false
        await transport.close()
        connection?.cancel()
    }

    // MARK: Handles

    /// Attaches to a plugin; the stream carries the handle's events.
    public func attach(plugin: String, opaqueID: String? = nil) async throws -> (id: Int64, events: AsyncStream<JanusHandleEvent>) {
        var frame: [String: JSONValue] = ["janus": "attach", "plugin": .string(plugin)]
        if let opaqueID { frame["opaque_id"] = .string(opaqueID) }
        let answer = try await request(frame)
        guard let id = answer["data"]?["id"]?.int64 else { throw JanusError.malformed("attach: no data.id") }
        let (events, continuation) = AsyncStream<JanusHandleEvent>.makeStream()
        handles[id] = continuation
        return (id, events)
    }

    public func detach(_ handle: Int64) async throws {
        _ = try await request(["janus": "detach", "handle_id": .number(Double(handle))])
        handles.removeValue(forKey: handle)?.finish()
    }

    /// Closes the handle's PeerConnection.
    public func hangup(_ handle: Int64) async throws {
        _ = try await request(["janus": "hangup", "handle_id": .number(Double(handle))])
    }

    /// A plugin request; answers `plugindata.data` and the JSEP, and throws the plugin's `error_code`.
    public func message(_ handle: Int64, body: [String: JSONValue], jsep: JSEP? = nil) async throws -> (data: [String: JSONValue], jsep: JSEP?) {
        var frame: [String: JSONValue] = ["janus": "message", "handle_id": .number(Double(handle)), "body": .object(body)]
        if let jsep { frame["jsep"] = jsep.json }
        let answer = try await request(frame)
        guard case .object(let data)? = answer["plugindata"]?["data"] else { throw JanusError.malformed("no plugindata in the answer") }
        if let code = data["error_code"]?.int64 {
            throw JanusError.audioBridge(AudioBridgeError(rawValue: Int(code)), reason: data["error"]?.stringValue ?? "")
        }
        return (data, JSEP(answer["jsep"]))
    }

    /// Trickles a local candidate (`nil`: end of candidates).
    public func trickle(_ handle: Int64, candidate: String?, sdpMid: String?, sdpMLineIndex: Int?) async throws {
        let value: JSONValue
        if let candidate {
            var fields: [String: JSONValue] = ["candidate": .string(candidate)]
            if let sdpMid { fields["sdpMid"] = .string(sdpMid) }
            if let sdpMLineIndex { fields["sdpMLineIndex"] = .number(Double(sdpMLineIndex)) }
            value = .object(fields)
        } else {
            value = .object(["completed": .bool(true)])
        }
        _ = try await request(["janus": "trickle", "handle_id": .number(Double(handle)), "candidate": value], acknowledged: true)
    }

    // MARK: Transactions

    /// Sends a request and waits for its answer. `acknowledged`: the `ack` is the answer
    /// (keepalive, trickle); otherwise an `ack` only says an `event` follows, and the answer is the
    /// `success` or the `event`, whichever order Janus sends things in.
    private func request(_ fields: [String: JSONValue], sessionless: Bool = false, acknowledged: Bool = false) async throws -> [String: JSONValue] {
        var frame = fields
        let transaction = Self.transactionID()
        frame["transaction"] = .string(transaction)
        if !sessionless {
            guard let sessionID else { throw JanusError.malformed("no session: call createSession() first") }
            frame["session_id"] = .number(Double(sessionID))
        }
        if acknowledged { acknowledgedTransactions.insert(transaction) }
        let text = String(decoding: try JSONEncoder.sorted.encode(JSONValue.object(frame)), as: UTF8.self)
        let verb = fields["janus"]?.stringValue ?? "?"
        let request = (fields["body"]?["request"]?.stringValue).map { "\(verb) \($0)" } ?? verb
        startConnection()
        return try await withCheckedThrowingContinuation { continuation in
            pending[transaction] = Pending(answer: continuation, deadline: .now + requestTimeout, request: request)
            guard case .enqueued? = outbox?.yield((text, transaction)) else { return fail(transaction, with: .disconnected) }
        }
    }

    /// Starts the connection's task, once: frames leave in the order they were asked for (a
    /// trickled candidate never overtakes its offer) from one writer; requests not answered by
    /// their deadline fail (looked at every tenth of a second); keepalives go every
    /// `keepaliveInterval` while there is a session; and the reader, the task's own body, ends it
    /// all when the connection closes.
    private func startConnection() {
        guard connection == nil else { return }
        let (frames, outbox) = AsyncStream<(text: String, transaction: String)>.makeStream()
        self.outbox = outbox
        let transport = self.transport, incoming = transport.incoming, interval = keepaliveInterval
        connection = Task { [weak self] in
            await withDiscardingTaskGroup { group in
                group.addTask { [weak self] in
                    for await frame in frames {
                        do { try await transport.send(frame.text) } catch { await self?.fail(frame.transaction, throwing: error) }
                    }
                }
                group.addTask { [weak self] in
                    while (try? await Task.sleep(for: .milliseconds(100))) != nil { await self?.failLateRequests() }
                }
                group.addTask { [weak self] in
                    while (try? await Task.sleep(for: interval)) != nil, let self {
                        guard await self.keepsAlive() else { return }
                    }
                }
                for await text in incoming { await self?.receive(text) }
                outbox.finish()
                await self?.finish(.disconnected, notify: true)
                group.cancelAll()
            }
        }
    }

    private func failLateRequests() {
        let now = ContinuousClock.now
        for (transaction, request) in pending where request.deadline <= now {
            fail(transaction, with: .noAnswer(request: request.request))
        }
    }

    /// A keepalive, when the session is kept alive. One left unanswered within the request
    /// timeout means the path to Janus went silent without a reset (the socket would not say so
    /// for minutes): the connection is closed, and its end reported as `disconnected` on
    /// `sessionEnded`. False once it is closed so.
    private func keepsAlive() async -> Bool {
        guard keepingAlive else { return true }
        do {
            try await keepaliveNow()
        } catch JanusError.noAnswer {
            await transport.close()
            return false
        } catch {
            // Another answer (the session timed out, the connection closed) is reported where it arrives.
        }
        return true
    }

    private var acknowledgedTransactions: Set<String> = []

    private func fail(_ transaction: String, with error: JanusError) {
        fail(transaction, throwing: error)
    }

    /// Ends a request with `error` (the transport's own, when sending failed).
    private func fail(_ transaction: String, throwing error: any Error) {
        acknowledgedTransactions.remove(transaction)
        pending.removeValue(forKey: transaction)?.answer.resume(throwing: error)
    }

    func receive(_ text: String) {
        guard let inbound = JanusInbound(text) else { return }
        if let transaction = inbound.transaction, pending[transaction] != nil {
            switch inbound.verb {
            case "ack" where !acknowledgedTransactions.contains(transaction):
                return  // an event follows (or came already)
            case "error":
                let error = inbound.frame["error"]
                fail(transaction, with: .core(JanusCoreError(rawValue: Int(error?["code"]?.int64 ?? 0)), reason: error?["reason"]?.stringValue ?? ""))
            default:
                acknowledgedTransactions.remove(transaction)
                pending.removeValue(forKey: transaction)?.answer.resume(returning: inbound.frame)
            }
            return
        }
        if inbound.verb == "timeout" {
            finish(.sessionTimedOut, notify: true)
            return
        }
        guard let (sender, event) = inbound.handleEvent, let handle = handles[sender] else { return }
        handle.yield(event)
        if event == .detached {
            handle.finish()
            handles.removeValue(forKey: sender)
        }
    }

    /// The session ended: its requests fail and its handles' events end (the connection may go on,
    /// for a new session).
    private func finish(_ reason: JanusError, notify: Bool) {
        keepingAlive = false
        for (transaction, request) in pending {
            request.answer.resume(throwing: reason)
            acknowledgedTransactions.remove(transaction)
        }
        pending.removeAll()
        for handle in handles.values { handle.finish() }
        handles.removeAll()
        if notify, sessionID != nil { sessionEvents.yield(reason) }
        sessionID = nil
    }

    static func transactionID() -> String {
        let letters = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        return String((0..<12).map { _ in letters.randomElement()! })
    }
}

extension JSONEncoder {
    static var sorted: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }
}

/// One frame from Janus, read: its verb, the transaction it names (an answer, or a plugin event that
/// answers one), and what it says of a handle. Which transactions are pending is the client's
/// question; this only reads.
package struct JanusInbound: Sendable {
    package var verb: String
    package var transaction: String?
    package var frame: [String: JSONValue]
    /// The handle the frame is about (`sender`) and what it says, when it is an event this client uses.
    package var handleEvent: (sender: Int64, event: JanusHandleEvent)?

    /// nil: not JSON, not an object, or no `janus` verb.
    package init?(_ text: String) {
        guard case .object(let frame)? = try? JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)),
              let verb = frame["janus"]?.stringValue else { return nil }
        self.verb = verb
        self.frame = frame
        transaction = frame["transaction"]?.stringValue
        handleEvent = frame["sender"]?.int64.flatMap { sender in Self.event(verb, frame).map { (sender, $0) } }
    }

    private static func event(_ verb: String, _ frame: [String: JSONValue]) -> JanusHandleEvent? {
        switch verb {
        case "event":
            guard case .object(let data)? = frame["plugindata"]?["data"] else { return nil }
            return .plugin(data, jsep: JSEP(frame["jsep"]))
        case "webrtcup": return .webrtcUp
        case "media": return .media(type: frame["type"]?.stringValue ?? "audio", receiving: frame["receiving"] == .bool(true))
        case "slowlink": return .slowLink(uplink: frame["uplink"] == .bool(true), lost: Int(frame["lost"]?.int64 ?? 0))
        case "hangup": return .hangup(reason: frame["reason"]?.stringValue ?? "")
        case "detached": return .detached
        case "trickle":
            let candidate = frame["candidate"]
            if candidate?["completed"] == .bool(true) { return .trickle(candidate: nil, sdpMid: nil, sdpMLineIndex: nil) }
            return .trickle(candidate: candidate?["candidate"]?.stringValue, sdpMid: candidate?["sdpMid"]?.stringValue,
                            sdpMLineIndex: candidate?["sdpMLineIndex"]?.int64.map(Int.init))
        default: return nil
        }
    }
}

extension JSONValue {
    /// A whole number (Janus ids reach 2^53 − 1, which a Double holds exactly).
    package var int64: Int64? {
        if case .number(let value) = self, value.rounded() == value, abs(value) <= 9_007_199_254_740_992 { return Int64(value) }
        return nil
    }
}
