import Foundation

/// Why a frame could not be read. Maps to protocol error codes at the edge (`errorCode`).
public struct ProtocolError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Kind: String, Hashable, Sendable {
        /// The frame is not valid UTF-8 JSON.
        case invalidJSON
        /// The frame is JSON but not an object.
        case notAnObject
        /// The object has no string `type`.
        case missingType
        /// `type` names no message of this protocol version.
        case unknownType
        /// A field is missing, of the wrong type, or out of range.
        case invalidField
    }

    public var kind: Kind
    /// The frame's `id`, when one could be read, so the error can name the request (`re`).
    public var requestID: String?
    /// The frame's `type`, when one could be read.
    public var type: String?
    /// A sentence for humans.
    public var message: String

    public init(kind: Kind, requestID: String? = nil, type: String? = nil, message: String) {
        self.kind = kind
        self.requestID = requestID
        self.type = type
        self.message = message
    }

    /// The protocol error code a server answers with.
    public var errorCode: ErrorCode { kind == .unknownType ? .unsupported : .badRequest }

    public var description: String { "\(kind.rawValue): \(message)" }
}

/// Reads and writes protocol v1 frames.
public struct WireCodec: Sendable {
    public static let maxRequestIDLength = 64
    public static let maxDisplayLength = 128
    public static let maxReasonLength = 256

    public init() {}

    /// One encoder and one decoder for every frame: their options never change, and each call
    /// keeps its own state (Foundation's coders are safe to share between threads).
    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()
    private static let decoder = JSONDecoder()

    // MARK: Client frames

    /// A client's frame: the frames a call reads most by hand (`FrameReader`), the rest and every
    /// mistake by `JSONDecoder` (`byHand: false`: by `JSONDecoder` alone, which the tests and the
    /// fuzzer compare it with); the same value, or the same error, either way.
    public func decodeClientMessage(_ data: Data, byHand: Bool = true) throws(ProtocolError) -> ClientMessage {
        if byHand, let message = data.withUnsafeBytes({ FrameReader.read($0.assumingMemoryBound(to: UInt8.self)) }) {
            try Self.validate(message)
            return message
        }
        let message: ClientMessage
        do {
            message = try Self.decoder.decode(ClientMessage.self, from: data)
        } catch {
            throw Self.describe(error, in: data)
        }
        try Self.validate(message)
        return message
    }

    public func decodeClientMessage(_ text: String) throws(ProtocolError) -> ClientMessage {
        switch text.utf8.withContiguousStorageIfAvailable(FrameReader.read) {
        case .some(.some(let message)):
            try Self.validate(message)
            return message
        case .some(.none): return try decodeClientMessage(Data(text.utf8), byHand: false)
        case .none: return try decodeClientMessage(Data(text.utf8))
        }
    }

    public func encode(_ message: ClientMessage) -> Data {
        // Encoding our own value types cannot fail: every field is a string, number, bool or JSONValue.
        try! Self.encoder.encode(message)
    }

    // MARK: Server frames

    public func encode(_ frame: ServerFrame) -> Data {
        if let text = FrameWriter.encode(frame) { return Data(text.utf8) }
        return try! Self.encoder.encode(frame)
    }

    /// The frame as text, as a server writes it: the frames a relay and a call setup write most (an
    /// ack with nothing to add or an invite's, a relayed `call.signal`, the call's news) by hand
    /// (`FrameWriter`), the rest by `JSONEncoder`; the same bytes either way.
    public func encodeText(_ frame: ServerFrame) -> String {
        FrameWriter.encode(frame) ?? String(decoding: try! Self.encoder.encode(frame), as: UTF8.self)
    }

    public func decodeServerFrame(_ data: Data) throws(ProtocolError) -> ServerFrame {
        do {
            return try Self.decoder.decode(ServerFrame.self, from: data)
        } catch {
            throw Self.describe(error, in: data)
        }
    }

    public func decodeServerFrame(_ text: String) throws(ProtocolError) -> ServerFrame {
        try decodeServerFrame(Data(text.utf8))
    }

    // MARK: Errors

    /// Reads what can be read of a frame that failed to decode: its `id` and `type`.
    private struct Probe: Decodable {
        var id: String?
        var type: String?

