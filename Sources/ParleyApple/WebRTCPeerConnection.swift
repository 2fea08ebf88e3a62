// iOS, and Linux against the stand-ins (Package.swift); on macOS the module is empty.
#if os(iOS) || os(Linux)
import AVFoundation
import Foundation
import Logging
import ParleyKit
import ParleyProtocol
import WebRTC

/// The SDK's `PeerConnectionFactory` over Google's WebRTC framework: one audio track per call, the
/// configuration the core asks for (TURN servers, relay only), Unified Plan, continual gathering
/// (so an ICE restart after a network change finds the new addresses).
public final class WebRTCPeerConnectionFactory: PeerConnectionFactory, @unchecked Sendable {
    public let factory: RTCPeerConnectionFactory
    /// Every peer connection made, as it is made: the app takes a video call's tracks from it.
    /// A video call's comes once its camera started or failed to (``WebRTCPeerConnection/cameraFailure``).
    public let peerConnections: AsyncStream<WebRTCPeerConnection>
    private let sink: AsyncStream<WebRTCPeerConnection>.Continuation
    private let logger: Logger

    /// - Parameter factory: WebRTC with every codec it bundles (H.264, VP8, VP9) unless given:
    ///   `RTCPeerConnectionFactory()` alone has H.264 only, which Parley's Linux engine (VP8) and
    ///   many browsers' default video would not meet.
    public init(factory: RTCPeerConnectionFactory = RTCPeerConnectionFactory(encoderFactory: RTCDefaultVideoEncoderFactory(),
                                                                             decoderFactory: RTCDefaultVideoDecoderFactory()),
                logger: Logger = Logger(label: "parley.webrtc")) {
        self.factory = factory
        self.logger = logger
        (peerConnections, sink) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(4))
    }

    /// An audio call's connection can hold its media: its sender's encoding inactive (no RTP) and the
    /// far side's audio disabled until `startMedia()`. (The microphone itself opens only when the
    /// audio session is activated: CallKit's `didActivate`, after the answer.)
    public var canHoldMedia: Bool { true }

    public func makePeerConnection(_ configuration: PeerConnectionConfiguration) async throws -> any PeerConnection {
        let connection = WebRTCPeerConnection(video: configuration.media.video, holdsMedia: configuration.holdsMedia)
        guard let peer = factory.peerConnection(with: Self.rtcConfiguration(configuration),
                                                constraints: RTCMediaConstraints(mandatoryConstraints: nil, optionalConstraints: nil),
                                                delegate: connection) else {
            throw WebRTCError("WebRTC could not create a peer connection for this configuration")
        }
        let track = factory.audioTrack(with: factory.audioSource(with: nil), trackId: "parley-audio")
        if let sender = peer.add(track, streamIds: ["parley"]), configuration.holdsMedia {
            sender.parameters = WebRTCPeerConnection.sending(false, sender.parameters)
        }
        var camera: Camera?
        if configuration.media.video {
            let source = factory.videoSource()
            let video = factory.videoTrack(with: source, trackId: "parley-video")
            _ = peer.add(video, streamIds: ["parley"])
            camera = Camera(track: video, capturer: RTCCameraVideoCapturer(delegate: source))
        }
        connection.attach(peer, microphone: track, camera: camera)
        guard let camera else {
            sink.yield(connection)
            return connection
        }
        camera.start { [sink, logger] failure in
            if let failure {
                logger.warning("the camera did not start", metadata: ["error": "\(failure)"])
                connection.cameraFailed(failure)
            }
            sink.yield(connection)
        }
        return connection
    }

    static func rtcConfiguration(_ configuration: PeerConnectionConfiguration) -> RTCConfiguration {
        let rtc = RTCConfiguration()
        rtc.iceServers = configuration.iceServers.map { RTCIceServer(urlStrings: $0.urls, username: $0.username, credential: $0.credential) }
        rtc.iceTransportPolicy = configuration.relayOnly ? .relay : .all
        rtc.sdpSemantics = .unifiedPlan
        rtc.bundlePolicy = .maxBundle
        rtc.rtcpMuxPolicy = .require
        rtc.continualGatheringPolicy = .gatherContinually
        return rtc
    }
}

/// The front camera feeding a call's video track.
struct Camera: @unchecked Sendable {
    let track: RTCVideoTrack
    let capturer: RTCCameraVideoCapturer

