import Foundation

/// What a call sends as audio.
public enum AudioInput: Hashable, Sendable {
    /// A sine tone.
    case tone(hertz: Double)
    /// A WAV file, played once (then silence) or looped, from when the call connects (ICE and DTLS).
    case file(URL, loop: Bool)
    case silence
    /// The default microphone (PulseAudio or ALSA), when the machine has one.
    case device

    /// Parses the CLI's `--play` values: `tone:440`, `silence`, `device`, `file.wav`, `loop:file.wav`.
    public init?(argument: String) {
        if argument == "silence" { self = .silence; return }
        if argument == "device" || argument == "mic" { self = .device; return }
        if argument.hasPrefix("tone:") {
            guard let hertz = Double(argument.dropFirst(5)), hertz > 0, hertz < 20_000 else { return nil }
            self = .tone(hertz: hertz)
            return
        }
        if argument == "tone" { self = .tone(hertz: 440); return }
        if argument.hasPrefix("loop:") {
            self = .file(URL(fileURLWithPath: String(argument.dropFirst(5))), loop: true)
            return
        }
        guard argument.lowercased().hasSuffix(".wav") else { return nil }
        self = .file(URL(fileURLWithPath: argument), loop: false)
    }

    /// Echo cancellation, noise suppression and gain control are on by default only for a real microphone.
    public var processesVoiceByDefault: Bool { self == .device }
}

/// Where a call's received audio goes.
public enum AudioOutputSink: Hashable, Sendable {
    /// A 16-bit 48 kHz mono WAV file.
    case file(URL)
    case null
    /// The default speaker.
    case device
}

public struct VideoInput: Hashable, Sendable {
    public var width = 320
    public var height = 240
    public var framesPerSecond = 15
    public var bitrateKbps = 300
    /// A still picture of this one colour (0xRRGGBB) instead of the moving test pattern: a frozen
    /// picture, for tests.
    public var solidColor: UInt32?
    /// The moving test pattern (a white ball) on this colour (0xRRGGBB) instead of black: tests
    /// tell which side's picture arrived by its colour, and that it moves.
    public var background: UInt32?
    public init() {}
}

/// The average colour of a decoded video frame, 0–255 a channel.
public struct FrameColor: Hashable, Sendable {
    public var red: Int
    public var green: Int
    public var blue: Int

    public init(red: Int, green: Int, blue: Int) {
        self.red = red
        self.green = green
        self.blue = blue
    }

    public init(rgb: UInt32) {
        self.init(red: Int(rgb >> 16 & 0xff), green: Int(rgb >> 8 & 0xff), blue: Int(rgb & 0xff))
    }

    /// Whether every channel is within `tolerance` of `other`'s (video coding shifts colours a little).
    public func isClose(to other: FrameColor, tolerance: Int = 40) -> Bool {
        abs(red - other.red) <= tolerance && abs(green - other.green) <= tolerance && abs(blue - other.blue) <= tolerance
    }
}

/// A data channel a peer connection opens as soon as it is created (before the first offer, so
/// the offer carries the SCTP association).
public struct DataChannelSpec: Hashable, Sendable {
    public var label: String
    public var ordered: Bool
    /// nil: reliable; otherwise partial reliability with at most this many retransmissions.
    public var maxRetransmits: Int?

    public init(label: String, ordered: Bool = true, maxRetransmits: Int? = nil) {
        self.label = label
        self.ordered = ordered
        self.maxRetransmits = maxRetransmits
    }
}

/// How the GStreamer engine builds peer connections.
public struct MediaEngineConfiguration: Hashable, Sendable {
    public var input: AudioInput = .tone(hertz: 440)
    public var output: AudioOutputSink = .null
    /// nil: on for the microphone, off for tones and files.
    public var voiceProcessing: Bool?
    /// Sent when the call asks for video: a moving test pattern.
    public var video = VideoInput()
    /// Only these local addresses take part in ICE (loopback included when named); empty: every
    /// non-loopback interface, as libnice does by default.
    public var localAddresses: [String] = []
    /// The receive jitter buffer's shortest latency: what first audio waits. It grows with the
    /// jitter measured during the call (`adaptiveJitterBuffer`).
    public var jitterBufferMs = 50
    /// The shortest interval between RTCP reports. Receiver reports carry loss and round trip to the
    /// far side's encoder; RFC 3550's 5 s default leaves a call deaf to a worse network for seconds.
    public var rtcpIntervalMs = 1_000
    /// How the jitter buffer follows the network; nil keeps it at `jitterBufferMs`.
    public var adaptiveJitterBuffer: JitterBufferController.Configuration? = JitterBufferController.Configuration()
    /// Ask for lost packets again (RTCP NACK) and answer such asks (RTX, RFC 4588), audio included.
    /// Chromium leaves NACK off for audio; on a path whose round trip fits in the jitter buffer a
    /// retransmission restores what FEC cannot (docs/quality.md has what it was measured to do).
    /// Off: with it on, a Chromium callee of a Parley offer never reached an active call (not yet
    /// understood), and at 20 % loss the retransmissions cost more than they repair.
    public var retransmission = false
    /// How often ICE sends a connectivity check (RFC 8445's Ta, at least 5 ms for media).
    public var icePacingMs = 5
    /// Host TCP candidates (ICE-TCP, RFC 6544). Off: media goes over UDP, or through TURN where UDP
    /// cannot pass. With them on, libnice nominated a TCP pair when lost UDP checks let a TCP check
    /// answer first (2 of 36 calls at 10 % loss); TCP then retransmitted every lost packet, late,
    /// behind a growing queue — a voice call wants the loss instead (docs/quality.md).
    public var iceTCP = false
    public var opusBitrate = 32_000
    /// Discontinuous transmission: no packets during silence.
    public var dtx = false
    /// Send each packet's audio level (RFC 6464, `ssrc-audio-level`, extension id 1) for a mixer's
    /// talking detection (Janus AudioBridge). Only for offers this engine makes.
    public var audioLevelIndication = false
    public var dataChannels: [DataChannelSpec] = []
    /// What our own offers number Opus with (tests use it to play a peer that numbers it otherwise).
    var opusOfferPayloadType = PipelineDescription.opusPayloadType

    public init() {}

    var processesVoice: Bool { voiceProcessing ?? input.processesVoiceByDefault }
}
