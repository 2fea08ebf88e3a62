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

/// What a peer connection reports.
public enum PeerConnectionEvent: Hashable, Sendable {
    /// Negotiation may be needed; check `shouldNegotiate(id)` when handling it, since a round that
    /// completed in between may have made it stale (libwebrtc's `ShouldFireNegotiationNeededEvent`).
    case negotiationNeeded(id: UInt64)
    /// A local ICE candidate to send; nil when gathering is complete.
    case localCandidate(IceCandidate?)
    case iceConnectionState(IceConnectionState)
    /// The first remote audio was decoded.
    case remoteAudioStarted
}

public struct PeerConnectionConfiguration: Hashable, Sendable {
    public var iceServers: [IceServer]
    /// Only TURN relays (`iceTransportPolicy = relay`).
    public var relayOnly: Bool
    public var media: MediaSpec

    public init(iceServers: [IceServer], relayOnly: Bool = false, media: MediaSpec = .audioOnly) {
        self.iceServers = iceServers
        self.relayOnly = relayOnly
        self.media = media
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
    /// Stops or resumes sending the microphone (mute), whether or not the call is held.
    func setMicrophoneMuted(_ muted: Bool) async
    /// Stops or resumes sending and playing media (hold). Resuming sends the microphone again only
    /// if it is not muted (`MicrophoneSwitches`).
    func setOnHold(_ held: Bool) async
    func setAudioEncoding(_ setting: BitrateController.Setting) async
    /// Sends DTMF tones (RFC 4733 telephone-events) on the audio stream: 0-9, *, #, A-D, and ',' for a pause.
    func sendDTMF(_ tones: String) async throws
    func statistics() async throws -> MediaStatsSample
    func close() async
}

public protocol PeerConnectionFactory: Sendable {
    func makePeerConnection(_ configuration: PeerConnectionConfiguration) async throws -> any PeerConnection
}