    /// Starts capturing if the app may, and tells `done` why not (nil: it captures). Without camera
    /// access the capturer would start, capture nothing and say nothing, so it is not started. On the
    /// lock screen (a call answered there) iOS holds the session until the app is in the
    /// foreground, and the capturer resumes it then (RTCCameraVideoCapturer, on `didBecomeActive`).
    func start(_ done: @escaping @Sendable (WebRTCError?) -> Void) {
        let access = AVCaptureDevice.authorizationStatus(for: .video)
        guard access == .authorized else {
            let why: [AVAuthorizationStatus: String] = [.notDetermined: "not granted yet (the app has not asked for it)",
                                                        .restricted: "restricted on this device", .denied: "turned off for this app"]
            return done(WebRTCError("camera access is \(why[access] ?? "not granted"): the call goes on without the camera"))
        }
        let devices = RTCCameraVideoCapturer.captureDevices()
        guard let device = devices.first(where: { $0.position == .front }) ?? devices.first else {
            return done(WebRTCError("this device has no camera"))
        }
        guard let (format, fps) = Self.format(RTCCameraVideoCapturer.supportedFormats(for: device)) else {
            return done(WebRTCError("the camera offers no format to capture in"))
        }
        capturer.startCapture(with: device, format: format, fps: fps) { error in
            done(error.map { WebRTCError("the camera did not start: \($0.localizedDescription)") })
        }
    }

    func stop() { capturer.stopCapture(completionHandler: nil) }

    /// The format for a call: the smallest at least 640×480 that does 30 frames a second (a call's
    /// encoder rarely sends more, and bigger formats cost the phone's battery), else the largest there is.
    static func format(_ formats: [AVCaptureDevice.Format], fps wanted: Int = 30) -> (AVCaptureDevice.Format, Int)? {
        func size(_ format: AVCaptureDevice.Format) -> Int32 {
            let dimensions = CMVideoFormatDescriptionGetDimensions(format.formatDescription)
            return dimensions.width * dimensions.height
        }
        func rate(_ format: AVCaptureDevice.Format) -> Int {
            Int(format.videoSupportedFrameRateRanges.map(\.maxFrameRate).max() ?? 0)
        }
        let fits = formats.filter {
            let dimensions = CMVideoFormatDescriptionGetDimensions($0.formatDescription)
            return dimensions.width >= 640 && dimensions.height >= 480 && rate($0) >= wanted
        }
        guard let chosen = fits.min(by: { size($0) < size($1) }) ?? formats.max(by: { size($0) < size($1) }) else { return nil }
        return (chosen, min(wanted, rate(chosen)))
    }
}

public struct WebRTCError: Error, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// One call's `RTCPeerConnection` behind the SDK's `PeerConnection` port.
public final class WebRTCPeerConnection: NSObject, PeerConnection, RTCPeerConnectionDelegate, @unchecked Sendable {
    public let events: AsyncStream<PeerConnectionEvent>
    private let sink: AsyncStream<PeerConnectionEvent>.Continuation
    private let video: Bool
    private let lock = NSLock()
    private var peer: RTCPeerConnection?
    private var microphone: RTCAudioTrack?
    private var remoteAudio: [RTCAudioTrack] = []
    private var camera: Camera?
    private var cameraProblem: WebRTCError?
    private var remoteVideo: RTCVideoTrack?
    private var switches = MicrophoneSwitches()
    /// Until `startMedia()`: no RTP goes out and the far side's audio does not play.
    private var holding: Bool
    private var negotiation: UInt64 = 0
    private var heardAudio = false
    private let started = ContinuousClock.now

    init(video: Bool, holdsMedia: Bool = false) {
        self.video = video
        holding = holdsMedia
        (events, sink) = AsyncStream.makeStream()
    }

    func attach(_ peer: RTCPeerConnection, microphone: RTCAudioTrack, camera: Camera?) {
        lock.withLock {
            self.peer = peer
            self.microphone = microphone
            self.camera = camera
        }
    }

    /// A video call's own camera track: show it with `RTCMTLVideoView` (`track.add(view)`).
    public var localVideoTrack: RTCVideoTrack? { lock.withLock { camera?.track } }
    /// The camera's capturer (for tests).
    var cameraCapturer: RTCCameraVideoCapturer? { lock.withLock { camera?.capturer } }
    /// Why a video call's camera is not capturing (no camera access, no camera, the capturer's
    /// error), in a sentence for the user; nil while it captures, and for an audio call. Settled by
    /// the time the connection comes on ``WebRTCPeerConnectionFactory/peerConnections``.
    public var cameraFailure: WebRTCError? { lock.withLock { cameraProblem } }
    /// The other side's video while it sends it.
    public var remoteVideoTrack: RTCVideoTrack? { lock.withLock { remoteVideo } }

    func cameraFailed(_ failure: WebRTCError) {
        lock.withLock { cameraProblem = failure }
    }

