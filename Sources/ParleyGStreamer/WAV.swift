import Foundation

/// 16-bit PCM WAV files: what the engine records, and what tests and `parley demo` read back.
public enum WAV {
    public struct Audio: Sendable {
        public var sampleRate: Int
        public var channels: Int
        /// Interleaved samples, -1…1.
        public var samples: [Float]

        public init(sampleRate: Int, channels: Int, samples: [Float]) {
            self.sampleRate = sampleRate
            self.channels = channels
            self.samples = samples
        }

        public var duration: Double { Double(samples.count / max(channels, 1)) / Double(sampleRate) }

        /// The first channel from `start` for `length` seconds.
        public func mono(from start: Double = 0, length: Double? = nil) -> [Float] {
            channel(0, from: start, length: length)
        }

        /// Channel `index` (0 is the left) from `start` for `length` seconds.
        public func channel(_ index: Int, from start: Double = 0, length: Double? = nil) -> [Float] {
            guard index < channels else { return [] }
            let first = max(0, Int(start * Double(sampleRate)))
            let total = samples.count / max(channels, 1)
            let last = length.map { min(total, first + Int($0 * Double(sampleRate))) } ?? total
            guard first < last else { return [] }
            return (first..<last).map { samples[$0 * channels + index] }
        }
    }

    public struct FormatError: Error, CustomStringConvertible {
        public var description: String
    }

    public static func read(_ url: URL) throws -> Audio {
        try decode(Data(contentsOf: url), name: url.path)
    }

    /// Reads a WAV file's bytes; `name` says which file in errors.
    public static func decode(_ data: Data, name: String) throws(FormatError) -> Audio {
        let data = data.startIndex == 0 ? data : Data(data)  // a slice keeps its parent's indices
        func u32(_ at: Int) -> Int { Int(data[at]) | Int(data[at + 1]) << 8 | Int(data[at + 2]) << 16 | Int(data[at + 3]) << 24 }
        func u16(_ at: Int) -> Int { Int(data[at]) | Int(data[at + 1]) << 8 }
        guard data.count >= 12, data.prefix(4) == Data("RIFF".utf8), data[8..<12] == Data("WAVE".utf8) else {
            throw FormatError(description: "\(name) is not a WAV file")
        }
        var offset = 12
        var rate = 0, channels = 0, bits = 0
        while offset + 8 <= data.count {
            let id = String(decoding: data[offset..<offset + 4], as: UTF8.self)
            var size = u32(offset + 4)
            let body = offset + 8
            if id == "fmt " {
                // A format chunk is 16 bytes at least; a file cut inside it has no format.
                guard size >= 16, body + 16 <= data.count else { throw FormatError(description: "\(name): its format chunk is cut short") }
                channels = u16(body + 2)
                rate = u32(body + 4)
                bits = u16(body + 14)
            } else if id == "data" {
                guard bits == 16, channels > 0 else { throw FormatError(description: "\(name): only 16-bit PCM is read") }
                guard rate > 0 else { throw FormatError(description: "\(name): its sample rate is 0") }
                // A recording cut short (size 0 or too large) still reads up to the end of the file.
                if size == 0 || body + size > data.count { size = data.count - body }
                let count = size / 2
                var samples = [Float](repeating: 0, count: count)
                data.withUnsafeBytes { raw in
                    for i in 0..<count {
                        let value = Int16(bitPattern: UInt16(raw[body + 2 * i]) | UInt16(raw[body + 2 * i + 1]) << 8)
                        samples[i] = Float(value) / 32768
                    }
                }
                return Audio(sampleRate: rate, channels: channels, samples: samples)
            }
            offset = body + size + (size & 1)
        }
        throw FormatError(description: "\(name) has no audio data")
    }

    /// Writes samples as 16-bit PCM.
    public static func write(_ audio: Audio, to url: URL) throws {
        let writer = try Writer(url: url, sampleRate: audio.sampleRate, channels: audio.channels)
        var bytes = Data(capacity: audio.samples.count * 2)
        for sample in audio.samples {
            let value = Int16(max(-1, min(1, sample)) * 32767)
            withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
        }
        writer.append(bytes)
        writer.close()
    }

    /// Appends 16-bit little-endian PCM to a WAV file and fixes the header sizes on close.
    /// Safe to use from GStreamer's streaming thread.
    public final class Writer: @unchecked Sendable {
        public let url: URL
        private let handle: FileHandle
        private let lock = NSLock()
        private var dataBytes = 0
        private var closed = false

        public init(url: URL, sampleRate: Int, channels: Int) throws {
            self.url = url
            self.sampleRate = sampleRate
            self.channels = channels
            guard FileManager.default.createFile(atPath: url.path, contents: nil) else {
                throw FormatError(description: "cannot create \(url.path)")
            }
            handle = try FileHandle(forWritingTo: url)
            handle.write(Self.header(sampleRate: sampleRate, channels: channels, dataBytes: 0))
        }

        private let sampleRate: Int
        private let channels: Int

        public func append(_ pcm: Data) {
            lock.withLock {
                guard !closed else { return }
                handle.write(pcm)
                dataBytes += pcm.count
            }
        }

        public func close() {
            lock.withLock {
                guard !closed else { return }
                closed = true
                handle.seek(toFileOffset: 0)
                handle.write(Self.header(sampleRate: sampleRate, channels: channels, dataBytes: dataBytes))
                try? handle.close()
            }
        }

