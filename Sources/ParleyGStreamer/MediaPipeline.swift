import CParleyGst

/// Runs a plain GStreamer pipeline for a while: offline audio processing, probes, tests.
enum MediaPipeline {
    static func run(_ description: String, for duration: Duration) async throws {
        try GStreamerEngine.initialize()
        var error: UnsafeMutablePointer<CChar>?
        guard let pipeline = parley_pipeline_new(description, &error) else {
            throw MediaEngineError(.pipeline, GStreamerPeerConnection.take(error) ?? "the pipeline could not be built")
        }
        defer {
            parley_element_stop(pipeline)
            parley_object_unref(pipeline)
        }
        guard parley_element_set_state_playing(pipeline) == 0 else { throw MediaEngineError(.pipeline, "the pipeline would not start") }
        try await Task.sleep(for: duration)
    }
}