    private var connection: RTCPeerConnection {
        get throws {
            guard let peer = lock.withLock({ peer }) else { throw WebRTCError("the peer connection is closed") }
            return peer
        }
    }

    // MARK: Negotiation

    public func signalingState() async -> PeerSignalingState {
        guard let peer = lock.withLock({ peer }) else { return .closed }
        return Self.state(peer.signalingState)
    }

    public func shouldNegotiate(_ id: UInt64) async -> Bool {
        guard let peer = lock.withLock({ peer }) else { return false }
        // libwebrtc fires `peerConnectionShouldNegotiate` only when negotiation is needed; a later one
        // supersedes it, and one that comes mid-round waits for `stable`.
        return lock.withLock { id == negotiation } && peer.signalingState == .stable
    }

    public func createOffer(iceRestart: Bool) async throws -> SessionDescription {
        var mandatory = [kRTCMediaConstraintsOfferToReceiveAudio: kRTCMediaConstraintsValueTrue,
                         kRTCMediaConstraintsOfferToReceiveVideo: video ? kRTCMediaConstraintsValueTrue : kRTCMediaConstraintsValueFalse]
        if iceRestart { mandatory[kRTCMediaConstraintsIceRestart] = kRTCMediaConstraintsValueTrue }
        let constraints = RTCMediaConstraints(mandatoryConstraints: mandatory, optionalConstraints: nil)
        let peer = try connection
        return try await withCheckedThrowingContinuation { continuation in
            peer.offer(for: constraints) { description, error in continuation.resume(with: Self.result(description, error)) }
        }
    }

    public func createAnswer() async throws -> SessionDescription {
        let constraints = RTCMediaConstraints(mandatoryConstraints: nil, optionalConstraints: nil)
        let peer = try connection
        return try await withCheckedThrowingContinuation { continuation in
            peer.answer(for: constraints) { description, error in continuation.resume(with: Self.result(description, error)) }
        }
    }

