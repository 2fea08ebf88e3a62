import Foundation
import ParleyKit
import ParleyProtocol

/// A peer connection without media, for tests: it keeps WebRTC's signaling states (and refuses what
/// the GStreamer engine refuses, rollback included), hands out a host candidate after each local
/// description, and reports ICE connected once a negotiation round is complete. `failIce()` simulates
/// a network failure; the next completed round (an ICE restart) connects again. Mute and hold act on
/// the microphone as the engine's do: `sendingAudio` is what goes out.
public final class FakePeerConnection: PeerConnection, @unchecked Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public let events: AsyncStream<PeerConnectionEvent>
    private let sink: EventQueue
    private let lock = NSLock()
    private let name: String
    private var state: PeerSignalingState = .stable
    private var iceState: IceConnectionState = .new
    private var version = 0
    private var localDescription: SessionDescription?
    private var remoteDescription: SessionDescription?
    private var remoteCandidates: [IceCandidate?] = []
    private var startedAt = ContinuousClock.now
    /// When ICE and DTLS first connected.
    private var connectedAt: ContinuousClock.Instant?
    private var microphone = MicrophoneSwitches()
    public private(set) var closed = false
    public private(set) var encoding: BitrateController.Setting?
    public private(set) var offersMade: [Bool] = []
    private var networkDown = false
    private let offerGate = Gate()
    private let remoteGate = Gate()
    /// Loss to report in statistics, in percent.
    public var simulatedLossPct: Double = 0
    /// Whether the far side's packets stop arriving: the received counters stand still from now
    /// on (as a real connection's do when DTLS is up but nothing comes), and move on when cleared.
    public var nothingArrives: Bool {
        get { lock.withLock { arrivalsStoppedAt != nil } }
        set {
            lock.withLock {
                if newValue, arrivalsStoppedAt == nil { arrivalsStoppedAt = ContinuousClock.now - startedAt }
                if !newValue, let stopped = arrivalsStoppedAt {
                    missed += ContinuousClock.now - startedAt - stopped
                    arrivalsStoppedAt = nil
                }
            }
        }
    }
    private var arrivalsStoppedAt: Duration?
    /// How long arrivals stood still, in all: what the received counters leave out.
    private var missed: Duration = .zero

    /// WebRTC's negotiation-needed flag: set by adding media (at creation), cleared by a completed round.
    private var needsNegotiation = true

    /// Media held until `startMedia()` (`PeerConnectionConfiguration.holdsMedia`): nothing is sent or played.
    private var holding: Bool
    /// Whether the microphone was ever opened (as the engine opens it once media starts).
    public private(set) var microphoneOpened: Bool

    public init(name: String, holdsMedia: Bool = false) {
        self.name = name
        holding = holdsMedia
        mediaFrom = holdsMedia ? nil : .zero
        microphoneOpened = !holdsMedia
        sendingChanges = [!holdsMedia]
        let queue = EventQueue()
        sink = queue
        events = AsyncStream(unfolding: { await queue.next() })
        sink.yield(.negotiationNeeded(id: 1))
    }

    /// As libwebrtc does: an event stands while the flag is set and no later event replaced it.
    public func shouldNegotiate(_ id: UInt64) async -> Bool {
        lock.withLock { needsNegotiation && state == .stable && id == 1 }
    }

    public var candidates: [IceCandidate?] { lock.withLock { remoteCandidates } }
    public var muted: Bool { lock.withLock { microphone.muted } }
    public var held: Bool { lock.withLock { microphone.held } }
    /// Whether the microphone goes out: neither muted nor held, nor held back until `startMedia()`, as in the engine.
    public var sendingAudio: Bool { lock.withLock { microphone.sends && !holding } }
    /// Whether media is held back until `startMedia()`.
    public var holdsMedia: Bool { lock.withLock { holding } }

    public func startMedia() async {
        lock.withLock {
            holding = false
            microphoneOpened = true
            if mediaFrom == nil { mediaFrom = ContinuousClock.now - startedAt }
            noteSending()
        }
    }

    /// Whether the microphone went out, each time that changed (from `false` at the start): a
    /// `true` in it means something was sent, if only for a moment.
    public var sendingHistory: [Bool] { lock.withLock { sendingChanges } }
    private var sendingChanges = [false]
    /// When media started, from `startedAt` (nil while held): as the engine, a held connection
    /// sends and receives no packet.
    private var mediaFrom: Duration?

    private func noteSending() {
        let now = microphone.sends && !holding
        if sendingChanges.last != now { sendingChanges.append(now) }
    }
    public var currentIceState: IceConnectionState { lock.withLock { iceState } }
    public var remote: SessionDescription? { lock.withLock { remoteDescription } }

    public func signalingState() async -> PeerSignalingState { lock.withLock { state } }

    public func createOffer(iceRestart: Bool) async throws -> SessionDescription {
        await offerGate.pass()
        return try lock.withLock {
            guard !closed else { throw Failure(description: "closed") }
            offersMade.append(iceRestart)
            version += 1
            return SessionDescription(type: "offer", sdp: sdp(ufrag: iceRestart ? "restart\(version)" : "u\(version)"))
        }
    }

    public func createAnswer() async throws -> SessionDescription {
        try lock.withLock {
            guard !closed else { throw Failure(description: "closed") }
            guard state == .haveRemoteOffer else { throw Failure(description: "createAnswer in \(state.rawValue)") }
            version += 1
            return SessionDescription(type: "answer", sdp: sdp(ufrag: "a\(version)"))
        }
    }

    public func setLocalDescription(_ description: SessionDescription) async throws {
        let completed: Bool = try lock.withLock {
            guard !closed else { throw Failure(description: "closed") }
            switch (description.type, state) {
            case ("offer", .stable): state = .haveLocalOffer
            case ("answer", .haveRemoteOffer): state = .stable
            default: throw Failure(description: "setLocalDescription(\(description.type)) in \(state.rawValue)")
            }
            localDescription = description
            if state == .stable { needsNegotiation = false }
            return state == .stable
        }
        sink.yield(.localCandidate(IceCandidate(candidate: "candidate:1 1 udp 2122260223 127.0.0.1 \(40000 + version) typ host",
                                                sdpMid: "0", sdpMLineIndex: 0)))
        sink.yield(.localCandidate(nil))
        if completed { connect() }
    }

    public func setRemoteDescription(_ description: SessionDescription) async throws {
        let completed: Bool = try lock.withLock {
            guard !closed else { throw Failure(description: "closed") }
            // As webrtcbin and libwebrtc: a description that does not parse, or has no media section,
            // is refused.
            guard description.sdp.hasPrefix("v=0\r\n"), description.sdp.contains("\r\nm=") else {
                throw Failure(description: "the SDP does not parse: \(description.sdp.prefix(40))")
            }
            switch (description.type, state) {
            case ("offer", .stable): state = .haveRemoteOffer
            case ("answer", .haveLocalOffer): state = .stable
            default: throw Failure(description: "setRemoteDescription(\(description.type)) in \(state.rawValue)")
            }
            remoteDescription = description
            if state == .stable { needsNegotiation = false }
            return state == .stable
        }
        if completed { connect() }
        // What it reported meanwhile (ICE on the new description) is out before it returns, as a real one's may be.
        await remoteGate.pass()
    }

    /// webrtcbin cannot roll back a local offer, and neither can this fake: a test cannot pass on a
    /// rollback that a real call would never get.
    public func rollback() async throws {
        throw Failure(description: "rollback is not supported (webrtcbin cannot roll back)")
    }

    public func addRemoteCandidate(_ candidate: IceCandidate?) async throws {
        try lock.withLock {
            guard !closed else { throw Failure(description: "closed") }
            guard let remoteDescription else { throw Failure(description: "a candidate before the remote description") }
            // A candidate for a media section the remote description does not have is refused.
            if let candidate, candidate.sdpMid.map({ !remoteDescription.sdp.contains("a=mid:\($0)\r\n") }) ?? (candidate.sdpMLineIndex != 0) {
                throw Failure(description: "a candidate for an unknown media section: \(candidate)")
            }
            remoteCandidates.append(candidate)
        }
    }

    public func setMicrophoneMuted(_ muted: Bool) async {
        lock.withLock {
            microphone.muted = muted
            noteSending()
        }
    }

    public func setOnHold(_ held: Bool) async {
        lock.withLock {
            microphone.held = held
            noteSending()
        }
    }
    public func setAudioEncoding(_ setting: BitrateController.Setting) async { lock.withLock { encoding = setting } }

    /// Tones sent with `sendDTMF`, in order.
    public private(set) var tonesSent = ""

    /// Whether it sends DTMF: not by default, as the GStreamer engine does not; set it to stand in
    /// for WebRTC's, which does once connected. Either way it refuses what WebRTC's `insertDtmf` does.
    public var sendsDTMF: Bool {
        get { lock.withLock { dtmf } }
        set { lock.withLock { dtmf = newValue } }
    }
    private var dtmf = false

    public var canSendDTMF: Bool { lock.withLock { dtmf && !closed && iceState == .connected } }

    public func sendDTMF(_ tones: String) async throws {
        try lock.withLock {
            guard dtmf else { throw Failure(description: "this engine does not send DTMF") }
            guard !tones.isEmpty, tones.allSatisfy({ "0123456789*#ABCDabcd,".contains($0) }) else {
                throw Failure(description: "WebRTC refuses the tones \(tones)")
            }
            guard !closed, iceState == .connected else { throw Failure(description: "DTMF without connected media") }
            tonesSent += tones
        }
    }

    /// How many of the next statistics reads fail, as the engine's fail when its pipeline does
    /// not answer in time.
    public var failingStatisticsReads: Int {
        get { lock.withLock { statisticsFailures } }
        set { lock.withLock { statisticsFailures = newValue } }
    }
    private var statisticsFailures = 0

    public func statistics() async throws -> MediaStatsSample {
        try lock.withLock {
            if statisticsFailures > 0 {
                statisticsFailures -= 1
                throw Failure(description: "no statistics in time")
            }
            let elapsed = ContinuousClock.now - startedAt
            func packets(in time: Duration) -> Int { Int(time.components.seconds * 50 + time.components.attoseconds / 20_000_000_000_000_000) }
            let since = mediaFrom ?? elapsed
            let sent = packets(in: elapsed - since)
            let arriving = packets(in: max(.zero, (arrivalsStoppedAt ?? elapsed) - missed - since))
            let lost = Int(Double(arriving) * simulatedLossPct / 100)
            // A round trip is known from the first RTCP receiver report, about a second in.
            let rtt: Double? = connectedAt.map { ContinuousClock.now - $0 >= .seconds(1) } == true ? 20 : nil
            return MediaStatsSample(at: elapsed, roundTripTimeMs: rtt, jitterMs: 2, packetsReceived: arriving - lost, packetsLost: lost,
                                    bytesSent: sent * 160, bytesReceived: (arriving - lost) * 160, audioLevel: microphone.sends ? 0.3 : 0,
                                    packetsSent: sent)
        }
    }

    /// Whether it records, as the GStreamer engine does (the WebRTC framework's does not).
    public var canRecordCalls = true
    /// How long starting a recording takes (the engine builds and starts a pipeline).
    public var recordingStartDelay: Duration = .zero

    /// The recording running now, as the engine's: one at a time, and only while open.
    public var recordingPath: String? { lock.withLock { recording?.path } }
    /// Every recording started and stopped, in order.
    public var recordings: [CallRecordingFile] { lock.withLock { finishedRecordings } }
    private var finishedRecordings: [CallRecordingFile] = []
    private var recording: (path: String, layout: RecordingLayout, at: Duration)?

    public func startCallRecording(to path: String, layout: RecordingLayout) async throws {
        if recordingStartDelay > .zero { try await Task.sleep(for: recordingStartDelay) }
        try lock.withLock {
            guard !closed else { throw Failure(description: "the peer connection is closed") }
            guard recording == nil else { throw Failure(description: "the call is already being recorded") }
            recording = (path, layout, ContinuousClock.now - startedAt)
        }
    }

    public func stopCallRecording() async -> CallRecordingFile? {
        lock.withLock {
            guard let running = recording else { return nil }
            recording = nil
            let end = ContinuousClock.now - startedAt
            func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }
            let file = CallRecordingFile(path: running.path, layout: running.layout, startSeconds: seconds(running.at), endSeconds: seconds(end))
            finishedRecordings.append(file)
            return file
        }
    }

    public func close() async {
        _ = await stopCallRecording()
        lock.withLock {
            closed = true
            state = .closed
            iceState = .closed
        }
        sink.finish()
    }

    /// Holds `createOffer` until `resumeOfferCreation()`, to let a test act while an offer is being made.
    public func pauseOfferCreation() { offerGate.close() }
    public func resumeOfferCreation() { offerGate.open() }
    /// How many `createOffer` calls wait at a paused gate.
    public var offersWaiting: Int { offerGate.waiting }

    /// Holds `setRemoteDescription` from returning, once the description is applied and what it
    /// brought about reported, until `resumeRemoteDescriptions()`.
    public func pauseRemoteDescriptions() { remoteGate.close() }
    public func resumeRemoteDescriptions() { remoteGate.open() }
    /// How many `setRemoteDescription` calls wait at a paused gate.
    public var remoteDescriptionsWaiting: Int { remoteGate.waiting }
    /// Events reported and not yet taken by the reader of `events`.
    public var eventsUnread: Int { sink.unread }

    /// Simulates the network dropping: ICE fails.
    public func failIce() {
        lock.withLock { iceState = .failed }
        sink.yield(.iceConnectionState(.failed))
        sink.yield(.connectionState(.failed))
    }

    /// Simulates a network that stays down: ICE fails now and after every restart.
    public func breakNetwork() {
        lock.withLock {
            networkDown = true
            iceState = .failed
        }
        sink.yield(.iceConnectionState(.failed))
        sink.yield(.connectionState(.failed))
    }

    private func connect() {
        let (changed, down): (Bool, Bool) = lock.withLock {
            guard iceState != .connected, !closed else { return (false, false) }
            iceState = networkDown ? .failed : .connected
            return (true, networkDown)
        }
        guard changed else { return }
        if down {
            sink.yield(.iceConnectionState(.failed))
            sink.yield(.connectionState(.failed))
            return
        }
        // As a real one reports: ICE first, then the connection as a whole once DTLS is up.
        lock.withLock { if connectedAt == nil { connectedAt = .now } }
        sink.yield(.iceConnectionState(.connected))
        sink.yield(.connectionState(.connected))
        sink.yield(.remoteAudioStarted)
    }

    private func sdp(ufrag: String) -> String {
        "v=0\r\no=- \(name.hashValue & 0xFFFF) \(version) IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=ice-ufrag:\(ufrag)\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n"
    }
}

