import ParleyKit

/// The gst-launch descriptions of a peer connection's pipeline. Kept as text so a test or a reader
/// can see the whole media path at once.
enum PipelineDescription {
    /// What our offers number Opus and VP8 with, as browsers do; an answer takes the offer's.
    static let opusPayloadType = 111
    static let vp8PayloadType = 96

    /// webrtcbin, and the speaker path when audio plays to a device. The send chains join later,
    /// once the payload types are known (`audioSender`, `videoSender`).
    static func base(_ configuration: MediaEngineConfiguration) -> String {
        var parts = ["webrtcbin name=webrtc bundle-policy=max-bundle latency=\(configuration.jitterBufferMs)"]
        if configuration.output == .device {
            // The speaker path exists from the start so the echo canceller finds its probe.
            parts.append("audiotestsrc is-live=true wave=silence ! audiomixer name=playback ! audioconvert ! audioresample"
                + (configuration.processesVoice ? " ! webrtcechoprobe" : "") + " ! autoaudiosink")
        }
        return parts.joined(separator: "  ")
    }

    static let audioCaps = "audiocaps"
    /// Where a played file's audio enters the audio send chain's mixer (`AudioInput.file`).
    static let playedFile = "playedfile"
    /// The video send chain's last element.
    static let videoCaps = "videocaps"

    /// The SSRC a send chain uses, fixed in its caps so the SDP announces the one the packets carry
    /// (Janus drops packets whose SSRC the SDP did not announce).
    static func randomSSRC() -> UInt32 { UInt32.random(in: 1...UInt32.max) }
    /// The RTP header extension id of the audio level (`audioLevelIndication`).
    static let audioLevelExtensionID: UInt32 = 1

    /// The audio send chain, ending in RTP with Opus as `payloadType`; `muted` until told otherwise.
    /// The encoder starts as `encoding` says (the bitrate controller's latest setting, or its start:
    /// no FEC and no expected loss until loss is seen, so a clean call spends every bit on speech).
    static func audioSender(_ configuration: MediaEngineConfiguration, payloadType: Int, muted: Bool = false,
                            encoding: BitrateController.Setting? = nil) -> String {
        let bitrate = encoding.map { Int($0.bitrateKbps * 1000) } ?? configuration.opusBitrate
        return audioInput(configuration)
            + " ! volume name=microphone mute=\(muted) ! audio/x-raw,format=S16LE,rate=48000,channels=1 ! identity name=sent"
            + (configuration.audioLevelIndication ? " ! level audio-level-meta=true post-messages=false" : "")
            + " ! opusenc name=opusenc audio-type=voice bitrate=\(bitrate) inband-fec=\(encoding?.fec ?? false)"
            + " packet-loss-percentage=\(encoding?.expectedLossPct ?? 0) dtx=\(configuration.dtx) frame-size=\(encoding?.frameMs ?? 20)"
            + " ! rtpopuspay pt=\(payloadType) ! queue"
            + " ! capsfilter name=\(audioCaps) caps=\"application/x-rtp,media=audio,encoding-name=OPUS,clock-rate=48000,encoding-params=(string)2,useinbandfec=(string)1,minptime=(string)10,payload=\(payloadType),ssrc=(uint)\(randomSSRC())\""
    }

    /// The video send chain: a moving test pattern in VP8 as `payloadType`. The `camera` valve
    /// drops every frame while the call is held (`held`: how it starts).
    static func videoSender(_ configuration: MediaEngineConfiguration, payloadType: Int, held: Bool = false) -> String {
        let v = configuration.video
        let source = v.solidColor.map { String(format: "videotestsrc is-live=true pattern=solid-color foreground-color=0xff%06x", $0) }
            ?? "videotestsrc is-live=true pattern=ball" + (v.background.map { String(format: " background-color=0xff%06x", $0) } ?? "")
        return source + " ! video/x-raw,width=\(v.width),height=\(v.height),framerate=\(v.framesPerSecond)/1"
            + " ! videoconvert ! valve name=camera drop=\(held) ! queue ! vp8enc deadline=1 cpu-used=8 keyframe-max-dist=60 target-bitrate=\(v.bitrateKbps * 1000)"
            + " ! rtpvp8pay pt=\(payloadType) ! queue"
            + " ! capsfilter name=\(videoCaps) caps=\"application/x-rtp,media=video,encoding-name=VP8,clock-rate=90000,payload=\(payloadType),ssrc=(uint)\(randomSSRC())\""
    }

    /// The audio source up to 48 kHz mono raw audio, voice processing included.
    static func audioInput(_ configuration: MediaEngineConfiguration) -> String {
        let source: String
        switch configuration.input {
        case .tone(let hertz):
            source = "audiotestsrc is-live=true wave=sine freq=\(hertz) volume=0.3"
        case .silence:
            source = "audiotestsrc is-live=true wave=silence"
        case .device:
            source = "autoaudiosrc"
        case .file(let url, let loop):
            // A live silent bed keeps the stream going (and timed) after a file played once ends.
            // The file waits at `playedFile` for the call to connect (`parley_send_from_connection`).
            let file = "filesrc location=\(quoted(url.path)) ! wavparse ! audioconvert ! audioresample ! capsfilter name=\(playedFile) caps=audio/x-raw,rate=48000,channels=1 ! inputmix. "
            let looped = loop ? "multifilesrc location=\(quoted(url.path)) loop=true ! wavparse ignore-length=true ! audioconvert ! audioresample ! capsfilter name=\(playedFile) caps=audio/x-raw,rate=48000,channels=1 ! inputmix. " : file
            source = looped + " audiotestsrc is-live=true wave=silence ! audiomixer name=inputmix"
        }
        var chain = source + " ! audioconvert ! audioresample ! audio/x-raw,rate=48000,channels=1"
        if configuration.processesVoice {
            let echo = configuration.output == .device && configuration.input == .device
            chain += " ! audioconvert ! audio/x-raw,format=S16LE ! webrtcdsp name=dsp echo-cancel=\(echo) noise-suppression=true"
                + " noise-suppression-level=high gain-control=true ! audioconvert"
        }
        return chain
    }

    /// What plays or records one received stream; its sink pad links to webrtcbin's src pad.
    static func receiver(media: String, output: AudioOutputSink) -> String? {
        switch media {
        case "audio":
            // A lost packet (the jitter buffer's gap event, made exact at `depay`) is rebuilt from the
            // next packet's in-band FEC when it carries some, else concealed, so what plays keeps the
            // call's timeline.
            let decode = "rtpopusdepay name=depay ! opusdec plc=true use-inband-fec=true ! audioconvert ! audioresample"
                + " ! audio/x-raw,format=S16LE,rate=48000,channels=1 ! volume name=speaker ! identity name=received"
            return output == .device ? decode : decode + " ! fakesink sync=false async=false"
        case "video":
            // RGB, so the tap can tell what picture arrived.
            return "rtpvp8depay ! vp8dec ! videoconvert ! video/x-raw,format=RGB ! identity name=receivedvideo ! fakesink sync=false async=false"
        default:
            return nil
        }
    }

    static func quoted(_ path: String) -> String {
        "\"" + path.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }
}
