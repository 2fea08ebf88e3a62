/// The gst-launch descriptions of a peer connection's pipeline. Kept as text so a test or a reader
/// can see the whole media path at once.
enum PipelineDescription {
    /// What browsers offer for Opus and VP8. webrtcbin 1.22 answers with the payload type of the
    /// sending chain, so an offer that numbers Opus otherwise gets a rejected audio section.
    static let opusPayloadType = 111
    static let vp8PayloadType = 96

    /// webrtcbin with the send chains linked into it.
    static func sender(_ configuration: MediaEngineConfiguration, video: Bool) -> String {
        var parts = [
            "webrtcbin name=webrtc bundle-policy=max-bundle latency=\(configuration.jitterBufferMs)",
            audioInput(configuration)
                + " ! volume name=microphone"
                + " ! opusenc name=opusenc audio-type=voice bitrate=\(configuration.opusBitrate) inband-fec=true"
                + " packet-loss-percentage=5 dtx=\(configuration.dtx) frame-size=20"
                + " ! rtpopuspay name=opuspay pt=\(opusPayloadType) ! queue"
                + " ! application/x-rtp,media=audio,encoding-name=OPUS,clock-rate=48000,payload=\(opusPayloadType) ! webrtc.",
        ]
        if video {
            let v = configuration.video
            parts.append("videotestsrc is-live=true pattern=ball ! video/x-raw,width=\(v.width),height=\(v.height),framerate=\(v.framesPerSecond)/1"
                + " ! videoconvert ! queue ! vp8enc deadline=1 cpu-used=8 keyframe-max-dist=60 target-bitrate=\(v.bitrateKbps * 1000)"
                + " ! rtpvp8pay pt=\(vp8PayloadType) ! queue"
                + " ! application/x-rtp,media=video,encoding-name=VP8,clock-rate=90000,payload=\(vp8PayloadType) ! webrtc.")
        }
        if configuration.output == .device {
            // The speaker path exists from the start so the echo canceller finds its probe.
            parts.append("audiotestsrc is-live=true wave=silence ! audiomixer name=playback ! audioconvert ! audioresample"
                + (configuration.processesVoice ? " ! webrtcechoprobe" : "") + " ! autoaudiosink")
        }
        return parts.joined(separator: "  ")
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
            let file = "filesrc location=\(quoted(url.path)) ! wavparse ! audioconvert ! audioresample ! audio/x-raw,rate=48000,channels=1 ! inputmix. "
            let looped = loop ? "multifilesrc location=\(quoted(url.path)) loop=true ! wavparse ignore-length=true ! audioconvert ! audioresample ! audio/x-raw,rate=48000,channels=1 ! inputmix. " : file
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
            let decode = "rtpopusdepay ! opusdec plc=true ! audioconvert ! audioresample"
                + " ! audio/x-raw,format=S16LE,rate=48000,channels=1 ! volume name=speaker ! identity name=received"
            return output == .device ? decode : decode + " ! fakesink sync=false async=false"
        case "video":
            return "rtpvp8depay ! vp8dec ! videoconvert ! identity name=receivedvideo ! fakesink sync=false async=false"
        default:
            return nil
        }
    }

    static func quoted(_ path: String) -> String {
        "\"" + path.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }
}
