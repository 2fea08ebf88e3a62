import CParleyGst
import Foundation
import Logging
import ParleyKit
import ParleyProtocol

/// A WebRTC peer connection on GStreamer's webrtcbin: Opus audio (in-band FEC, optional DTX,
/// bitrate changed live), optional VP8 video, data channels, STUN/TURN, DTLS-SRTP.
///
/// webrtcbin calls back on its own threads; each callback is bridged once, at the edge, into
/// `events` or `dataChannels`. `close()` stops the pipeline and frees everything.
public final class GStreamerPeerConnection: PeerConnection, @unchecked Sendable {
    public var events: AsyncStream<PeerConnectionEvent> { bridge.events }
    /// Data channels as they come into being: those this side opened and those the far side opened.
    public var dataChannels: AsyncStream<DataChannel> { bridge.channels }
    /// Where received audio is recorded, if anywhere.
    public let recording: URL?
    /// When ICE first connected, and when the first remote audio was decoded.
    public var iceConnectedAt: ContinuousClock.Instant? { bridge.iceConnectedAt }
    /// When DTLS-SRTP first came up on the connected ICE pair (webrtcbin's connection-state).
    public var connectedAt: ContinuousClock.Instant? { bridge.connectedAt }
    public var remoteAudioStartedAt: ContinuousClock.Instant? { bridge.firstAudioAt }
    /// The local description last applied.
    public var currentLocalSDP: String? { bridge.currentLocalSDP }
    /// The kinds of local ICE candidates gathered ("host", "srflx", "relay").
    public var localCandidateTypes: Set<String> { bridge.localCandidateTypes }
    /// The transports of the local ICE candidates gathered ("udp"; "tcp" only with `iceTCP`).
    public var localCandidateTransports: Set<String> { bridge.localCandidateTransports }
    /// The candidate pair ICE selected, as libnice reports it; nil before ICE connected and once closed.
    public var selectedCandidatePair: SelectedCandidatePair? {
        var localType = [CChar](repeating: 0, count: 16), remoteType = [CChar](repeating: 0, count: 16)
        // NICE_ADDRESS_STRING_LEN is INET6_ADDRSTRLEN (46).
        var address = [CChar](repeating: 0, count: 64), remoteAddress = [CChar](repeating: 0, count: 64)
        var port: Int32 = 0, remotePort: Int32 = 0
        // Under the lock, as every call into the pipeline: teardown frees it once `closed` is set.
        let found = lock.withLock {
            !closed && parley_ice_selected_pair(webrtc, &localType, &remoteType, &address, &port, &remoteAddress, &remotePort) == 0
        }
        guard found else { return nil }
        func text(_ buffer: [CChar]) -> String { String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
        return SelectedCandidatePair(localType: text(localType), remoteType: text(remoteType), localAddress: text(address), localPort: Int(port),
                                     remoteAddress: text(remoteAddress), remotePort: Int(remotePort))
    }

    /// The average colour of the last video frame received.
    public var receivedVideoColor: FrameColor? { bridge.receivedVideoColor }
    /// Decoded video frames received so far.
    public var receivedVideoFrames: Int { bridge.receivedVideoFrames }
    /// How many of them differed from the frame before: a moving picture's grow with its frames, a
    /// frozen one's do not.
    public var receivedVideoChanges: Int { bridge.receivedVideoChanges }
    /// How many ICE restarts this connection went through, started by either side.
    public var iceRestartCount: Int { lock.withLock { restarts } }
    /// The ICE username fragments in force, ours and the far side's: each ICE restart changes both.
    public var iceUfrags: (local: String?, remote: String?) { lock.withLock { (localUfrag, remoteUfrag) } }
    /// The received audio's RMS level (0…1) in the last buffer.
    public var receivedAudioLevel: Double? { bridge.receivedLevel }
    /// How long the receive jitter buffer holds packets now, ms (see `JitterBufferController`).
    public var receiveLatencyMs: Int { lock.withLock { jitterBufferLatencyMs } }
    /// What the encoder was last told (the bitrate controller's setting); nil: its start.
    public var audioEncoding: BitrateController.Setting? { lock.withLock { encoding } }

    private let pipeline: UnsafeMutableRawPointer
    private let webrtc: UnsafeMutableRawPointer
    private let bridge: Bridge
    private let retainedBridge: UnsafeMutableRawPointer
    private let logger: Logger
    private let created = ContinuousClock.now
    private let lock = NSLock()
    private var closed = false
    private var localUfrag: String?
    private var remoteUfrag: String?
    /// The far side restarted ICE: our answer gets fresh credentials too.
    private var answerRestarts = false
    private var localChannels: [DataChannel] = []
    private var restarts = 0
    private let configuration: MediaEngineConfiguration
    /// Whether the call sends and receives video.
    public let video: Bool
    /// The call it was made for, if the SDK said.
    public let call: CallID?
    /// Whether the send chains are linked into webrtcbin yet.
    private var sending = false
    /// Connect while ringing: until `startMedia()`, the send chains' sources stay stopped (the
    /// microphone closed, nothing sent) and the speaker is muted.
    private var holdingMedia: Bool
    /// Send chains linked while media was held, with what `parley_send_from_connection` needs (a reference each).
    private var heldChains: [HeldChain] = []
    private typealias HeldChain = (bin: UnsafeMutableRawPointer, end: String, file: String?)
    private var microphone = MicrophoneSwitches()
    private var encoding: BitrateController.Setting?
    private var jitterBufferLatencyMs: Int
    private let createdAt = ContinuousClock.now
    private let recorderLock = NSLock()
    private var jitterBufferTask: Task<Void, Never>?

    init(configuration: MediaEngineConfiguration, connection: PeerConnectionConfiguration, logger: Logger) throws {
        self.logger = logger
        self.configuration = configuration
        jitterBufferLatencyMs = configuration.jitterBufferMs
        video = connection.media.video
        call = connection.call
        holdingMedia = connection.holdsMedia
        let description = PipelineDescription.base(configuration)
        var error: UnsafeMutablePointer<CChar>?
        guard let pipeline = parley_pipeline_new(description, &error) else {
            throw MediaEngineError(.pipeline, Self.take(error) ?? "the pipeline could not be built")
        }
        guard let webrtc = parley_bin_get(pipeline, "webrtc") else {
            parley_object_unref(pipeline)
            throw MediaEngineError(.pipeline, "no webrtcbin in the pipeline")
        }
        self.pipeline = pipeline
        self.webrtc = webrtc
        if case .file(let url) = configuration.output { recording = url } else { recording = nil }
        bridge = Bridge(pipeline: pipeline, output: configuration.output, recording: recording, mediaHeld: connection.holdsMedia, logger: logger)
        retainedBridge = Unmanaged.passRetained(bridge).toOpaque()
        parley_webrtc_attach(pipeline, webrtc, bridgeEventCallback, retainedBridge)
        if configuration.retransmission { parley_webrtc_enable_retransmission(webrtc) }

        parley_ice_configure(webrtc, UInt32(configuration.icePacingMs), configuration.iceTCP ? 1 : 0)
        for address in configuration.localAddresses where parley_ice_add_local_address(webrtc, address) != 0 {
            teardown()
            throw MediaEngineError(.pipeline, "'\(address)' is not a local address ICE can use")
        }
        configureIce(connection)

        // Data channels in READY, before PLAYING, so the first offer carries the SCTP association.
        if parley_element_set_state_ready(pipeline) != 0 {
            teardown()
            throw MediaEngineError(.pipeline, "the pipeline would not get ready")
        }
        for spec in configuration.dataChannels {
            guard let raw = parley_webrtc_create_data_channel(webrtc, spec.label, spec.ordered ? 1 : 0, Int32(spec.maxRetransmits ?? -1)) else {
                teardown()
                throw MediaEngineError(.pipeline, "data channel '\(spec.label)' could not be created")
            }
            let channel = DataChannel(taking: raw)
            localChannels.append(channel)
            bridge.announce(channel)
        }
        if parley_element_set_state_playing(pipeline) != 0 {
            teardown()
            throw MediaEngineError(.pipeline, "the pipeline would not start (is an audio device missing?)")
        }
        if holdingMedia { bridge.setSpeakerMuted(true) }
        // The send chains wait for the first offer, ours or the far side's, which decides their
        // payload types; meanwhile an offerer needs a negotiation to start with.
        bridge.negotiationNeeded()
        keepUpMedia()
    }

    /// Every quarter second: the RTP sessions' RTCP interval; and, when adaptive,
    /// the jitter buffers' latency from their jitter and late packets.
    private func keepUpMedia() {
        var settings = configuration.adaptiveJitterBuffer
        settings?.minimumMs = configuration.jitterBufferMs
        if let minimum = settings?.minimumMs, let maximum = settings?.maximumMs { settings?.maximumMs = max(maximum, minimum) }
        let rtcpInterval = UInt32(configuration.rtcpIntervalMs)
        let start = ContinuousClock.now
        jitterBufferTask = Task { [weak self] in
            var controller = settings.map { JitterBufferController(configuration: $0) }
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(250))
                guard let self else { return }
                let latency = self.lock.withLock { () -> Int? in
                    guard !self.closed else { return nil }
                    // Every tick, so sessions made later (a renegotiation adding video) get it too.
                    _ = parley_rtp_sessions_set_rtcp_interval(self.webrtc, rtcpInterval)
                    var stats = parley_jitter_stats()
                    guard controller != nil, parley_jitter_buffers_read(self.webrtc, &stats) > 0,
                          let latency = controller?.update(jitterMs: stats.jitter_ms >= 0 ? stats.jitter_ms : nil,
                                                           lateSoFar: stats.late, askedAgainSoFar: stats.retransmissions_asked,
                                                           retransmissionRttMs: stats.retransmission_rtt_ms > 0 ? stats.retransmission_rtt_ms : nil,
                                                           now: ContinuousClock.now - start) else { return nil }
                    parley_jitter_buffers_set_latency(self.webrtc, UInt32(latency))
                    self.jitterBufferLatencyMs = latency
                    return latency
                }
                if let latency {
                    self.logger.debug("jitter buffer latency changed", metadata: ["media.jitter_buffer_ms": "\(latency)"])
                }
            }
        }
    }

    /// Links the audio (and video) send chains into webrtcbin, numbered as `offer` numbers them
    /// (or as browsers do, for our own offer).
    private func startSending(numberedAs offer: String?) throws {
        guard !lock.withLock({ sending }) else { return }
        let opus = offer.flatMap { SDPText.payloadType(of: "opus", in: $0) } ?? configuration.opusOfferPayloadType
        let startEncoding = lock.withLock { encoding }
        var chains = [PipelineDescription.audioSender(configuration, payloadType: opus, muted: !sendsMicrophone,
                                                      encoding: startEncoding)]
        if video {
            let vp8 = offer.flatMap { SDPText.payloadType(of: "VP8", in: $0) } ?? PipelineDescription.vp8PayloadType
            chains.append(PipelineDescription.videoSender(configuration, payloadType: vp8, held: lock.withLock { microphone.held }))
        }
        do {
            for chain in chains {
                var error: UnsafeMutablePointer<CChar>?
                guard let bin = parley_bin_new(chain, &error) else {
                    throw MediaEngineError(.pipeline, Self.take(error) ?? "the send chain could not be built")
                }
                if configuration.audioLevelIndication, chain == chains.first,
                   parley_capsfilter_add_audio_level(bin, PipelineDescription.audioCaps, PipelineDescription.audioLevelExtensionID) != 0 {
                    throw MediaEngineError(.pipeline, "the audio level extension could not be requested")
                }
                if chain == chains.first { bridge.rememberSendChain(bin) }
                // Nothing goes out before the call connects: it would wait in the chain and go out late.
                let file: String? = if chain == chains.first, case .file = configuration.input { PipelineDescription.playedFile } else { nil }
                let end = chain == chains.first ? PipelineDescription.audioCaps : PipelineDescription.videoCaps
                let held = lock.withLock { () -> Bool in
                    guard holdingMedia, !closed else { return false }
                    // Its sources stay stopped until `startMedia()`, which then sends from the connection on.
                    parley_bin_hold_sources(bin, 1)
                    heldChains.append((parley_object_ref(bin), end, file))
                    return true
                }
                guard held || parley_send_from_connection(webrtc, bin, end, file) == 1 else {
                    throw MediaEngineError(.pipeline, "the send chain has no \(end)")
                }
                guard parley_bin_add_and_link_to(pipeline, bin, webrtc) == 0 else {
                    throw MediaEngineError(.pipeline, "the send chain would not start (is the audio file or device missing?)")
                }
            }
        } catch {
            // The call fails with it: the chains held so far are let go, none half started later.
            let held = lock.withLock { () -> [HeldChain] in
                defer { heldChains = [] }
                return heldChains
            }
            for chain in held { parley_object_unref(chain.bin) }
            throw error
        }
        lock.withLock {
            sending = true
            // `startMedia()` came while the chains were being linked: they start now, linked
            // (unless a close came too: the teardown let them go).
            if !holdingMedia, !closed { releaseHeldChains() }
        }
        // The chain started muted if the microphone was; a switch flipped while it was linked counts too.
        updateMicrophone()
        // Likewise an encoder setting that came while it was being linked.
        if let latest = lock.withLock({ encoding }), latest != startEncoding { applyEncoding(latest) }
    }

    deinit { teardown() }

    private func configureIce(_ connection: PeerConnectionConfiguration) {
        var stunSet = false
        for server in connection.iceServers {
            for url in server.urls {
                if let stun = IceURL.stun(url), !stunSet {
                    parley_set_string(webrtc, "stun-server", stun)
                    stunSet = true
                } else if let turn = IceURL.turn(url, username: server.username, credential: server.credential) {
                    if parley_webrtc_add_turn_server(webrtc, turn) == 0 {
                        logger.warning("TURN server refused by webrtcbin", metadata: ["ice.url": "\(url)"])
                    }
                }
            }
        }
        if connection.relayOnly { parley_set_from_string(webrtc, "ice-transport-policy", "relay") }
    }

    // MARK: PeerConnection

    public func signalingState() async -> PeerSignalingState {
        guard !isClosed else { return .closed }
        switch parley_get_enum(webrtc, "signaling-state") {
        case 0: return .stable
        case 2, 4: return .haveLocalOffer
        case 3, 5: return .haveRemoteOffer
        default: return .closed
        }
    }

    public func shouldNegotiate(_ id: UInt64) async -> Bool {
        guard bridge.negotiationStillNeeded(id) else { return false }
        return await signalingState() == .stable
    }

    public func createOffer(iceRestart: Bool) async throws -> SessionDescription {
        try checkOpen()
        try startSending(numberedAs: nil)
        bridge.offerCovers()
        var sdp = Self.withOwnFingerprint(try await awaitSDP { parley_webrtc_create_offer(self.webrtc, $0, $1) })
        if iceRestart {
            let fresh = SDPText.newIceCredentials()
            sdp = SDPText.replacingIceCredentials(in: sdp, ufrag: fresh.ufrag, password: fresh.password)
        }
        return SessionDescription(type: "offer", sdp: sdp)
    }

    public func createAnswer() async throws -> SessionDescription {
        try checkOpen()
        var sdp = Self.withOwnFingerprint(try await awaitSDP { parley_webrtc_create_answer(self.webrtc, $0, $1) })
        if lock.withLock({ answerRestarts }) {
            let fresh = SDPText.newIceCredentials()
            sdp = SDPText.replacingIceCredentials(in: sdp, ufrag: fresh.ufrag, password: fresh.password)
        }
        return SessionDescription(type: "answer", sdp: sdp)
    }

    /// webrtcbin 1.22 hashes the whole PEM it was given, key included, for `a=fingerprint`: the
    /// description gets the certificate's own (parley_dtls_certificate.c), which the far side checks.
    private static func withOwnFingerprint(_ sdp: String) -> String {
        guard let fingerprint = GStreamerEngine.dtlsFingerprint else { return sdp }
        return SDPText.replacingFingerprint(in: sdp, with: fingerprint)
    }

    public func setLocalDescription(_ description: SessionDescription) async throws {
        try checkOpen()
        let ufrag = SDPText.iceUfrag(description.sdp)
        let restarting: Bool = lock.withLock {
            defer { localUfrag = ufrag ?? localUfrag }
            if description.type == "answer" {
                defer { answerRestarts = false }
                return answerRestarts
            }
            return localUfrag != nil && ufrag != nil && ufrag != localUfrag
        }
        // Our offer restarts ICE: libnice starts new checks (keeping the selected pair meanwhile).
        if restarting, description.type == "offer" { restartIce() }
        bridge.rememberLocal(description.sdp)
        try await apply(description, local: true)
        if restarting { bridge.reannounceCandidates() }
    }

    public func setRemoteDescription(_ description: SessionDescription) async throws {
        try checkOpen()
        guard description.sdp.hasPrefix("v=0") else { throw MediaEngineError(.negotiation, "the remote \(description.type) is not an SDP session description") }
        let ufrag = SDPText.iceUfrag(description.sdp)
        let farSideRestarts: Bool = lock.withLock {
            defer { remoteUfrag = ufrag ?? remoteUfrag }
            let restart = description.type == "offer" && remoteUfrag != nil && ufrag != nil && ufrag != remoteUfrag
            if restart { answerRestarts = true }
            return restart
        }
        if farSideRestarts { restartIce() }
        if description.type == "offer" { try startSending(numberedAs: description.sdp) }
        bridge.rememberRemote(description.sdp)
        try await apply(description, local: false)
    }

    public func rollback() async throws {
        // webrtcbin 1.22 marks rollback untested and it fails on a live offer. Parley's negotiation
        // never needs one: only the caller makes offers (`NegotiationStateMachine`).
        throw MediaEngineError(.unsupported, "webrtcbin 1.22 cannot roll back a local offer")
    }

    public func addRemoteCandidate(_ candidate: IceCandidate?) async throws {
        try checkOpen()
        // End of candidates needs nothing from libnice: it keeps checking what it has.
        guard let candidate, !candidate.candidate.isEmpty else { return }
        guard let mline = bridge.remoteMLine(of: candidate) else {
            throw MediaEngineError(.negotiation, "candidate for an unknown media section")
        }
        let text = candidate.candidate.hasPrefix("a=") ? String(candidate.candidate.dropFirst(2)) : candidate.candidate
        parley_webrtc_add_ice_candidate(webrtc, UInt32(mline), text)
    }

    public func startMedia() async {
        // Under the lock throughout, as every change to a live pipeline: a close cannot free it meanwhile.
        lock.withLock {
            guard holdingMedia, !closed else { return }
            holdingMedia = false
            bridge.startRecordingFile()
            // Chains still being linked start once they are (`startSending`): a source started
            // inside a bin that is changing state pushes into pads still flushing, and stops for good.
            if sending { releaseHeldChains() }
            bridge.setSpeakerMuted(microphone.held)
        }
    }

    /// Starts the sources of the chains linked while media was held, sending from the connection
    /// on. Under the lock, with every chain linked into the pipeline.
    private func releaseHeldChains() {
        for chain in heldChains {
            if parley_send_from_connection(webrtc, chain.bin, chain.end, chain.file) != 1 {
                logger.error("a held send chain has no \(chain.end)")
            }
            parley_bin_hold_sources(chain.bin, 0)
            parley_object_unref(chain.bin)
        }
        heldChains = []
    }

    /// Whether media is held (`holdsMedia`) and not yet started.
    public var holdsMedia: Bool { lock.withLock { holdingMedia } }

    public func setMicrophoneMuted(_ muted: Bool) async {
        updateMicrophone { $0.muted = muted }
    }

    public func setOnHold(_ held: Bool) async {
        updateMicrophone { $0.held = held }
        bridge.setSpeakerMuted(held || holdsMedia)
    }

    /// Whether the microphone is sent: neither muted nor held.
    public var sendsMicrophone: Bool { lock.withLock { microphone.sends } }

    public func setAudioEncoding(_ setting: BitrateController.Setting) async { applyEncoding(setting) }

    private func applyEncoding(_ setting: BitrateController.Setting) {
        lock.withLock {
            encoding = setting  // a send chain linked later starts with it
            guard !closed, let encoder = parley_bin_get(pipeline, "opusenc") else { return }
            defer { parley_object_unref(encoder) }
            parley_set_int(encoder, "bitrate", Int32(setting.bitrateKbps * 1000))
            parley_set_bool(encoder, "inband-fec", setting.fec ? 1 : 0)
            parley_set_int(encoder, "packet-loss-percentage", Int32(max(0, min(100, setting.expectedLossPct))))
            parley_set_from_string(encoder, "frame-size", "\(setting.frameMs)")
        }
    }

    /// No RFC 4733 sender in the pipeline (GStreamer's `rtpdtmfsrc` is not wired in): refused.
    public var canSendDTMF: Bool { false }

    public func sendDTMF(_ tones: String) async throws {
        throw MediaEngineError(.unsupported, "the GStreamer engine does not send DTMF yet")
    }

    public func statistics() async throws -> MediaStatsSample {
        try checkOpen()
        // Answered by webrtcbin's reply, or failed after `statisticsTimeout`: a promise webrtcbin
        // drops unanswered (seen around an ICE restart) must not hold the caller for good.
        let answer = OnceAnswer<parley_stats?>()
        let read: parley_stats? = await withCheckedContinuation { continuation in
            answer.set(continuation)
            let receiver = PromiseReceiver { _, reply in
                var stats = parley_stats()
                parley_stats_read(reply, &stats)
                answer.resolve(stats)
            }
            parley_webrtc_get_stats(webrtc, promiseCallback, Unmanaged.passRetained(receiver).toOpaque())
            DispatchQueue.global().asyncAfter(deadline: .now() + Self.statisticsTimeout) { answer.resolve(nil) }
        }
        guard let stats = read else { throw MediaEngineError(.pipeline, "webrtcbin gave no statistics within \(Self.statisticsTimeout) s") }
        let (asked, jitterBuffers) = lock.withLock { () -> (UInt64, parley_jitter_stats?) in
            guard !closed else { return (0, nil) }
            var buffers = parley_jitter_stats()
            return (parley_retransmissions_asked(webrtc), parley_jitter_buffers_read(webrtc, &buffers) > 0 ? buffers : nil)
        }
        // What the listener lost: the packets the jitter buffer gave up on or got too late to play.
        // The RTP statistics count a packet a retransmission brought too late as received. (A packet
        // given up on that comes later counts twice: an estimate on the safe side. With video the
        // buffers' counts mix both streams; then the RTP statistics stand.)
        let unplayed = jitterBuffers.map { Int($0.lost + $0.late) } ?? 0
        let lost = max(Int(max(0, stats.packets_lost)), video ? 0 : unplayed)
        return MediaStatsSample(at: ContinuousClock.now - created,
                                roundTripTimeMs: stats.round_trip_time_ms >= 0 ? stats.round_trip_time_ms : nil,
                                jitterMs: stats.jitter_ms >= 0 ? stats.jitter_ms : nil,
                                packetsReceived: Int(stats.packets_received),
                                packetsLost: lost,
                                bytesSent: Int(stats.bytes_sent),
                                bytesReceived: Int(stats.bytes_received),
                                audioLevel: bridge.receivedLevel,
                                remoteLossPct: stats.remote_fraction_lost >= 0 ? stats.remote_fraction_lost * 100 : nil,
                                packetsSent: Int(stats.packets_sent), retransmissionsAsked: Int(asked),
                                gapPackets: video ? 0 : Int(jitterBuffers?.gap_packets ?? 0), gapRuns: video ? 0 : Int(jitterBuffers?.gap_runs ?? 0))
    }

    /// How long a statistics read waits for webrtcbin, in seconds.
    static let statisticsTimeout = 2.0

    public var canRecordCalls: Bool { true }

    /// Records the call, what is sent and what is received, to an Ogg/Opus file at `path` (see
    /// `CallRecorder`), timed from when ICE connected. One recording at a time.
    public func startCallRecording(to path: String, layout: RecordingLayout) async throws {
        // One start at a time: a second one must not open (and so empty) the file of the first.
        try recorderLock.withLock {
            try checkOpen()
            guard !bridge.isRecording else { throw MediaEngineError(.pipeline, "the call is already being recorded") }
            let recorder = try CallRecorder(path: path, layout: layout, origin: bridge.iceConnectedAt ?? createdAt)
            guard bridge.startRecording(recorder) else {
                _ = try? recorder.finish()
                throw MediaEngineError(.closed, "the peer connection is closed")
            }
        }
    }

    public func stopCallRecording() async -> CallRecordingFile? {
        guard let recorder = bridge.stopRecording() else { return nil }
        // Finishing waits for the encoder's end of stream: off Swift's cooperative threads.
        let logger = self.logger
        return await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                do {
                    continuation.resume(returning: try recorder.finish())
                } catch {
                    logger.error("the call recording did not finish", metadata: ["file": "\(recorder.path)", "error": "\(error)"])
                    continuation.resume(returning: nil)
                }
            }
        }
    }

    public func close() async {
        _ = await stopCallRecording()
        teardown()
    }

    /// Opens a data channel now. Channels opened after the first offer need a renegotiation,
    /// which webrtcbin starts by itself.
    public func openDataChannel(_ spec: DataChannelSpec) throws -> DataChannel {
        try checkOpen()
        guard let raw = parley_webrtc_create_data_channel(webrtc, spec.label, spec.ordered ? 1 : 0, Int32(spec.maxRetransmits ?? -1)) else {
            throw MediaEngineError(.pipeline, "data channel '\(spec.label)' could not be created")
        }
        let channel = DataChannel(taking: raw)
        lock.withLock { localChannels.append(channel) }
        bridge.announce(channel)
        return channel
    }

    // MARK: Internals

    private var isClosed: Bool { lock.withLock { closed } }

    private func checkOpen() throws {
        if isClosed { throw MediaEngineError(.closed, "the peer connection is closed") }
    }

    private func teardown() {
        let first: Bool = lock.withLock {
            defer { closed = true }
            return !closed
        }
        guard first else { return }
        jitterBufferTask?.cancel()
        for channel in lock.withLock({ localChannels }) { channel.detach() }
        let held = lock.withLock { () -> [HeldChain] in
            defer { heldChains = [] }
            return heldChains
        }
        for chain in held { parley_object_unref(chain.bin) }
        parley_element_stop(pipeline)
        parley_webrtc_detach(pipeline, webrtc, retainedBridge)
        bridge.finish()
        parley_object_unref(webrtc)
        parley_object_unref(pipeline)
        Unmanaged<Bridge>.fromOpaque(retainedBridge).release()
    }

    private func restartIce() {
        lock.withLock { restarts += 1 }
        parley_ice_restart(webrtc)
    }

    /// One `mute` property carries both switches, so it is always set from both, under the lock so
    /// that a mute and a hold at once cannot leave the older value behind.
    /// Applies the switches to the send chains: the microphone is muted unless it `sends`, and a
    /// video call's camera sends no frame while held (as WebRTC's camera track is disabled then).
    private func updateMicrophone(_ change: (inout MicrophoneSwitches) -> Void = { _ in }) {
        lock.withLock {
            change(&microphone)
            guard !closed else { return }
            if let element = parley_bin_get(pipeline, "microphone") {
                parley_set_bool(element, "mute", microphone.sends ? 0 : 1)
                parley_object_unref(element)
            }
            if let camera = parley_bin_get(pipeline, "camera") {
                parley_set_bool(camera, "drop", microphone.held ? 1 : 0)
                parley_object_unref(camera)
            }
        }
    }

    private func apply(_ description: SessionDescription, local: Bool) async throws {
        var error: UnsafeMutablePointer<CChar>?
        let failure: String? = await withCheckedContinuation { continuation in
            let bridge = self.bridge
            let receiver = PromiseReceiver { replied, reply in
                let failure = replied ? Self.take(parley_reply_error(reply)) : "the peer connection closed"
                // Read on webrtcbin's thread, before a negotiation-needed check it queues next.
                if failure == nil { bridge.descriptionApplied() }
                continuation.resume(returning: failure)
            }
            let context = Unmanaged.passRetained(receiver).toOpaque()
            if parley_webrtc_set_description(webrtc, local ? 1 : 0, description.type, description.sdp, promiseCallback, context, &error) != 0 {
                Unmanaged<PromiseReceiver>.fromOpaque(context).release()
                continuation.resume(returning: Self.take(error) ?? "invalid description")
            }
        }
        if let failure {
            throw MediaEngineError(.negotiation, "\(local ? "local" : "remote") \(description.type) refused: \(failure)")
        }
    }

    private func awaitSDP(_ start: @escaping (parley_promise_callback, UnsafeMutableRawPointer) -> Void) async throws -> String {
        let result: Result<String, MediaEngineError> = await withCheckedContinuation { continuation in
            let receiver = PromiseReceiver { _, reply in
                var error: UnsafeMutablePointer<CChar>?
                if let sdp = parley_reply_sdp(reply, &error) {
                    defer { parley_free(sdp) }
                    continuation.resume(returning: .success(String(cString: sdp)))
                } else {
                    continuation.resume(returning: .failure(MediaEngineError(.negotiation, Self.take(error) ?? "no description")))
                }
            }
            start(promiseCallback, Unmanaged.passRetained(receiver).toOpaque())
        }
        return try result.get()
    }

    static func take(_ text: UnsafeMutablePointer<CChar>?) -> String? {
        guard let text else { return nil }
        defer { parley_free(text) }
        return String(cString: text)
    }
}

