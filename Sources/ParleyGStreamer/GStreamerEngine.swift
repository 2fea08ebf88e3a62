import CParleyGst
import Foundation
import Logging
import ParleyKit
import ParleyProtocol

/// Why the media engine could not do what was asked.
public struct MediaEngineError: Error, Hashable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        let name: String
        public var description: String { name }
        /// GStreamer or one of the plugins Parley needs is not installed.
        public static let missingPlugins = Code(name: "missing-plugins")
        /// A pipeline could not be built or started.
        public static let pipeline = Code(name: "pipeline")
        /// webrtcbin refused an offer, answer or candidate.
        public static let negotiation = Code(name: "negotiation")
        /// The peer connection is closed.
        public static let closed = Code(name: "closed")
        /// The engine does not do this yet.
        public static let unsupported = Code(name: "unsupported")
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }
}

/// The Linux media engine: peer connections on GStreamer's webrtcbin.
///
/// Creating the engine initialises GStreamer, checks that every plugin a call needs is installed,
/// and generates the process's DTLS certificate in the background so the first call does not
/// wait for it.
public final class GStreamerEngine: PeerConnectionFactory {
    /// The Debian packages that provide what the engine needs.
    public static let debianPackages = ["gstreamer1.0-plugins-base", "gstreamer1.0-plugins-good", "gstreamer1.0-plugins-bad", "gstreamer1.0-nice"]
    /// How many DTLS handshakes in this process got Parley's retransmission timer: 150 ms first,
    /// doubling to 2.4 s, where GStreamer leaves OpenSSL's 1 s, 2, 4, 8 s (`parley_dtls_timer.c`).
    public static var dtlsHandshakesWithShortTimer: UInt { UInt(parley_dtls_timers_set()) }

    /// The DTLS retransmission timer that follows `timer` (nil: the first), as the handshake uses it.
    static func dtlsTimer(after timer: Duration?) -> Duration {
        let microseconds = timer.map { UInt32($0.components.seconds * 1_000_000 + $0.components.attoseconds / 1_000_000_000_000) } ?? 0
        return .microseconds(Int(parley_dtls_next_timer_us(microseconds)))
    }

    /// How webrtcbin's libnice agents nominate the candidate pair they send on.
    public enum ICENomination: Sendable {
        /// Every check carries USE-CANDIDATE, so the first check that succeeds nominates its pair
        /// (RFC 5245 §8.1.1.2; a pair of higher priority that succeeds later may still take over):
        /// ICE connects, and DTLS starts, one round trip sooner. Parley's default.
        case aggressive
        /// A pair that answered is checked once more with USE-CANDIDATE (RFC 8445 §8.1.1), as
        /// webrtcbin asks of libnice: one round trip later.
        case regular
    }

    /// The nomination of every libnice agent made from now on in this process (libnice takes it
    /// when an agent is made: set it before the calls whose agents it is for). Parley wraps
    /// libnice's constructor for it (`parley_ice_nomination.c`), as it wraps `SSL_new`.
    public static var iceNomination: ICENomination {
        get { parley_ice_regular_nomination() != 0 ? .regular : .aggressive }
        set { parley_ice_set_regular_nomination(newValue == .regular ? 1 : 0) }
    }

    /// How many libnice agents this process made through Parley's wrapper, and how many of them
    /// nominate aggressively: none made means the executable does not export `nice_agent_new_full`
    /// and webrtcbin's agents nominate as webrtcbin asks (regular).
    public static var iceAgents: (made: UInt, nominatingAggressively: UInt) {
        (UInt(parley_ice_agents_made()), UInt(parley_ice_agents_nominating_aggressively()))
    }

    public static let requiredElements = "webrtcbin nicesrc nicesink dtlssrtpenc dtlssrtpdec sctpenc sctpdec rtpbin opusenc opusdec "
        + "rtpopuspay rtpopusdepay audiotestsrc audioconvert audioresample audiomixer volume identity fakesink filesrc "
        + "multifilesrc wavparse queue appsrc oggmux filesink"
    public static let videoElements = "videotestsrc videoconvert vp8enc vp8dec rtpvp8pay rtpvp8depay"
    public static let voiceElements = "webrtcdsp webrtcechoprobe autoaudiosrc autoaudiosink"

    public let configuration: MediaEngineConfiguration
    /// Every peer connection this engine makes, as it is made (for data channels and taps). Only the
    /// newest few wait for a reader, so an app that never reads holds no closed calls.
    public let peerConnections: AsyncStream<GStreamerPeerConnection>
    private let created: AsyncStream<GStreamerPeerConnection>.Continuation
    private let logger: Logger
    private let counter = Counter()