    public func setLocalDescription(_ description: SessionDescription) async throws {
        let peer = try connection
        let rtc = RTCSessionDescription(type: RTCSessionDescription.type(for: description.type), sdp: description.sdp)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            peer.setLocalDescription(rtc) { error in continuation.resume(with: error.map { .failure($0) } ?? .success(())) }
        }
    }

    public func setRemoteDescription(_ description: SessionDescription) async throws {
        let peer = try connection
        let rtc = RTCSessionDescription(type: RTCSessionDescription.type(for: description.type), sdp: description.sdp)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            peer.setRemoteDescription(rtc) { error in continuation.resume(with: error.map { .failure($0) } ?? .success(())) }
        }
    }

    public func rollback() async throws {
        try await setLocalDescription(SessionDescription(type: "rollback", sdp: ""))
    }

    public func addRemoteCandidate(_ candidate: IceCandidate?) async throws {
        // The Objective-C API has no end-of-candidates; libwebrtc does without it.
        guard let candidate else { return }
        let peer = try connection
        let rtc = RTCIceCandidate(sdp: candidate.candidate, sdpMLineIndex: Int32(candidate.sdpMLineIndex ?? 0), sdpMid: candidate.sdpMid)
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            peer.add(rtc) { error in continuation.resume(with: error.map { .failure($0) } ?? .success(())) }
        }
    }

    private static func result(_ description: RTCSessionDescription?, _ error: (any Error)?) -> Result<SessionDescription, any Error> {
        guard let description else { return .failure(error ?? WebRTCError("WebRTC made no description")) }
        return .success(SessionDescription(type: RTCSessionDescription.string(for: description.type), sdp: description.sdp))
    }

    /// (Lookups rather than switches: the imported Objective-C enums are open on Apple platforms,
    /// closed in the Linux stand-in, and a switch cannot be warning-free on both.)
    static func state(_ state: RTCSignalingState) -> PeerSignalingState {
        let states: [RTCSignalingState: PeerSignalingState] = [
            .stable: .stable, .haveLocalOffer: .haveLocalOffer, .haveLocalPrAnswer: .haveLocalOffer,
            .haveRemoteOffer: .haveRemoteOffer, .haveRemotePrAnswer: .haveRemoteOffer, .closed: .closed,
        ]
        return states[state] ?? .closed
    }

    // MARK: Media

    public func startMedia() async {
        let wasHolding = lock.withLock {
            defer { holding = false }
            return holding
        }
        guard wasHolding else { return }
        if let sender = lock.withLock({ peer })?.senders.first(where: { $0.track?.kind == "audio" }) {
            sender.parameters = Self.sending(true, sender.parameters)
        }
        applySwitches()
    }

    /// The sender's parameters with every encoding active (or none: no RTP at all).
    static func sending(_ active: Bool, _ parameters: RTCRtpParameters) -> RTCRtpParameters {
        for encoding in parameters.encodings { encoding.isActive = active }
        return parameters
    }

    public func setMicrophoneMuted(_ muted: Bool) async {
        lock.withLock { switches.muted = muted }
        applySwitches()
    }

    public func setOnHold(_ held: Bool) async {
        lock.withLock { switches.held = held }
        applySwitches()
    }

    /// The microphone sends only when neither muted nor held; the far side plays only when not held.
    private func applySwitches() {
        let (switches, holding, microphone, remote, camera) = lock.withLock { (self.switches, self.holding, self.microphone, remoteAudio, self.camera) }
        microphone?.isEnabled = switches.sends
        camera?.track.isEnabled = !switches.held
        for track in remote { track.isEnabled = !switches.held && !holding }
    }

    public func setAudioEncoding(_ setting: BitrateController.Setting) async {
        guard let sender = lock.withLock({ peer })?.senders.first(where: { $0.track?.kind == "audio" }) else { return }
        sender.parameters = Self.sending(!lock.withLock { holding }, Self.parameters(sender.parameters, for: setting))
    }

    /// The sender's parameters with the bitrate's cap. (Opus's in-band FEC and loss hint are set in
    /// the SDP by libwebrtc, `useinbandfec=1`, and adapt by themselves: the ObjC API exposes neither.)
    static func parameters(_ parameters: RTCRtpParameters, for setting: BitrateController.Setting) -> RTCRtpParameters {
        for encoding in parameters.encodings {
            encoding.maxBitrateBps = NSNumber(value: Int((setting.bitrateKbps * 1000).rounded()))
            encoding.isActive = true
        }
        return parameters
    }

    public var canSendDTMF: Bool { dtmfSender?.canInsertDtmf ?? false }

    private var dtmfSender: (any RTCDtmfSender)? {
        lock.withLock({ peer })?.senders.first(where: { $0.track?.kind == "audio" })?.dtmfSender
    }

    public func sendDTMF(_ tones: String) async throws {
        guard let dtmf = dtmfSender, dtmf.canInsertDtmf else {
            throw WebRTCError("this call cannot send DTMF")
        }
        // RFC 4733 tones of 100 ms with 70 ms between them, as browsers send them.
        guard dtmf.insertDtmf(tones, duration: 0.1, interToneGap: 0.07) else { throw WebRTCError("WebRTC refused the tones \(tones)") }
    }

    public func statistics() async throws -> MediaStatsSample {
        let peer = try connection
        let at = ContinuousClock.now - started
        // The report is not Sendable: it is read where libwebrtc hands it over.
        let sample = await withCheckedContinuation { continuation in
            peer.statistics { report in continuation.resume(returning: Self.sample(report, at: at)) }
        }
        let first = lock.withLock { () -> Bool in
            guard !heardAudio, sample.packetsReceived > 0 else { return false }
            heardAudio = true
            return true
        }
        if first { sink.yield(.remoteAudioStarted) }
        return sample
    }

    /// The core's sample from libwebrtc's statistics (W3C webrtc-stats): the audio `inbound-rtp`
    /// (packets, loss, jitter, bytes, level), `outbound-rtp` (bytes sent), and the round trip from
    /// `remote-inbound-rtp`, or the nominated candidate pair when RTCP has not reported one yet.
    static func sample(_ report: RTCStatisticsReport, at: Duration) -> MediaStatsSample {
        var sample = MediaStatsSample(at: at)
        func number(_ stats: RTCStatistics, _ key: String) -> Double? { (stats.values[key] as? NSNumber)?.doubleValue }
        func kind(_ stats: RTCStatistics) -> String? { (stats.values["kind"] as? NSString).map { $0 as String } }
        var pairRoundTrip: Double?
        for stats in report.statistics.values {
            switch stats.type {
            case "inbound-rtp" where kind(stats) == "audio":
                sample.packetsReceived += Int(number(stats, "packetsReceived") ?? 0)
                sample.packetsLost += Int(number(stats, "packetsLost") ?? 0)
                sample.bytesReceived += Int(number(stats, "bytesReceived") ?? 0)
                if let jitter = number(stats, "jitter") { sample.jitterMs = jitter * 1000 }
                if let level = number(stats, "audioLevel") { sample.audioLevel = level }
            case "outbound-rtp" where kind(stats) == "audio":
                sample.bytesSent += Int(number(stats, "bytesSent") ?? 0)
            case "remote-inbound-rtp" where kind(stats) == "audio":
                if let rtt = number(stats, "roundTripTime") { sample.roundTripTimeMs = rtt * 1000 }
            case "candidate-pair" where (stats.values["nominated"] as? NSNumber)?.boolValue == true:
                if let rtt = number(stats, "currentRoundTripTime") { pairRoundTrip = rtt * 1000 }
            default:
                break
            }
        }
        if sample.roundTripTimeMs == nil { sample.roundTripTimeMs = pairRoundTrip }
        return sample
    }

    public func close() async {
        let peer = lock.withLock { () -> RTCPeerConnection? in
            defer { self.peer = nil }
            return self.peer
        }
        lock.withLock { camera }?.stop()
        peer?.close()
        sink.finish()
    }

    // MARK: RTCPeerConnectionDelegate

    public func peerConnection(_ peerConnection: RTCPeerConnection, didChange stateChanged: RTCSignalingState) {}

    // Under Unified Plan a stream is only a label a peer may put on its tracks (`a=msid`), or not:
    // the tracks come from the transceivers below.
    public func peerConnection(_ peerConnection: RTCPeerConnection, didAdd stream: RTCMediaStream) {}
    public func peerConnection(_ peerConnection: RTCPeerConnection, didRemove stream: RTCMediaStream) {}

    /// A far-side track, in a stream or not (W3C's `track` event). Tracks compare by id: the
    /// framework hands out a new wrapper of the same track on every read.
    public func peerConnection(_ peerConnection: RTCPeerConnection, didStartReceivingOn transceiver: RTCRtpTransceiver) {
        guard let track = transceiver.receiver.track else { return }
        let held = lock.withLock { () -> Bool in
            if let audio = track as? RTCAudioTrack, !remoteAudio.contains(where: { $0.trackId == audio.trackId }) {
                remoteAudio.append(audio)
            } else if let video = track as? RTCVideoTrack {
                remoteVideo = video
            }
            return switches.held || holding
        }
        if track is RTCAudioTrack { track.isEnabled = !held }
    }

    /// The far side stopped sending on a track (its direction became `recvonly` or `inactive`).
    public func peerConnection(_ peerConnection: RTCPeerConnection, didRemove rtpReceiver: RTCRtpReceiver) {
        guard let gone = rtpReceiver.track?.trackId else { return }
        lock.withLock {
            remoteAudio.removeAll { $0.trackId == gone }
            if remoteVideo?.trackId == gone { remoteVideo = nil }
        }
    }

    public func peerConnectionShouldNegotiate(_ peerConnection: RTCPeerConnection) {
        let id = lock.withLock { () -> UInt64 in
            negotiation += 1
            return negotiation
        }
        sink.yield(.negotiationNeeded(id: id))
    }

    public func peerConnection(_ peerConnection: RTCPeerConnection, didChange newState: RTCIceConnectionState) {
        if let state = Self.iceState(newState) { sink.yield(.iceConnectionState(state)) }
    }

    public func peerConnection(_ peerConnection: RTCPeerConnection, didChange newState: RTCPeerConnectionState) {
        if let state = Self.connectionState(newState) { sink.yield(.connectionState(state)) }
    }

    public func peerConnection(_ peerConnection: RTCPeerConnection, didChange newState: RTCIceGatheringState) {
        if newState == .complete { sink.yield(.localCandidate(nil)) }
    }

    public func peerConnection(_ peerConnection: RTCPeerConnection, didGenerate candidate: RTCIceCandidate) {
        sink.yield(.localCandidate(IceCandidate(candidate: candidate.sdp, sdpMid: candidate.sdpMid, sdpMLineIndex: Int(candidate.sdpMLineIndex))))
    }

    public func peerConnection(_ peerConnection: RTCPeerConnection, didRemove candidates: [RTCIceCandidate]) {}
    public func peerConnection(_ peerConnection: RTCPeerConnection, didOpen dataChannel: RTCDataChannel) {}

    static func connectionState(_ state: RTCPeerConnectionState) -> PeerConnectionState? {
        let states: [RTCPeerConnectionState: PeerConnectionState] = [
            .new: .new, .connecting: .connecting, .connected: .connected, .disconnected: .disconnected,
            .failed: .failed, .closed: .closed,
        ]
        return states[state]
    }

    static func iceState(_ state: RTCIceConnectionState) -> IceConnectionState? {
        let states: [RTCIceConnectionState: IceConnectionState] = [
            .new: .new, .checking: .checking, .connected: .connected, .completed: .completed,
            .failed: .failed, .disconnected: .disconnected, .closed: .closed,
        ]
        return states[state]
    }
}
#endif
