import CParleyGst
import Foundation
import Logging
import ParleyKit
import ParleyProtocol

/// The one place webrtcbin's callbacks land. They arrive on webrtcbin's and GStreamer's streaming
/// threads; the bridge turns them into stream events and keeps the little state they need under a lock.
final class Bridge: @unchecked Sendable {
    let events: AsyncStream<PeerConnectionEvent>
    let channels: AsyncStream<DataChannel>
    private let eventSink: AsyncStream<PeerConnectionEvent>.Continuation
    private let channelSink: AsyncStream<DataChannel>.Continuation
    private let pipeline: UnsafeMutableRawPointer
    private let output: AudioOutputSink
    private let logger: Logger
    private let lock = NSLock()
    /// Whether the speaker is muted (held, or media not started yet): a receiver made later starts so.
    private var speakerMuted = false
    /// The received audio's file, made when media starts (a connection that holds media and never
    /// starts it, a path to a device that did not answer, makes none).
    private var writer: WAV.Writer?
    private let recording: URL?
    private var finished = false

    // Negotiation-needed events, as libwebrtc numbers them: an event is stale once a round that
    // started after it has completed.
    private var lastNegotiationEvent: UInt64 = 0
    private var coveredByOffer: UInt64 = 0
    private var completedThrough: UInt64 = 0
    private var localMids: [String?] = []
    private var localSDP: String?
    private var videoFrames = 0
    private var videoChanges = 0
    private var lastVideoColor: FrameColor?
    private var lastVideoSamples: [UInt8] = []
    private var remoteMids: [String?] = []
    private var localCandidates: [IceCandidate] = []
    private var gatheringComplete = false
    var firstAudioAt: ContinuousClock.Instant? { lock.withLock { _firstAudioAt } }
    private var _firstAudioAt: ContinuousClock.Instant?
    var iceConnectedAt: ContinuousClock.Instant? { lock.withLock { _iceConnectedAt } }
    private var _iceConnectedAt: ContinuousClock.Instant?
    /// When the connection as a whole first connected: DTLS-SRTP up on a connected ICE pair.
    var connectedAt: ContinuousClock.Instant? { lock.withLock { _connectedAt } }
    private var _connectedAt: ContinuousClock.Instant?
    private var level: Double?
    private var remoteChannels: [DataChannel] = []
    private var taps: [(element: UnsafeMutableRawPointer, probe: UInt)] = []
    private var recorder: CallRecorder?
    /// The send chain's `sent` element, tapped only while a recording runs.
    private var sentElement: UnsafeMutableRawPointer?
    private var sentProbe: UInt?

    init(pipeline: UnsafeMutableRawPointer, output: AudioOutputSink, recording: URL?, mediaHeld: Bool = false, logger: Logger) {
        self.pipeline = pipeline
        self.output = output
        self.logger = logger
        self.recording = recording
        (events, eventSink) = AsyncStream.makeStream()
        (channels, channelSink) = AsyncStream.makeStream()
        if !mediaHeld { startRecordingFile() }
    }

    /// Makes the received audio's file, if there is to be one.
    func startRecordingFile() {
        guard let url = recording else { return }
        let made: WAV.Writer?
        do { made = try WAV.Writer(url: url, sampleRate: 48_000, channels: 1) } catch {
            logger.error("cannot record", metadata: ["file": "\(url.path)", "error": "\(error)"])
            made = nil
        }
        lock.withLock { if writer == nil, !finished { writer = made } }
    }

    var receivedLevel: Double? { lock.withLock { level } }

    // MARK: Negotiation bookkeeping

    func negotiationStillNeeded(_ id: UInt64) -> Bool {
        lock.withLock { id == lastNegotiationEvent && id > completedThrough }
    }

    func offerCovers() { lock.withLock { coveredByOffer = lastNegotiationEvent } }

    /// A description was applied (on webrtcbin's thread). Back in stable, every event the round
    /// covered is done; webrtcbin fires a fresh one if more is needed.
    func descriptionApplied() {
        lock.withLock { completedThrough = max(completedThrough, lastNegotiationEvent) }
    }

    func rememberLocal(_ sdp: String) {
        lock.withLock {
            localMids = SDPText.mids(sdp)
            localSDP = sdp
        }
    }

    var currentLocalSDP: String? { lock.withLock { localSDP } }