    public init(configuration: MediaEngineConfiguration = MediaEngineConfiguration(), logger: Logger) throws {
        try Self.initialize()
        var needed = Self.requiredElements
        if configuration.processesVoice || configuration.input == .device || configuration.output == .device {
            needed += " " + Self.voiceElements
        }
        try Self.check(needed)
        self.configuration = configuration
        self.logger = logger
        (peerConnections, created) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(4))
        Self.warmUp()
    }

    deinit { created.finish() }

    /// Its send chains can wait with their sources stopped (`PeerConnectionConfiguration.holdsMedia`).
    public var canHoldMedia: Bool { true }

    public func makePeerConnection(_ connection: PeerConnectionConfiguration) async throws -> any PeerConnection {
        if connection.media.video { try Self.check(Self.videoElements) }
        var configuration = self.configuration
        if case .file(let url) = configuration.output {
            // One recording per call: the second and later calls of this engine get a numbered file
            // (a call's connections share its number: only the one whose media starts writes it).
            let index = counter.next(for: connection.call)
            if index > 1 {
                let base = url.deletingPathExtension().path
                configuration.output = .file(URL(fileURLWithPath: "\(base)-\(index).\(url.pathExtension.isEmpty ? "wav" : url.pathExtension)"))
            }
        }
        let peer = try GStreamerPeerConnection(configuration: configuration, connection: connection, logger: logger)
        created.yield(peer)
        return peer
    }

    // MARK: Process-wide set-up

    private static let initialization: Bool = parley_gst_init() == 0
    private static let warmingUp = WarmUp()
    private static let dtlsWarmUp: Void = {
        Thread.detachNewThread {
            parley_gst_warm_dtls()
            warmingUp.finish()
        }
    }()

    /// Waits (up to `timeout`) for the certificate warm-up: a process must not exit while OpenSSL
    /// is still generating the key on another thread.
    public static func finishWarmUp(timeout: Duration = .seconds(3)) async {
        let deadline = ContinuousClock.now + timeout
        while warmingUp.running, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(5)) }
    }

    /// Initialises GStreamer once per process.
    public static func initialize() throws {
        guard initialization else {
            throw MediaEngineError(.missingPlugins, "GStreamer could not be initialised; install: apt-get install \(debianPackages.joined(separator: " "))")
        }
    }

    /// Throws when an element in `names` (space separated) is not installed.
    public static func check(_ names: String) throws {
        try initialize()
        guard let missing = parley_gst_missing_elements(names) else { return }
        defer { parley_free(missing) }
        throw MediaEngineError(.missingPlugins, "GStreamer elements missing: \(String(cString: missing)); install: apt-get install \(debianPackages.joined(separator: " "))")
    }

    /// When GStreamer's leaks tracer is on (`GST_TRACERS=leaks`), shuts GStreamer down so the tracer
    /// reports every object still alive. Call at process exit, after every peer connection closed.
    public static func shutDownForLeakCheck() {
        guard ProcessInfo.processInfo.environment["GST_TRACERS"]?.contains("leaks") == true, initialization else { return }
        parley_gst_deinit()
    }

    /// Generates the DTLS certificates on a background thread: Parley's ECDSA P-256 one, and the RSA
    /// one GStreamer's dtlsdec makes on first use regardless (100–750 ms of key generation).
    public static func warmUp() { _ = dtlsWarmUp }

    /// The fingerprint of the process's DTLS certificate, as `a=fingerprint` carries it ("sha-256 AB:…");
    /// nil if OpenSSL could not make one, and webrtcbin's own (RSA) is used.
    public static var dtlsFingerprint: String? { parley_dtls_certificate_fingerprint().map { String(cString: $0) } }
}

final class WarmUp: @unchecked Sendable {
    private let lock = NSLock()
    private var done = false
    var running: Bool { lock.withLock { !done } }
    func finish() { lock.withLock { done = true } }
}

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var value = 0
    private var numbers: [CallID: Int] = [:]
    func next() -> Int { lock.withLock { value += 1; return value } }

    /// The number of `call` (the next for a call not seen before; the next number if none).
    func next(for call: CallID?) -> Int {
        lock.withLock {
            if let call, let known = numbers[call] { return known }
            value += 1
            if let call { numbers[call] = value }
            return value
        }
    }
}
