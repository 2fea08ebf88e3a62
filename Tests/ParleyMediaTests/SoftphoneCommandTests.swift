import Foundation
import ParleyGStreamer
import ParleyLocalServices
import ParleyServerTesting
import Testing

/// The `parley` softphone commands as people run them: separate processes, real media.
@Suite("parley demo, call and listen", .serialized, .timeLimit(.minutes(5)))
struct SoftphoneCommandTests {
    static var executable: URL? {
        let directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
        let candidate = directory.appendingPathComponent("parley")
        return FileManager.default.isExecutableFile(atPath: candidate.path) ? candidate : nil
    }

    struct Run {
        var status: Int32
        var output: String
        var errors: String
    }

    static func start(_ arguments: [String], environment: [String: String] = [:]) throws -> (Process, Pipe, Pipe) {
        let process = Process()
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        guard let executable else { throw TestFailure("swift build --build-tests builds the parley executable") }
        process.executableURL = executable
        process.arguments = arguments
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        return (process, output, errors)
    }

    /// Reads both pipes at once, the errors on a thread of their own: read one after the other, a
    /// child that fills the second pipe (64 KiB; GStreamer's tracers write that much) blocks on it,
    /// never closes the first, and neither side moves again.
    static func finish(_ started: (Process, Pipe, Pipe)) -> Run {
        let (process, output, errors) = started
        let errorsRead = ReadToEnd(errors.fileHandleForReading)
        let out = output.fileHandleForReading.readDataToEndOfFile()
        let err = errorsRead.wait()
        process.waitUntilExit()
        return Run(status: process.terminationStatus, output: String(decoding: out, as: UTF8.self), errors: String(decoding: err, as: UTF8.self))
    }

    /// A file handle read to its end on a thread started for it (not a pool's, which a blocked
    /// reader could starve).
    final class ReadToEnd: @unchecked Sendable {  // `data` is written by the thread before `done` is signalled, read after
        private var data = Data()
        private let done = DispatchSemaphore(value: 0)

        init(_ handle: FileHandle) {
            let thread = Thread { [self] in
                data = handle.readDataToEndOfFile()
                done.signal()
            }
            thread.start()
        }

        func wait() -> Data {
            done.wait()
            return data
        }
    }

    static func run(_ arguments: [String], environment: [String: String] = [:]) throws -> Run {
        finish(try start(arguments, environment: environment))
    }