    /// The candidate types ("host", "srflx", "relay") gathered so far.
    var localCandidateTypes: Set<String> {
        lock.withLock {
            Set(localCandidates.compactMap { candidate in
                let fields = candidate.candidate.split(separator: " ")
                return fields.firstIndex(of: "typ").flatMap { $0 + 1 < fields.count ? String(fields[$0 + 1]) : nil }
            })
        }
    }
    /// The transports ("udp", "tcp") of the candidates gathered so far: a candidate's third field.
    var localCandidateTransports: Set<String> {
        lock.withLock {
            Set(localCandidates.compactMap { candidate in
                let fields = candidate.candidate.split(separator: " ")
                return fields.count > 2 ? fields[2].lowercased() : nil
            })
        }
    }
    var receivedVideoFrames: Int { lock.withLock { videoFrames } }

    /// A decoded RGB frame arrived: counted, its average colour noted (from a sample of pixels, every
    /// 61st), and whether it differs from the one before: some sampled channel moved by more than
    /// coding noise does (48 of 255), as a moving picture does and a frozen one does not.
    func videoFrame(_ rgb: UnsafeRawBufferPointer?) {
        var color: FrameColor?
        var samples: [UInt8] = []
        if let rgb, rgb.count >= 3 {
            var sums = (0, 0, 0)
            samples.reserveCapacity(rgb.count / 61 + 3)
            for offset in stride(from: 0, to: rgb.count - 2, by: 3 * 61) {
                sums.0 += Int(rgb[offset]); sums.1 += Int(rgb[offset + 1]); sums.2 += Int(rgb[offset + 2])
                samples += [rgb[offset], rgb[offset + 1], rgb[offset + 2]]
            }
            let count = samples.count / 3
            color = FrameColor(red: sums.0 / count, green: sums.1 / count, blue: sums.2 / count)
        }
        lock.withLock {
            videoFrames += 1
            if let color { lastVideoColor = color }
            if samples.count == lastVideoSamples.count,
               zip(samples, lastVideoSamples).contains(where: { abs(Int($0) - Int($1)) > 48 }) {
                videoChanges += 1
            }
            lastVideoSamples = samples
        }
    }

    /// Decoded video frames that differed from the frame before.
    var receivedVideoChanges: Int { lock.withLock { videoChanges } }

    var receivedVideoColor: FrameColor? { lock.withLock { lastVideoColor } }
    func rememberRemote(_ sdp: String) { lock.withLock { remoteMids = SDPText.mids(sdp) } }

    func remoteMLine(of candidate: IceCandidate) -> Int? {
        lock.withLock {
            if let index = candidate.sdpMLineIndex { return index }
            if let mid = candidate.sdpMid { return remoteMids.firstIndex(of: mid) }
            return remoteMids.isEmpty ? nil : 0
        }
    }

    /// After an ICE restart libnice keeps its candidates instead of gathering again, so the far
    /// side hears them again under the new credentials.
    func reannounceCandidates() {
        let (candidates, complete) = lock.withLock { (localCandidates, gatheringComplete) }
        for candidate in candidates { eventSink.yield(.localCandidate(candidate)) }
        if complete { eventSink.yield(.localCandidate(nil)) }
    }

    // MARK: Callbacks

    /// webrtcbin wants a negotiation, or the engine does (before its send chains exist).
    func negotiationNeeded() {
        let id: UInt64 = lock.withLock {
            lastNegotiationEvent += 1
            return lastNegotiationEvent
        }
        eventSink.yield(.negotiationNeeded(id: id))
    }