/// A peer connection's events, in order, counted as their one reader takes them; finished by `finish()`.
private final class EventQueue: @unchecked Sendable {
    private let lock = NSLock()
    private var buffered: [PeerConnectionEvent] = []
    private var finished = false
    private var reader: CheckedContinuation<PeerConnectionEvent?, Never>?

    var unread: Int { lock.withLock { buffered.count } }

    func yield(_ event: PeerConnectionEvent) {
        let waiting: CheckedContinuation<PeerConnectionEvent?, Never>? = lock.withLock {
            guard !finished else { return nil }
            if let reader {
                self.reader = nil
                return reader
            }
            buffered.append(event)
            return nil
        }
        waiting?.resume(returning: event)
    }

    func finish() {
        let waiting: CheckedContinuation<PeerConnectionEvent?, Never>? = lock.withLock {
            finished = true
            defer { reader = nil }
            return reader
        }
        waiting?.resume(returning: nil)
    }

    /// The next event; nil once finished and read to the end, or when the reader is cancelled.
    func next() async -> PeerConnectionEvent? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let now: PeerConnectionEvent?? = lock.withLock {
                    if !buffered.isEmpty { return .some(buffered.removeFirst()) }
                    if finished || Task.isCancelled { return .some(nil) }
                    precondition(reader == nil, "a peer connection's events have one reader")
                    reader = continuation
                    return .none
                }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            let waiting = lock.withLock {
                defer { reader = nil }
                return reader
            }
            waiting?.resume(returning: nil)
        }
    }
}