        enum CodingKeys: String, CodingKey { case id, type }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            id = try? container.decodeIfPresent(String.self, forKey: .id)
            type = try? container.decodeIfPresent(String.self, forKey: .type)
        }
    }

    /// An id an error may name in `re`: 1-64 characters. An empty one named no request a client can
    /// be waiting on (the fuzzer found errors echoing `re: ""`).
    static func validRequestID(_ id: String) -> String? {
        id.isEmpty || id.count > maxRequestIDLength ? nil : id
    }

    /// Turns a `JSONDecoder` error on `data` into a `ProtocolError` that says what is wrong.
    public static func describe(_ error: any Error, in data: Data) -> ProtocolError {
        let probe = try? JSONDecoder().decode(Probe.self, from: data)
        let id = probe?.id.flatMap(validRequestID)
        let type = probe?.type
        if let unknown = error as? UnknownMessageType {
            return ProtocolError(kind: .unknownType, requestID: id, type: unknown.type,
                                 message: "unknown message type '\(unknown.type.prefix(64))'")
        }
        guard let decodingError = error as? DecodingError else {
            return ProtocolError(kind: .invalidJSON, message: "the frame is not valid JSON")
        }
        switch decodingError {
        case .dataCorrupted(let context) where context.codingPath.isEmpty:
            return ProtocolError(kind: .invalidJSON, message: "the frame is not valid JSON")
        case .typeMismatch(_, let context) where context.codingPath.isEmpty:
            return ProtocolError(kind: .notAnObject, message: "a frame must be a JSON object")
        case .keyNotFound(let key, let context) where context.codingPath.isEmpty && key.stringValue == "type":
            return ProtocolError(kind: .missingType, requestID: id, message: "the frame has no 'type'")
        case .typeMismatch(_, let context) where context.codingPath.map(\.stringValue) == ["type"]:
            return ProtocolError(kind: .missingType, requestID: id, message: "'type' must be a string")
        case .keyNotFound(let key, let context):
            let path = (context.codingPath.map(\.stringValue) + [key.stringValue]).joined(separator: ".")
            return ProtocolError(kind: .invalidField, requestID: id, type: type, message: "missing field '\(path)'")
        case .typeMismatch(_, let context), .valueNotFound(_, let context):
            let path = context.codingPath.map(\.stringValue).joined(separator: ".")
            return ProtocolError(kind: .invalidField, requestID: id, type: type, message: "field '\(path)' has the wrong type")
        case .dataCorrupted(let context):
            let path = context.codingPath.map(\.stringValue).joined(separator: ".")
            return ProtocolError(kind: .invalidField, requestID: id, type: type,
                                 message: "field '\(path)' is invalid: \(context.debugDescription)")
        @unknown default:
            return ProtocolError(kind: .invalidField, requestID: id, type: type, message: "the frame could not be read")
        }
    }

    static func validate(_ message: ClientMessage) throws(ProtocolError) {
        func invalid(_ text: String) -> ProtocolError {
            ProtocolError(kind: .invalidField, requestID: message.requestID.flatMap(validRequestID),
                          type: message.type, message: text)
        }
        if let id = message.requestID, id.isEmpty || id.count > maxRequestIDLength {
            throw invalid("'id' must be 1-\(maxRequestIDLength) characters")
        }
        switch message {
        case .hello(let hello):
            if let resume = hello.resume, resume.lastSeq < 0 { throw invalid("'resume.lastSeq' must be 0 or more") }
        case .ack(let ack):
            if ack.seq < 0 { throw invalid("'seq' must be 0 or more") }
        case .callDecline(let decline):
            if let reason = decline.reason, reason != .declined, reason != .busy {
                throw invalid("'reason' must be 'declined' or 'busy'")
            }
        case .callHangup(let hangup):
            if let reason = hangup.reason, reason.count > maxReasonLength {
                throw invalid("'reason' must be at most \(maxReasonLength) characters")
            }
        case .callSignal(let signal):
            if signal.signal.isEmpty { throw invalid("a signal needs 'description', 'candidate' or 'restartIce'") }
        case .roomSignal(let signal):
            // Asking for an ICE restart is a call's business; a room signal still needs SDP or a candidate.
            if signal.signal.description == nil, signal.signal.candidate == nil { throw invalid("a signal needs 'description' or 'candidate'") }
        case .roomJoin(let join):
            if let display = join.display, display.count > maxDisplayLength {
                throw invalid("'display' must be at most \(maxDisplayLength) characters")
            }
            if let participant = join.participant, !(1..<(1 << 53)).contains(participant) {
                throw invalid("'participant' must be a Janus participant id, 1 to 2^53 - 1")
            }
        default:
            break
        }
    }
}

extension WireCodec {
    /// The `id` of a frame, read leniently (for refusing a frame without decoding all of it).
    public func requestID(in text: String) -> String? {
        struct IDOnly: Decodable {
            var id: String?
            enum CodingKeys: String, CodingKey { case id }
            init(from decoder: any Decoder) throws {
                id = try? decoder.container(keyedBy: CodingKeys.self).decodeIfPresent(String.self, forKey: .id)
            }
        }
        return (try? JSONDecoder().decode(IDOnly.self, from: Data(text.utf8)))?.id.flatMap(Self.validRequestID)
    }
}