    func handle(kind: Int32, number: UInt32, text: UnsafePointer<CChar>?, object: UnsafeMutableRawPointer?) {
        switch kind {
        case Int32(PARLEY_EVENT_NEGOTIATION_NEEDED.rawValue):
            negotiationNeeded()
        case Int32(PARLEY_EVENT_ICE_CANDIDATE.rawValue):
            guard let text else { return }
            let candidate: IceCandidate = lock.withLock {
                let mid = Int(number) < localMids.count ? localMids[Int(number)] : nil
                let candidate = IceCandidate(candidate: String(cString: text), sdpMid: mid ?? "\(number)", sdpMLineIndex: Int(number))
                localCandidates.append(candidate)
                return candidate
            }
            eventSink.yield(.localCandidate(candidate))
        case Int32(PARLEY_EVENT_ICE_GATHERING_STATE.rawValue):
            if number == 2 {  // GST_WEBRTC_ICE_GATHERING_STATE_COMPLETE
                lock.withLock { gatheringComplete = true }
                eventSink.yield(.localCandidate(nil))
            }
        case Int32(PARLEY_EVENT_ICE_CONNECTION_STATE.rawValue):
            let states: [IceConnectionState] = [.new, .checking, .connected, .completed, .failed, .disconnected, .closed]
            guard Int(number) < states.count else { return }
            let state = states[Int(number)]
            if state == .connected || state == .completed {
                lock.withLock { if _iceConnectedAt == nil { _iceConnectedAt = .now } }
            }
            eventSink.yield(.iceConnectionState(state))
        case Int32(PARLEY_EVENT_CONNECTION_STATE.rawValue):
            // GstWebRTCPeerConnectionState, in order: connected once DTLS is up on a connected ICE pair.
            let states: [PeerConnectionState] = [.new, .connecting, .connected, .disconnected, .failed, .closed]
            guard Int(number) < states.count else { return }
            let state = states[Int(number)]
            if state == .connected { lock.withLock { if _connectedAt == nil { _connectedAt = .now } } }
            eventSink.yield(.connectionState(state))
        case Int32(PARLEY_EVENT_PAD_ADDED.rawValue):
            guard let object, let text else { return }
            receive(pad: object, media: String(cString: text))
        case Int32(PARLEY_EVENT_DATA_CHANNEL.rawValue):
            guard let object else { return }
            let channel = DataChannel(taking: parley_object_ref(object))
            lock.withLock { remoteChannels.append(channel) }
            channelSink.yield(channel)
        case Int32(PARLEY_EVENT_ERROR.rawValue):
            logger.error("media pipeline error", metadata: ["gst.message": "\(text.map { String(cString: $0) } ?? "")"])
        case Int32(PARLEY_EVENT_WARNING.rawValue):
            logger.debug("media pipeline warning", metadata: ["gst.message": "\(text.map { String(cString: $0) } ?? "")"])
        default:
            break
        }
    }

    func announce(_ channel: DataChannel) { channelSink.yield(channel) }

    /// A stream from the far side: decode it and play, record or drop it.
    private func receive(pad: UnsafeMutableRawPointer, media: String) {
        guard let description = PipelineDescription.receiver(media: media, output: output) else {
            logger.warning("ignoring a stream of unknown media", metadata: ["media": "\(media)"])
            return
        }
        var error: UnsafeMutablePointer<CChar>?
        guard let bin = parley_bin_new(description, &error) else {
            logger.error("cannot build the receiver", metadata: ["error": "\(GStreamerPeerConnection.take(error) ?? "")"])
            return
        }
        if media == "audio", let depay = parley_bin_get(bin, "depay") {
            _ = parley_opus_depay_exact_gaps(depay)
            parley_object_unref(depay)
        }
        // A receiver made while the call is held (or its media held) starts muted.
        if media == "audio", lock.withLock({ speakerMuted }), let speaker = parley_bin_get(bin, "speaker") {
            parley_set_bool(speaker, "mute", 1)
            parley_object_unref(speaker)
        }
        if media == "audio", let received = parley_bin_get(bin, "received") {
            let probe = parley_pad_tap(received, "src", audioTapCallback, Unmanaged.passUnretained(self).toOpaque())
            lock.withLock { taps.append((received, probe)) }
        }
        if media == "video", let received = parley_bin_get(bin, "receivedvideo") {
            let probe = parley_pad_tap(received, "src", videoTapCallback, Unmanaged.passUnretained(self).toOpaque())
            lock.withLock { taps.append((received, probe)) }
        }
        if parley_bin_add_and_link(pipeline, bin, pad) != 0 {
            logger.error("cannot link the receiver", metadata: ["media": "\(media)"])
            return
        }
        // Again once it is in the pipeline: the speaker may have been unmuted (media started)
        // between the first look and now, when `setSpeakerMuted` could not find it yet.
        if media == "audio", let speaker = parley_bin_get(bin, "speaker") {
            parley_set_bool(speaker, "mute", lock.withLock { speakerMuted } ? 1 : 0)
            parley_object_unref(speaker)
        }
        if media == "audio", output == .device, let playback = parley_bin_get(pipeline, "playback") {
            if parley_link(bin, playback) != 0 { logger.error("cannot reach the speaker") }
            parley_object_unref(playback)
        }
    }