// MARK: Promises

/// Receives one promise reply on webrtcbin's thread; the reply is valid only during `handle`.
/// A continuation resumed by the first of several answers.
final class OnceAnswer<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var continuation: CheckedContinuation<Value, Never>?

    func set(_ continuation: CheckedContinuation<Value, Never>) { lock.withLock { self.continuation = continuation } }

    func resolve(_ value: Value) {
        let waiting = lock.withLock { () -> CheckedContinuation<Value, Never>? in
            defer { continuation = nil }
            return continuation
        }
        waiting?.resume(returning: value)
    }
}

final class PromiseReceiver {
    let handle: (_ replied: Bool, _ reply: UnsafeMutableRawPointer?) -> Void
    init(_ handle: @escaping (_ replied: Bool, _ reply: UnsafeMutableRawPointer?) -> Void) { self.handle = handle }
}

let promiseCallback: parley_promise_callback = { context, replied, reply in
    guard let context else { return }
    Unmanaged<PromiseReceiver>.fromOpaque(context).takeRetainedValue().handle(replied != 0, reply)
}

// MARK: ICE server URLs

/// W3C ICE server URLs (`stun:host:port`, `turn:host:port?transport=udp`) as webrtcbin wants them.
enum IceURL {
    static func stun(_ url: String) -> String? {
        guard url.hasPrefix("stun:") else { return nil }
        let rest = url.dropFirst(5).split(separator: "?").first.map(String.init) ?? ""
        return rest.isEmpty ? nil : "stun://" + rest.replacingOccurrences(of: "//", with: "")
    }

