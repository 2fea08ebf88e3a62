import CParleyGst
import Foundation
import ParleyKit

/// Lines up a call's two directions for its recording. What this side sends and what it receives
/// come in buffers of their own sizes on their own streaming threads; the mixer pairs them sample
/// by sample and hands out what both have covered, mixed into one channel or side by side in two.
///
/// A direction that stops (the far side's packets stop coming, the chain is rebuilt) must not stop
/// the recording: once the other runs more than `maxLagSamples` ahead, everything it holds goes out
/// against silence, so the stalled direction, when it comes back, is paired with what is said then
/// and not with what was said before it stalled.
struct RecordingMixer {
    let layout: RecordingLayout
    let maxLagSamples: Int
    private var local: [Int16] = []
    private var remote: [Int16] = []

    init(layout: RecordingLayout, maxLagSamples: Int = 48_000 * 3 / 10) {
        self.layout = layout
        self.maxLagSamples = maxLagSamples
    }

    var channels: Int { layout == .mixed ? 1 : 2 }

    /// Takes this side's samples; answers what is ready (interleaved when two channels).
    mutating func add(local samples: some Collection<Int16>) -> [Int16] {
        local.append(contentsOf: samples)
        return take()
    }

    /// Takes the far side's samples; answers what is ready.
    mutating func add(remote samples: some Collection<Int16>) -> [Int16] {
        remote.append(contentsOf: samples)
        return take()
    }

    /// The end: whatever one direction holds beyond the other, against silence.
    mutating func flush() -> [Int16] {
        let count = max(local.count, remote.count)
        return emit(count)
    }

    private mutating func take() -> [Int16] {
        let both = min(local.count, remote.count)
        let ahead = max(local.count, remote.count)
        return emit(ahead - both > maxLagSamples ? ahead : both)
    }

    private mutating func emit(_ count: Int) -> [Int16] {
        guard count > 0 else { return [] }
        var out = [Int16]()
        out.reserveCapacity(count * channels)
        for i in 0..<count {
            let mine = i < local.count ? local[i] : 0
            let theirs = i < remote.count ? remote[i] : 0
            switch layout {
            case .mixed:
                out.append(Int16(clamping: Int32(mine) + Int32(theirs)))
            case .twoChannels:
                out.append(mine)
                out.append(theirs)
            }
        }
        local.removeFirst(min(count, local.count))
        remote.removeFirst(min(count, remote.count))
        return out
    }
}

/// Records a call, both directions, to an Ogg/Opus file: the engine's taps hand it what is sent
/// (after mute and hold, so a muted microphone records as silence) and what is received (after the
/// jitter buffer and concealment, as played), and a pipeline of its own encodes them
/// (`appsrc ! opusenc ! oggmux ! filesink`), off the call's streaming threads.
final class CallRecorder: @unchecked Sendable {
    static let sampleRate = 48_000

    let path: String
    let layout: RecordingLayout
    /// Seconds from the call's media start to the recording's first sample.
    let startSeconds: Double
    private let pipeline: UnsafeMutableRawPointer
    private let source: UnsafeMutableRawPointer
    private let lock = NSLock()
    private var mixer: RecordingMixer
    private var frames = 0
    private var ended = false
    private var failure: String?

    /// Starts the recording at `path` (replacing a file there); `origin` is when the call's media started.
    init(path: String, layout: RecordingLayout, origin: ContinuousClock.Instant) throws {
        guard FileManager.default.createFile(atPath: path, contents: nil) else {
            throw MediaEngineError(.pipeline, "cannot write the call recording at \(path)")
        }
        self.path = path
        self.layout = layout
        mixer = RecordingMixer(layout: layout)
        let elapsed = ContinuousClock.now - origin
        startSeconds = max(0, Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
        let channels = mixer.channels
        let description = "appsrc name=source is-live=true format=time"
            + " caps=audio/x-raw,format=S16LE,layout=interleaved,rate=\(Self.sampleRate),channels=\(channels)"
            + " ! audioconvert ! opusenc bitrate=\(48_000 * channels) ! oggmux ! filesink location=\(PipelineDescription.quoted(path))"
        var error: UnsafeMutablePointer<CChar>?
        guard let pipeline = parley_pipeline_new(description, &error) else {
            throw MediaEngineError(.pipeline, GStreamerPeerConnection.take(error) ?? "the recorder could not be built")
        }
        guard let source = parley_bin_get(pipeline, "source") else {
            parley_object_unref(pipeline)
            throw MediaEngineError(.pipeline, "the recorder has no source")
        }
        guard parley_element_set_state_playing(pipeline) == 0 else {
            parley_object_unref(source)
            parley_object_unref(pipeline)
            throw MediaEngineError(.pipeline, "the recorder would not start")
        }
        self.pipeline = pipeline
        self.source = source
    }

    /// What this side sent: 16-bit mono at 48 kHz.
    func local(_ bytes: UnsafeRawPointer, count: Int) {
        add(bytes, count: count) { mixer, samples in mixer.add(local: samples) }
    }

    /// What this side received and played: 16-bit mono at 48 kHz.
    func remote(_ bytes: UnsafeRawPointer, count: Int) {
        add(bytes, count: count) { mixer, samples in mixer.add(remote: samples) }
    }

    private func add(_ bytes: UnsafeRawPointer, count: Int, _ mix: (inout RecordingMixer, UnsafeBufferPointer<Int16>) -> [Int16]) {
        let samples = UnsafeBufferPointer(start: bytes.assumingMemoryBound(to: Int16.self), count: count / 2)
        lock.withLock {
            guard !ended else { return }
            push(mix(&mixer, samples))
        }
    }

    /// Under the lock: one buffer, stamped by the samples written before it.
    private func push(_ interleaved: [Int16]) {
        guard !interleaved.isEmpty else { return }
        let count = interleaved.count / mixer.channels
        let pts = UInt64(frames) * 1_000_000_000 / UInt64(Self.sampleRate)
        let duration = UInt64(count) * 1_000_000_000 / UInt64(Self.sampleRate)
        let status = interleaved.withUnsafeBytes { parley_appsrc_push(source, $0.baseAddress, $0.count, pts, duration) }
        if status != 0, failure == nil { failure = "the recorder stopped taking audio" }
        frames += count
    }

    /// Ends the recording: the rest goes in, the file is finished and closed.
    func finish() throws -> CallRecordingFile {
        let seconds: Double = lock.withLock {
            if !ended { push(mixer.flush()) }
            ended = true
            return Double(frames) / Double(Self.sampleRate)
        }
        parley_appsrc_end(source)
        var error: UnsafeMutablePointer<CChar>?
        let status = parley_pipeline_wait_eos(pipeline, 5_000, &error)
        parley_element_stop(pipeline)
        parley_object_unref(source)
        parley_object_unref(pipeline)
        if status != 0 {
            throw MediaEngineError(.pipeline, "recording \(path): \(GStreamerPeerConnection.take(error) ?? "the recording did not finish")")
        }
        if let problem = lock.withLock({ failure }) { throw MediaEngineError(.pipeline, "recording \(path): \(problem)") }
        return CallRecordingFile(path: path, layout: layout, startSeconds: startSeconds, endSeconds: startSeconds + seconds)
    }
}