    /// Decoded received audio: 16-bit mono at 48 kHz.
    func audio(_ bytes: UnsafeRawPointer, count: Int) {
        let samples = count / 2
        guard samples > 0 else { return }
        var sum = 0.0
        let pcm = bytes.bindMemory(to: Int16.self, capacity: samples)
        for i in 0..<samples {
            let value = Double(Int16(littleEndian: pcm[i])) / 32768
            sum += value * value
        }
        let rms = (sum / Double(samples)).squareRoot()
        let first: Bool = lock.withLock {
            guard !finished else { return false }
            level = rms
            guard _firstAudioAt == nil else { return false }
            _firstAudioAt = .now
            return true
        }
        lock.withLock { writer }?.append(Data(bytes: bytes, count: count))
        lock.withLock { recorder }?.remote(bytes, count: count)
        if first { eventSink.yield(.remoteAudioStarted) }
    }

    /// Audio as sent, after mute and hold: 16-bit mono at 48 kHz.
    func sent(_ bytes: UnsafeRawPointer, count: Int) {
        lock.withLock { finished ? nil : recorder }?.local(bytes, count: count)
    }

    /// Keeps the audio send chain's `sent` element, where a call recording taps what is sent.
    func rememberSendChain(_ bin: UnsafeMutableRawPointer) {
        guard let element = parley_bin_get(bin, "sent") else { return }
        lock.withLock {
            if let old = sentElement { parley_object_unref(old) }
            sentElement = element
        }
    }

    /// Hands both directions to `recorder` from now on; false when one is recording already.
    func startRecording(_ recorder: CallRecorder) -> Bool {
        lock.withLock {
            guard self.recorder == nil, !finished else { return false }
            self.recorder = recorder
            // The send side is tapped only while recording: no call pays for it otherwise.
            if let element = sentElement {
                sentProbe = parley_pad_tap(element, "src", sentTapCallback, Unmanaged.passUnretained(self).toOpaque())
            }
            return true
        }
    }

    var isRecording: Bool { lock.withLock { recorder != nil } }

    /// Stops handing audio to the recorder; answers it, to be finished.
    func stopRecording() -> CallRecorder? {
        lock.withLock {
            if let element = sentElement, let probe = sentProbe { parley_pad_untap(element, "src", probe) }
            sentProbe = nil
            defer { recorder = nil }
            return recorder
        }
    }

    func setSpeakerMuted(_ muted: Bool) {
        lock.withLock { speakerMuted = muted }
        guard let speaker = parley_bin_get(pipeline, "speaker") else { return }
        parley_set_bool(speaker, "mute", muted ? 1 : 0)
        parley_object_unref(speaker)
    }

    /// The pipeline has stopped: no callback comes any more.
    func finish() {
        let (channels, taps): ([DataChannel], [(element: UnsafeMutableRawPointer, probe: UInt)]) = lock.withLock {
            finished = true
            defer { remoteChannels = []; self.taps = [] }
            return (remoteChannels, self.taps)
        }
        for tap in taps {
            parley_pad_untap(tap.element, "src", tap.probe)
            parley_object_unref(tap.element)
        }
        for channel in channels { channel.detach() }
        // A connection dropped without close() still leaves a finished recording file.
        if let recorder = stopRecording() {
            do { _ = try recorder.finish() } catch {
                logger.error("the call recording did not finish", metadata: ["file": "\(recorder.path)", "error": "\(error)"])
            }
        }
        if let element = lock.withLock({ () -> UnsafeMutableRawPointer? in defer { sentElement = nil }; return sentElement }) {
            parley_object_unref(element)
        }
        lock.withLock { writer }?.close()
        eventSink.yield(.iceConnectionState(.closed))
        eventSink.yield(.connectionState(.closed))
        eventSink.finish()
        channelSink.finish()
    }
}

let bridgeEventCallback: parley_event_callback = { context, kind, number, text, object in
    guard let context else { return }
    Unmanaged<Bridge>.fromOpaque(context).takeUnretainedValue().handle(kind: kind, number: number, text: text, object: object)
}

let videoTapCallback: parley_buffer_callback = { context, bytes, count in
    guard let context else { return }
    Unmanaged<Bridge>.fromOpaque(context).takeUnretainedValue().videoFrame(bytes.map { UnsafeRawBufferPointer(start: $0, count: count) })
}

let sentTapCallback: parley_buffer_callback = { context, bytes, count in
    guard let context, let bytes else { return }
    Unmanaged<Bridge>.fromOpaque(context).takeUnretainedValue().sent(bytes, count: count)
}

let audioTapCallback: parley_buffer_callback = { context, bytes, count in
    guard let context, let bytes else { return }
    Unmanaged<Bridge>.fromOpaque(context).takeUnretainedValue().audio(bytes, count: count)
}