    /// Waits for the process on a thread of its own: blocking a cooperative thread can starve the
    /// in-process server the child talks to (two cores, two cooperative threads).
    static func finish(_ started: (Process, Pipe, Pipe)) async -> Run {
        return await withCheckedContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(returning: finish(started)) }
        }
    }

    static func run(_ arguments: [String], environment: [String: String] = [:]) async throws -> Run {
        await finish(try start(arguments, environment: environment))
    }

    /// A child that writes more than a pipe holds to its error output before it ends its output.
    @Test func finishReadsOutputAndErrorsAtOnce() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", "head -c 200000 /dev/zero | tr '\\0' x >&2; echo done"]
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let run = Self.finish((process, output, errors))
        #expect(run.status == 0)
        #expect(run.output == "done\n")
        #expect(run.errors.count == 200_000)
    }

    @Test func demoMakesARealCallAndChecksTheAudio() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-demo-test-\(UUID().uuidString.prefix(8))")
        defer { try? FileManager.default.removeItem(at: directory) }
        let result = try Self.run(["demo", "--seconds", "2", "--output", directory.path])
        #expect(result.status == 0, "\(result.output)\(result.errors)")
        #expect(result.output.contains("audio went both ways"))
        #expect(result.output.contains("time to first audio"))
        #expect(result.output.contains("MOS"))
        let heard = try WAV.read(directory.appendingPathComponent("heard-by-bob.wav"))
        #expect(AudioAnalysis.dominantFrequency(heard.mono(from: 0.5), sampleRate: heard.sampleRate) == 440)
    }

    /// GStreamer's leaks tracer lists every GStreamer object still alive when GStreamer shuts down
    /// after a call with audio and a data channel.
    @Test func aCallLeaksNoGStreamerObjects() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-leaks-\(UUID().uuidString.prefix(8))")
        defer { try? FileManager.default.removeItem(at: directory) }
        let result = try Self.run(["demo", "--seconds", "1", "--output", directory.path],
                                  environment: ["GST_TRACERS": "leaks", "GST_DEBUG": "GST_TRACER:7", "GST_DEBUG_NO_COLOR": "1"])
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("data channel: bob got"))
        #expect(result.errors.contains("object-alive.class"), "the leaks tracer ran")
        let alive = result.errors.split(separator: "\n").filter { $0.contains("object-alive,") }
            .compactMap { line in line.range(of: #"type-name=\(string\)[A-Za-z]+"#, options: .regularExpression).map { String(line[$0].dropFirst("type-name=(string)".count)) } }
        // The DTLS plugin keeps one agent with the process's default certificate for the process's lifetime.
        let leaked = alive.filter { $0 != "GstDtlsAgent" }
        #expect(leaked.isEmpty, "still alive after the call: \(leaked)")
    }

    @Test func callAndListenTalkThroughTheServer() async throws {
        let server = try await LiveServer.start()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-cli-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let listener = try Self.start(["listen", "--server", server.baseURL, "--as", "bob", "--play", "tone:660",
                                       "--record", directory.appendingPathComponent("bob.wav").path, "--once", "--answer", "auto"])
        defer { if listener.0.isRunning { listener.0.terminate() } }
        try await CallChecks.waitForSessions(1, on: [server.baseURL], "bob registers")
        let caller = try await Self.run(["call", "bob", "--server", server.baseURL, "--as", "alice", "--play", "tone:440",
                                   "--record", directory.appendingPathComponent("alice.wav").path, "--duration", "2"])
        let callee = await Self.finish(listener)
        #expect(caller.status == 0, "\(caller.output)\(caller.errors)")
        #expect(callee.status == 0, "\(callee.output)\(callee.errors)")
        #expect(caller.output.contains("call with bob ended: hung up"))
        #expect(callee.output.contains("incoming call from alice"))
        #expect(caller.output.contains("strongest tone 660 Hz"))
        #expect(callee.output.contains("strongest tone 440 Hz"))
        // Each side's recording of what it heard: the other's tone and not its own, in every tenth
        // of a second of the call (the summary's strongest tone would hold through a second of silence).
        for (name, present, absent) in [("alice.wav", 660.0, 440.0), ("bob.wav", 440.0, 660.0)] {
            let audio = try WAV.read(directory.appendingPathComponent(name))
            let seconds = Double(audio.samples.count) / Double(audio.sampleRate)
            #expect(seconds > 1.5, "\(name) is \(seconds) s long")
            let missing = CallRecordingTests.tenthsMissing(audio, channel: 0, present: [present], absent: [absent],
                                                           from: 0.5, to: seconds - 0.3)
            #expect(missing.isEmpty, "\(name): \(missing)")
        }
        try await server.stop()
    }

    /// `parley call --video` through the server: each side's summary says how many pictures came
    /// and that they moved (frames that differ from the one before; a frozen picture says so).
    @Test func aVideoCallBetweenTheCommandsShowsEachSideAMovingPicture() async throws {
        let server = try await LiveServer.start()
        let listener = try Self.start(["listen", "--server", server.baseURL, "--as", "bob", "--play", "tone:660", "--video", "--once", "--answer", "auto"])
        defer { if listener.0.isRunning { listener.0.terminate() } }
        try await CallChecks.waitForSessions(1, on: [server.baseURL], "bob registers")
        let caller = try await Self.run(["call", "bob", "--server", server.baseURL, "--as", "alice", "--play", "tone:440", "--video", "--duration", "3"])
        let callee = await Self.finish(listener)
        #expect(caller.status == 0, "\(caller.output)\(caller.errors)")
        #expect(callee.status == 0, "\(callee.output)\(callee.errors)")
        for (who, result) in [("alice", caller), ("bob", callee)] {
            let line = result.output.split(separator: "\n").first { $0.hasPrefix("  video ") }.map(String.init) ?? ""
            let frames = line.split(separator: " ").compactMap { Int($0) }.first ?? 0
            #expect(line.contains("the picture moving") && frames >= 30, "\(who): \(result.output)")
        }
        try await server.stop()
    }

    @Test func aDeclinedCallSaysSoOnBothSides() async throws {
        let server = try await LiveServer.start()
        let listener = try Self.start(["listen", "--server", server.baseURL, "--as", "bob", "--play", "silence", "--once", "--answer", "never"])
        defer { if listener.0.isRunning { listener.0.terminate() } }
        try await CallChecks.waitForSessions(1, on: [server.baseURL], "bob registers")
        let caller = try await Self.run(["call", "bob", "--server", server.baseURL, "--as", "alice", "--play", "silence"])
        let callee = await Self.finish(listener)
        #expect(caller.status == 2)
        #expect(caller.output.contains("call with bob ended: declined by the callee"), "\(caller.output)")
        #expect(callee.status == 0)
        #expect(callee.output.contains("declined"))
        try await server.stop()
    }

    /// Nothing listens on the port: the command says so at once, rather than after the tries a
    /// server that does not answer gets.
    @Test func callingWithTheServerDownFailsWithAClearMessage() throws {
        let server = "http://127.0.0.1:\(try freeTCPPort())"
        let started = ContinuousClock.now
        let result = try Self.run(["call", "bob", "--server", server, "--as", "alice", "--play", "silence"])
        #expect(result.status == 1)
        #expect(result.errors.contains("cannot reach the Parley server at \(server): connection refused"), "\(result.errors)")
        // Generous: it took the 20 s of tries before.
        #expect(ContinuousClock.now - started < .seconds(5))
    }

    @Test func callingAnOfflineUserExitsWithStatusTwo() async throws {
        let server = try await LiveServer.start()
        let result = try await Self.run(["call", "carol", "--server", server.baseURL, "--as", "alice", "--play", "silence"])
        #expect(result.status == 2)
        #expect(result.output.contains("carol is not online"))
        try await server.stop()
    }

    @Test func doctorChecksTheMachineAndTheServer() async throws {
        let server = try await LiveServer.start()
        let healthy = try await Self.run(["doctor", "--server", server.baseURL])
        #expect(healthy.status == 0, "\(healthy.output)")
        #expect(healthy.output.contains("✓ a loopback call"))
        #expect(healthy.output.contains("gives development tokens"))
        try await server.stop()
        let down = try await Self.run(["doctor", "--server", server.baseURL])
        #expect(down.status == 1)
        #expect(down.output.contains("✗ cannot reach the server"))
    }

    @Test func badArgumentsAreRefusedBeforeAnythingStarts() throws {
        let result = try Self.run(["call", "bob", "--play", "tone:abc"])
        #expect(result.status != 0)
        #expect(result.errors.contains("--play takes"))
    }
}
