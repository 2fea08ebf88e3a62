import ParleyProtocol

/// The signaling state of a peer connection (W3C `RTCSignalingState`).
public enum PeerSignalingState: String, Hashable, Sendable {
    case stable
    case haveLocalOffer = "have-local-offer"
    case haveRemoteOffer = "have-remote-offer"
    case closed
}

/// ICE connectivity (W3C `RTCIceConnectionState`).
public enum IceConnectionState: String, Hashable, Sendable {
    case new, checking, connected, completed, failed, disconnected, closed
}

/// The connection as a whole, ICE and DTLS together (W3C `RTCPeerConnectionState`): `connected` once
/// a connected ICE pair carries a finished DTLS handshake, so SRTP keys exist and media can flow;
/// `failed` when either failed.
public enum PeerConnectionState: String, Hashable, Sendable {
    case new, connecting, connected, disconnected, failed, closed
}

/// What a peer connection reports.
public enum PeerConnectionEvent: Hashable, Sendable {
    /// Negotiation may be needed; check `shouldNegotiate(id)` when handling it, since a round that
    /// completed in between may have made it stale (libwebrtc's `ShouldFireNegotiationNeededEvent`).
    case negotiationNeeded(id: UInt64)
    /// A local ICE candidate to send; nil when gathering is complete.
    case localCandidate(IceCandidate?)
    case iceConnectionState(IceConnectionState)
    /// ICE and DTLS together: a call is connected on `.connected`, not on ICE alone.
    case connectionState(PeerConnectionState)
    /// The first remote audio was decoded.
    case remoteAudioStarted
}

public struct PeerConnectionConfiguration: Hashable, Sendable {
    public var iceServers: [IceServer]
    /// Only TURN relays (`iceTransportPolicy = relay`).
    public var relayOnly: Bool
    public var media: MediaSpec
    /// Connect while ringing: the connection negotiates, and ICE and DTLS connect, but nothing is
    /// captured, sent or played until `startMedia()` (the microphone is not even opened).
    public var holdsMedia: Bool
    /// The call it is for (an app or an engine may tell a call's connections apart by it).
    public var call: CallID?

    public init(iceServers: [IceServer], relayOnly: Bool = false, media: MediaSpec = .audioOnly, holdsMedia: Bool = false,
                call: CallID? = nil) {
        self.iceServers = iceServers
        self.relayOnly = relayOnly
        self.media = media
        self.holdsMedia = holdsMedia
        self.call = call
    }
}

/// The microphone's two independent switches: the user's mute and the call's hold. It sends only
/// when neither is on, so resuming a held call leaves a muted microphone muted.
public struct MicrophoneSwitches: Hashable, Sendable {
    public var muted = false
    public var held = false

    public init(muted: Bool = false, held: Bool = false) {
        self.muted = muted
        self.held = held
    }

    public var sends: Bool { !muted && !held }
}

/// A WebRTC peer connection: the GStreamer engine on Linux, the WebRTC framework on Apple.
/// Platform types never cross this port.
public protocol PeerConnection: Sendable {
    var events: AsyncStream<PeerConnectionEvent> { get }
    func signalingState() async -> PeerSignalingState
    /// Whether the negotiation-needed event `id` still stands.
    func shouldNegotiate(_ id: UInt64) async -> Bool
    func createOffer(iceRestart: Bool) async throws -> SessionDescription
    func createAnswer() async throws -> SessionDescription
    func setLocalDescription(_ description: SessionDescription) async throws
    func setRemoteDescription(_ description: SessionDescription) async throws
    /// Returns from `have-local-offer` to `stable`, dropping the local offer. webrtcbin cannot, so
    /// `Negotiator` never needs it (see `NegotiationStateMachine`).
    func rollback() async throws
    /// A remote candidate; nil for end of candidates.
    func addRemoteCandidate(_ candidate: IceCandidate?) async throws
    /// Starts what `holdsMedia` held: the microphone, sending and playing. Nothing otherwise.
    func startMedia() async
    /// Stops or resumes sending the microphone (mute), whether or not the call is held.
    func setMicrophoneMuted(_ muted: Bool) async
    /// Stops or resumes sending and playing media (hold). Resuming sends the microphone again only
    /// if it is not muted (`MicrophoneSwitches`).
    func setOnHold(_ held: Bool) async
    func setAudioEncoding(_ setting: BitrateController.Setting) async
    /// Whether this engine can send DTMF on this call now: WebRTC's can once the audio sender
    /// has negotiated telephone-event; the GStreamer engine cannot (it has no RFC 4733 sender).
    var canSendDTMF: Bool { get }
    /// Sends DTMF tones (RFC 4733 telephone-events) on the audio stream: 0-9, *, #, A-D, and ',' for
    /// a pause. Throws where `canSendDTMF` is false.
    func sendDTMF(_ tones: String) async throws
    func statistics() async throws -> MediaStatsSample
    /// Whether this engine can record calls (`startCallRecording`).
    var canRecordCalls: Bool { get }
    /// Starts recording the call, what is sent and what is received, to an Ogg/Opus file at `path`.
    func startCallRecording(to path: String, layout: RecordingLayout) async throws
    /// Stops the recording and closes its file; nil when nothing was being recorded.
    func stopCallRecording() async -> CallRecordingFile?
    func close() async
}

/// How a call recording holds the two directions.
public enum RecordingLayout: String, Hashable, Sendable, CaseIterable {
    /// Both voices in one channel.
    case mixed
    /// This side's voice on the left, the far side's on the right.
    case twoChannels = "two-channels"
}

/// A finished call recording: its file, and where it sits in the call's timeline, in seconds from
/// the moment the call's media connected.
public struct CallRecordingFile: Hashable, Sendable {
    public var path: String
    public var layout: RecordingLayout
    public var startSeconds: Double
    public var endSeconds: Double

    public init(path: String, layout: RecordingLayout, startSeconds: Double, endSeconds: Double) {
        self.path = path
        self.layout = layout
        self.startSeconds = startSeconds
        self.endSeconds = endSeconds
    }
}

/// An engine that cannot record calls (the WebRTC framework gives no access to both directions'
/// audio) says so; the call's recording consent then stops for both sides.
public struct CallRecordingUnsupported: Error, Hashable, Sendable, CustomStringConvertible {
    public init() {}
    public var description: String { "this media engine cannot record calls" }
}

extension PeerConnection {
    public var canRecordCalls: Bool { false }
    public func startCallRecording(to path: String, layout: RecordingLayout) async throws { throw CallRecordingUnsupported() }
    public func stopCallRecording() async -> CallRecordingFile? { nil }
}

public protocol PeerConnectionFactory: Sendable {
    /// Whether this engine's connections keep `holdsMedia`: only then does a call connect while it rings.
    var canHoldMedia: Bool { get }
    func makePeerConnection(_ configuration: PeerConnectionConfiguration) async throws -> any PeerConnection
}