        deinit { close() }

        static func header(sampleRate: Int, channels: Int, dataBytes: Int) -> Data {
            var data = Data()
            func u32(_ v: Int) { withUnsafeBytes(of: UInt32(v).littleEndian) { data.append(contentsOf: $0) } }
            func u16(_ v: Int) { withUnsafeBytes(of: UInt16(v).littleEndian) { data.append(contentsOf: $0) } }
            data.append(contentsOf: Array("RIFF".utf8)); u32(36 + dataBytes)
            data.append(contentsOf: Array("WAVE".utf8))
            data.append(contentsOf: Array("fmt ".utf8)); u32(16); u16(1); u16(channels); u32(sampleRate)
            u32(sampleRate * channels * 2); u16(channels * 2); u16(16)
            data.append(contentsOf: Array("data".utf8)); u32(dataBytes)
            return data
        }
    }
}

/// Measurements on mono audio: loudness and the dominant tone.
public enum AudioAnalysis {
    /// Root mean square, 0…1.
    public static func rms(_ samples: [Float]) -> Double {
        guard !samples.isEmpty else { return 0 }
        var sum = 0.0
        samples.withUnsafeBufferPointer { buffer in  // a pointer: see `goertzel`
            guard var sample = buffer.baseAddress else { return }
            let end = sample + buffer.count
            while sample < end {
                sum += Double(sample.pointee) * Double(sample.pointee)
                sample += 1
            }
        }
        return (sum / Double(samples.count)).squareRoot()
    }

    /// dBFS of the RMS level (-120 for digital silence).
    public static func level(_ samples: [Float]) -> Double {
        let value = rms(samples)
        return value > 0 ? max(-120, 20 * log10(value)) : -120
    }

    /// The strongest frequency between `low` and `high` Hz (to the nearest hertz) in every half
    /// second of `samples`: that of the first half second if each whole half second after it has
    /// the same (within 2 Hz), nil if one is silent or carries another. A span shorter than a
    /// second is judged by its first half second. So a long span is judged all through, not by its start.
    public static func dominantFrequency(_ samples: [Float], sampleRate: Int, low: Double = 100, high: Double = 2000) -> Double? {
        let half = max(1, sampleRate / 2)
        guard samples.count >= 2 * half else { return strongestFrequency(samples, sampleRate: sampleRate, low: low, high: high) }
        var first: Double?
        for start in stride(from: 0, through: samples.count - half, by: half) {
            guard let found = strongestFrequency(Array(samples[start..<start + half]), sampleRate: sampleRate, low: low, high: high),
                  first.map({ abs($0 - found) <= 2 }) ?? true else { return nil }
            first = first ?? found
        }
        return first
    }

    /// Whether `samples` are quieter than `below` dBFS throughout. An empty span is not silent: it
    /// is audio that was never recorded (a receiver writes only what it decodes).
    public static func isSilent(_ samples: [Float], below: Double = -50) -> Bool {
        !samples.isEmpty && level(samples) < below
    }

    /// The strongest frequency of the first half second of `samples`, or nil for silence: a
    /// Goertzel scan in 10 Hz steps, refined around the best step.
    static func strongestFrequency(_ samples: [Float], sampleRate: Int, low: Double, high: Double) -> Double? {
        guard samples.count >= sampleRate / 20, rms(samples) > 0.001 else { return nil }
        // Every third sample of 48 kHz audio still carries tones up to 8 kHz, at a third of the work.
        let step = sampleRate >= 48_000 ? 3 : 1
        let rate = sampleRate / step
        let window = stride(from: 0, to: min(samples.count, sampleRate / 2), by: step).map { samples[$0] }
        func strongest(_ candidates: some Sequence<Double>) -> Double {
            var best = (frequency: low, power: -1.0)
            for frequency in candidates {
                let power = goertzel(window, frequency: frequency, sampleRate: rate)
                if power > best.power { best = (frequency, power) }
            }
            return best.frequency
        }
        let coarse = strongest(stride(from: low, through: high, by: 10))
        return strongest(stride(from: max(low, coarse - 10), through: min(high, coarse + 10), by: 1))
    }

    /// The amplitude (0…1) of a sine at `frequency` in `samples`: 0.3 for a tone of amplitude 0.3.
    public static func toneAmplitude(_ samples: [Float], frequency: Double, sampleRate: Int) -> Double {
        guard !samples.isEmpty else { return 0 }
        return 2 * goertzel(samples, frequency: frequency, sampleRate: sampleRate).squareRoot() / Double(samples.count)
    }

    /// The power at `frequency`. Walked with a pointer: the tests run debug builds, where an
    /// array's iterator is a call per sample and a recording's check took seconds.
    static func goertzel(_ samples: [Float], frequency: Double, sampleRate: Int) -> Double {
        let coefficient = 2 * cos(2 * Double.pi * frequency / Double(sampleRate))
        var s1 = 0.0, s2 = 0.0
        samples.withUnsafeBufferPointer { buffer in
            guard var sample = buffer.baseAddress else { return }
            let end = sample + buffer.count
            while sample < end {
                let s0 = Double(sample.pointee) + coefficient * s1 - s2
                s2 = s1
                s1 = s0
                sample += 1
            }
        }
        return s1 * s1 + s2 * s2 - coefficient * s1 * s2
    }
}