    static func turn(_ url: String, username: String?, credential: String?) -> String? {
        let scheme: String
        if url.hasPrefix("turns:") { scheme = "turns" } else if url.hasPrefix("turn:") { scheme = "turn" } else { return nil }
        guard let username, let credential else { return nil }
        let rest = url.dropFirst(scheme.count + 1).replacingOccurrences(of: "//", with: "")
        // coturn REST usernames hold a ':' ("expiry:user"); webrtcbin unescapes the user info.
        return "\(scheme)://\(escape(username)):\(escape(credential))@\(rest)"
    }

    private static func escape(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}

/// The local and remote ICE candidates carrying a call's media.
public struct SelectedCandidatePair: Hashable, Sendable {
    /// "host", "srflx", "prflx" or "relay".
    public var localType: String
    public var remoteType: String
    /// For a relay candidate, the address and port the TURN server allocated.
    public var localAddress: String
    public var localPort: Int
    public var remoteAddress: String
    public var remotePort: Int
}

extension SelectedCandidatePair: CustomStringConvertible {
    /// "host 198.51.100.21:50012 → host 198.51.100.22:41007".
    public var description: String {
        func endpoint(_ address: String, _ port: Int) -> String { address.contains(":") ? "[\(address)]:\(port)" : "\(address):\(port)" }
        return "\(localType) \(endpoint(localAddress, localPort)) → \(remoteType) \(endpoint(remoteAddress, remotePort))"
    }
}