/// Lets callers through while open; while closed, holds them until it opens (a fake's step, or a
/// transport's connect, held back by a test).
public final class Gate: @unchecked Sendable {
    private let lock = NSLock()
    private var isOpen = true
    private var waiters: [CheckedContinuation<Void, Never>] = []

    public init() {}

    /// Callers held now.
    public var waiting: Int { lock.withLock { waiters.count } }

    public func pass() async {
        await withCheckedContinuation { continuation in
            let passNow = lock.withLock {
                if !isOpen { waiters.append(continuation) }
                return isOpen
            }
            if passNow { continuation.resume() }
        }
    }

    public func close() { lock.withLock { isOpen = false } }

    public func open() {
        let released = lock.withLock {
            isOpen = true
            defer { waiters = [] }
            return waiters
        }
        for continuation in released { continuation.resume() }
    }
}

/// Hands out `FakePeerConnection`s and keeps them for inspection.
public final class FakePeerConnectionFactory: PeerConnectionFactory, @unchecked Sendable {
    private let lock = NSLock()
    private var made: [FakePeerConnection] = []
    private let name: String
    public private(set) var configurations: [PeerConnectionConfiguration] = []

    public init(name: String) { self.name = name }

    public var connections: [FakePeerConnection] { lock.withLock { made } }

    /// Whether its connections can hold media (as the GStreamer engine's can): set false to stand in
    /// for an engine that cannot, whose calls then connect after the answer.
    public var canHoldMedia: Bool {
        get { lock.withLock { holds } }
        set { lock.withLock { holds = newValue } }
    }
    private var holds = true

    private var held = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    /// Peer connections asked for from now on are made only after `releaseCreation()`, as a slow
    /// engine would make them (a real one generates a certificate, starts a pipeline).
    public func holdCreation() { lock.withLock { held = true } }

    public func releaseCreation() {
        let released = lock.withLock {
            held = false
            defer { waiting = [] }
            return waiting
        }
        for continuation in released { continuation.resume() }
    }

    public func makePeerConnection(_ configuration: PeerConnectionConfiguration) async throws -> any PeerConnection {
        await withCheckedContinuation { continuation in
            let wait = lock.withLock {
                if held { waiting.append(continuation) }
                return held
            }
            if !wait { continuation.resume() }
        }
        return lock.withLock {
            let peer = FakePeerConnection(name: "\(name)-\(made.count)", holdsMedia: configuration.holdsMedia)
            made.append(peer)
            configurations.append(configuration)
            return peer
        }
    }
}
