/// What can go wrong talking to Janus: the core's errors (45x/46x), a plugin's (AudioBridge: 48x),
/// and the client's own.
public enum JanusError: Error, Hashable, Sendable, CustomStringConvertible {
    /// `{"janus": "error", "error": {"code", "reason"}}` from the Janus core.
    case core(JanusCoreError, reason: String)
    /// `error_code` in the plugin's answer (AudioBridge reports its errors inside a `success` or `event`).
    case audioBridge(AudioBridgeError, reason: String)
    /// The server ended the session (`{"janus": "timeout"}`): keepalives stopped reaching it.
    case sessionTimedOut
    /// The connection closed before the answer came.
    case disconnected
    /// No answer within the request timeout.
    case noAnswer(request: String)
    /// An answer that does not have the shape Janus documents.
    case malformed(String)

    public var description: String {
        switch self {
        case .core(let code, let reason): "Janus error \(code.rawValue): \(reason)"
        case .audioBridge(let code, let reason): "AudioBridge error \(code.rawValue): \(reason)"
        case .sessionTimedOut: "the Janus session timed out"
        case .disconnected: "the connection to Janus closed"
        case .noAnswer(let request): "Janus did not answer '\(request)' in time"
        case .malformed(let text): "unexpected answer from Janus: \(text)"
        }
    }
}

/// The Janus core's error codes (janus/apierror.h).
public struct JanusCoreError: RawRepresentable, Hashable, Sendable {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }

    public static let unauthorized = Self(rawValue: 403)
    public static let unauthorizedPlugin = Self(rawValue: 405)
    public static let transportSpecific = Self(rawValue: 450)
    public static let missingRequest = Self(rawValue: 452)
    public static let unknownRequest = Self(rawValue: 453)
    public static let invalidJSON = Self(rawValue: 454)
    public static let invalidJSONObject = Self(rawValue: 455)
    public static let missingMandatoryElement = Self(rawValue: 456)
    public static let invalidRequestPath = Self(rawValue: 457)
    public static let sessionNotFound = Self(rawValue: 458)
    public static let handleNotFound = Self(rawValue: 459)
    public static let pluginNotFound = Self(rawValue: 460)
    public static let pluginAttach = Self(rawValue: 461)
    public static let pluginMessage = Self(rawValue: 462)
    public static let pluginDetach = Self(rawValue: 463)
    public static let jsepUnknownType = Self(rawValue: 464)
    public static let jsepInvalidSDP = Self(rawValue: 465)
    public static let trickleInvalidStream = Self(rawValue: 466)
    public static let invalidElementType = Self(rawValue: 467)
    public static let sessionConflict = Self(rawValue: 468)
    public static let unexpectedAnswer = Self(rawValue: 469)
    public static let tokenNotFound = Self(rawValue: 470)
    public static let webRTCState = Self(rawValue: 471)
    public static let notAcceptingSessions = Self(rawValue: 472)
    public static let unknown = Self(rawValue: 490)
}

/// The AudioBridge plugin's error codes (plugins/janus_audiobridge.c).
public struct AudioBridgeError: RawRepresentable, Hashable, Sendable {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }

    public static let noMessage = Self(rawValue: 480)
    public static let invalidJSON = Self(rawValue: 481)
    public static let invalidRequest = Self(rawValue: 482)
    public static let missingElement = Self(rawValue: 483)
    public static let invalidElement = Self(rawValue: 484)
    public static let noSuchRoom = Self(rawValue: 485)
    public static let roomExists = Self(rawValue: 486)
    public static let notJoined = Self(rawValue: 487)
    public static let libopusError = Self(rawValue: 488)
    public static let unauthorized = Self(rawValue: 489)
    public static let idExists = Self(rawValue: 490)
    public static let alreadyJoined = Self(rawValue: 491)
    public static let noSuchUser = Self(rawValue: 492)
    public static let invalidSDP = Self(rawValue: 493)
    public static let noSuchGroup = Self(rawValue: 494)
    public static let unknown = Self(rawValue: 499)
}
