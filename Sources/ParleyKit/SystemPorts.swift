import Foundation
import ParleyProtocol

/// Identifies one action the system asked for, so it can be fulfilled or failed.
public struct ProviderActionID: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UUID
    public init(_ rawValue: UUID = UUID()) { self.rawValue = rawValue }
    public var description: String { rawValue.uuidString }
}

/// What the system (CallKit on iOS; a headless provider on Linux) asks of the app. Each action with
/// an id must be fulfilled or failed, as CallKit's `CXAction`s must.
public enum ProviderAction: Hashable, Sendable {
    /// The user started a call from the system UI (or the app asked the system to).
    case start(ProviderActionID, call: UUID, to: UserID, video: Bool)
    case answer(ProviderActionID, call: UUID)
    case end(ProviderActionID, call: UUID)
    case setHeld(ProviderActionID, call: UUID, held: Bool)
    case setMuted(ProviderActionID, call: UUID, muted: Bool)
    case playDTMF(ProviderActionID, call: UUID, digits: String)
    /// The system activated the audio session: audio may start (`provider(_:didActivate:)`).
    case audioSessionActivated
    /// The system deactivated it: audio must stop.
    case audioSessionDeactivated
    /// The system stopped waiting for an action the app had not fulfilled or failed
    /// (`provider(_:timedOutPerforming:)`); a start or answer that timed out ends its call.
    case timedOut(ProviderActionID)
    /// The provider was reset: every call is over.
    case reset
}

/// Why the app tells the system a call ended (CallKit's `CXCallEndedReason`).
public enum SystemEndReason: String, Hashable, Sendable {
    case failed
    case remoteEnded
    case unanswered
    case answeredElsewhere
    case declinedElsewhere
}

/// A call as shown to the system on an incoming report.
public struct IncomingCallReport: Hashable, Sendable {
    public var call: UUID
    public var caller: UserID
    public var callerName: String?
    public var video: Bool
    /// Where the call comes from, on a LAN without a server (the listener's own hub saw it): show
    /// it beside the name, which the caller chose.
    public var callerAddress: String?

    public init(call: UUID, caller: UserID, callerName: String?, video: Bool, callerAddress: String? = nil) {
        self.call = call
        self.caller = caller
        self.callerName = callerName
        self.callerAddress = callerAddress
        self.video = video
    }
}

/// The system's call UI and arbiter: CallKit's `CXProvider` semantics.
public protocol SystemCallProvider: Sendable {
    /// What the system asks of the app, in order.
    var actions: AsyncStream<ProviderAction> { get }
    /// Shows an incoming call; throws when the system refuses it (Do Not Disturb, a blocked caller…).
    func reportIncomingCall(_ report: IncomingCallReport) async throws
    /// An outgoing call started connecting (the invite reached the server).
    func reportOutgoingCallStartedConnecting(_ call: UUID) async
    /// An outgoing call connected (media flows).
    func reportOutgoingCallConnected(_ call: UUID) async
    /// A call ended other than by the user's own end action.
    func reportCallEnded(_ call: UUID, reason: SystemEndReason) async
    func fulfill(_ action: ProviderActionID) async
    func fail(_ action: ProviderActionID) async
}

/// How a call wants the audio session set up, in its start or answer action.
public struct CallAudioConfiguration: Hashable, Sendable {
    /// `playAndRecord` with mode `voiceChat` (audio) or `videoChat` (video), Bluetooth HFP and A2DP allowed.
    public var video: Bool
    public init(video: Bool) { self.video = video }
}

/// The audio session: AVAudioSession (with `RTCAudioSession.useManualAudio`) on iOS; devices or
/// files on Linux. The SDK configures it only in start and answer actions and never activates it
/// itself during a system call: it enables audio when the system says the session is active.
public protocol AudioSession: Sendable {
    func configure(_ configuration: CallAudioConfiguration) async
    /// Starts or stops audio I/O (`RTCAudioSession.isAudioEnabled`).
    func setAudioEnabled(_ enabled: Bool) async
    /// The speaker button: a temporary output override, not the `defaultToSpeaker` option.
    func overrideOutputToSpeaker(_ speaker: Bool) async
    /// Sends call audio to `output` (the preferred input/output of the session).
    func route(to output: AudioOutput) async
}
