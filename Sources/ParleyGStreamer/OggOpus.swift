import CParleyGst
import Foundation

/// Reads the Ogg/Opus files the engine records (`CallRecorder`): decoded by GStreamer to PCM, as a
/// listener's player would, for tests and `parley` to look into.
public enum OggOpus {
    public static func read(_ url: URL) throws -> WAV.Audio {
        guard FileManager.default.isReadableFile(atPath: url.path) else {
            throw MediaEngineError(.pipeline, "cannot read \(url.path)")
        }
        guard parley_gst_init() == 0 else { throw MediaEngineError(.missingPlugins, "GStreamer would not start") }
        let wav = FileManager.default.temporaryDirectory.appendingPathComponent("parley-ogg-\(UUID().uuidString).wav")
        defer { try? FileManager.default.removeItem(at: wav) }
        let description = "filesrc location=\(PipelineDescription.quoted(url.path)) ! oggdemux ! opusdec ! audioconvert"
            + " ! audio/x-raw,format=S16LE ! wavenc ! filesink location=\(PipelineDescription.quoted(wav.path))"
        var error: UnsafeMutablePointer<CChar>?
        guard let pipeline = parley_pipeline_new(description, &error) else {
            throw MediaEngineError(.pipeline, GStreamerPeerConnection.take(error) ?? "the decoder could not be built")
        }
        defer { parley_object_unref(pipeline) }
        guard parley_element_set_state_playing(pipeline) == 0 else {
            parley_element_stop(pipeline)
            throw MediaEngineError(.pipeline, "\(url.path) is not an Ogg/Opus file")
        }
        let status = parley_pipeline_wait_eos(pipeline, 30_000, &error)
        parley_element_stop(pipeline)
        guard status == 0 else {
            throw MediaEngineError(.pipeline, "\(url.path): \(GStreamerPeerConnection.take(error) ?? "could not be decoded")")
        }
        return try WAV.read(wav)
    }
}
