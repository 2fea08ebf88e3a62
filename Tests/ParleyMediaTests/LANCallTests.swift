import Foundation
import ParleyGStreamer
import ParleyLocalServices
import ParleyWire
import Testing

/// Devices on one local network with no Parley server: each in a network namespace of its own, the
/// namespaces joined by a bridge, each with its own D-Bus system bus and Avahi daemon (as each
/// machine on a LAN has). `parley listen --lan`, `call --lan` and `lan` run there as processes.
final class LANLab: @unchecked Sendable {
    struct Device {
        var namespace: NetworkNamespace
        var address: String
        var bus: String
    }

    let directory: URL
    private(set) var devices: [Device] = []
    private let bridge: NetworkNamespace
    private var daemonPIDs: [pid_t] = []
    private var started: [Process] = []

    /// Makes `count` devices at 198.51.100.61, .62, …, on a thread outside Swift's cooperative
    /// pool: setting up waits for processes, which must not hold up the pool's two threads.
    static func make(devices count: Int) async throws -> LANLab {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(with: Result { try LANLab(devices: count) }) }
        }
    }

    private init(devices count: Int) throws {
        let tag = "\(getpid() % 10_000)"
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("parley-lan-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        bridge = try NetworkNamespace.create("parley-lbr\(tag)")
        do {
            try Self.ip(["-n", bridge.name, "link", "add", "br0", "type", "bridge"])
            try Self.ip(["-n", bridge.name, "link", "set", "br0", "up"])
            for index in 1...count {
                let namespace = try NetworkNamespace.create("parley-l\(index)-\(tag)")
                let address = "198.51.100.\(60 + index)"
                let folder = directory.appendingPathComponent("device\(index)")
                try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
                devices.append(Device(namespace: namespace, address: address, bus: "unix:path=\(folder.path)/bus"))
                try Self.ip(["-n", bridge.name, "link", "add", "port\(index)", "type", "veth", "peer", "name", "eth0", "netns", namespace.name])
                try Self.ip(["-n", bridge.name, "link", "set", "port\(index)", "master", "br0"])
                try Self.ip(["-n", bridge.name, "link", "set", "port\(index)", "up"])
                try Self.ip(["-n", namespace.name, "addr", "add", "\(address)/24", "dev", "eth0"])
                try Self.ip(["-n", namespace.name, "link", "set", "eth0", "up"])
                try startDaemons(index: index, folder: folder)
            }
        } catch {
            stop()
            throw error
        }
    }

    /// A system bus and an Avahi daemon for one device. Avahi keeps its PID file at a fixed path, so
    /// each daemon gets a private mount namespace with its own /run/avahi-daemon.
    private func startDaemons(index: Int, folder: URL) throws {
        let busConfiguration = folder.appendingPathComponent("bus.conf")
        try """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <type>system</type>
          <listen>unix:path=\(folder.path)/bus</listen>
          <auth>EXTERNAL</auth>
          <policy context="default"><allow user="*"/><allow own="*"/><allow send_destination="*"/><allow receive_sender="*"/></policy>
        </busconfig>
        """.write(to: busConfiguration, atomically: true, encoding: .utf8)
        let avahiConfiguration = folder.appendingPathComponent("avahi.conf")
        try """
        [server]
        host-name=parley-device\(index)
        use-ipv4=yes
        use-ipv6=no
        allow-interfaces=eth0
        enable-dbus=yes
        [wide-area]
        enable-wide-area=no
        [publish]
        publish-hinfo=no
        publish-workstation=no
        """.write(to: avahiConfiguration, atomically: true, encoding: .utf8)
        let device = devices[index - 1]
        let busLog = folder.appendingPathComponent("dbus.log")
        let bus = try Self.launch(["/usr/bin/dbus-daemon", "--config-file=\(busConfiguration.path)", "--fork", "--print-pid"], output: busLog)
        guard bus == 0,
              let busPID = (try? String(contentsOf: busLog, encoding: .utf8)).flatMap({ pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) else {
            throw TestFailure("dbus-daemon did not start: \((try? String(contentsOf: busLog, encoding: .utf8)) ?? "")")
        }
        daemonPIDs.append(busPID)
        // Avahi forks into the background once it is up (-D); its PID file lands in the lab's
        // folder, to stop it by PID.
        let run = folder.appendingPathComponent("run")
        try FileManager.default.createDirectory(at: run, withIntermediateDirectories: true)
        let script = "mkdir -p /run/avahi-daemon && mount --bind \(run.path) /run/avahi-daemon && "
            + "exec avahi-daemon -D -f \(avahiConfiguration.path) --no-drop-root --no-chroot --no-rlimits"
        let log = folder.appendingPathComponent("avahi.log")
        let starter = try Self.launch(device.namespace.command(["unshare", "-m", "sh", "-c", script]), output: log,
                                      environment: ["DBUS_SYSTEM_BUS_ADDRESS": device.bus])
        let pidFile = run.appendingPathComponent("pid")
        guard starter == 0,
              let pid = (try? String(contentsOf: pidFile, encoding: .utf8)).flatMap({ pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) else {
            throw TestFailure("avahi-daemon did not start: \((try? String(contentsOf: log, encoding: .utf8)) ?? "")")
        }
        daemonPIDs.append(pid)
    }

    /// Starts `parley` on device `index` (1-based), its output in a file of the lab.
    func start(on index: Int, _ arguments: [String], output name: String) throws -> (process: Process, output: URL) {
        guard let executable = SoftphoneCommandTests.executable else { throw TestFailure("swift build --build-tests builds parley") }
        let device = devices[index - 1]
        let output = directory.appendingPathComponent(name)
        let process = try Self.spawn(device.namespace.command([executable.path] + arguments), output: output,
                                     environment: ["DBUS_SYSTEM_BUS_ADDRESS": device.bus])
        started.append(process)
        return (process, output)
    }

    /// Runs `parley` on device `index` to its end; answers its status and output.
    func run(on index: Int, _ arguments: [String], output name: String) async throws -> (status: Int32, output: String) {
        let (process, output) = try start(on: index, arguments, output: name)
        await Self.wait(for: process)
        return (process.terminationStatus, (try? String(contentsOf: output, encoding: .utf8)) ?? "")
    }

    static func wait(for process: Process) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                process.waitUntilExit()
                continuation.resume()
            }
        }
    }

    /// Waits until the file says `text`; answers what it says.
    @discardableResult
    func output(_ file: URL, contains text: String, within timeout: Duration = .seconds(15)) async throws -> String {
        let deadline = ContinuousClock.now + timeout
        while true {
            let said = (try? String(contentsOf: file, encoding: .utf8)) ?? ""
            if said.contains(text) { return said }
            guard ContinuousClock.now < deadline else { throw TestFailure("\(file.lastPathComponent) never said \"\(text)\"; it said:\n\(said)") }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// Stops every process it started (the programs first, then Avahi, then D-Bus), by PID, and removes
    /// the namespaces and files.
    func stop() {
        // Waited for off Swift's cooperative threads, as in `make`.
        let processes = Array(started.reversed())
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            for process in processes where process.isRunning { Self.end(process.processIdentifier) }
            for process in processes { process.waitUntilExit() }
            done.signal()
        }
        done.wait()
        for pid in daemonPIDs.reversed() { Self.end(pid) }
        daemonPIDs = []
        started = []
        for device in devices { device.namespace.delete() }
        bridge.delete()
        if ProcessInfo.processInfo.environment["PARLEY_KEEP_LAB"] == "1" {
            print("◇ kept \(directory.path)")
        } else {
            try? FileManager.default.removeItem(at: directory)
        }
    }

    /// SIGTERM, and SIGKILL if it is still there two seconds later.
    static func end(_ pid: pid_t) {
        guard kill(pid, SIGTERM) == 0 else { return }
        let deadline = ContinuousClock.now + .seconds(2)
        while kill(pid, 0) == 0, !isZombie(pid), ContinuousClock.now < deadline { Thread.sleep(forTimeInterval: 0.02) }
        if kill(pid, 0) == 0, !isZombie(pid) { kill(pid, SIGKILL) }
    }

    static func isZombie(_ pid: pid_t) -> Bool {
        ((try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? "").contains(") Z ")
    }

    /// Runs a command that starts a daemon and returns (`--fork`, `-D`), to its end; answers its
    /// exit status. Not through Foundation's `Process`: it learns that a child ended when a socket
    /// the child inherited closes, and a daemon forked from the child keeps that socket open for
    /// its life, so the child's end would never be seen. Here the child gets nothing open but
    /// its output.
    static func launch(_ command: [String], output: URL, environment: [String: String] = [:]) throws -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, output.path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        _ = addCloseFrom(&actions, 3)
        let arguments = ["/usr/bin/env"] + command
        let variables = ProcessInfo.processInfo.environment.merging(environment) { $1 }.map { "\($0.key)=\($0.value)" }
        var argv = arguments.map { strdup($0) } + [nil]
        var envp = variables.map { strdup($0) } + [nil]
        defer { for pointer in argv + envp { free(pointer) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, arguments[0], &actions, nil, &argv, &envp)
        guard spawned == 0 else { throw TestFailure("cannot run \(command[0]): \(String(cString: strerror(spawned)))") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        // WIFEXITED and WEXITSTATUS, which Swift does not import.
        return status & 0x7f == 0 ? (status >> 8) & 0xff : -1
    }

    static func spawn(_ command: [String], output: URL, environment: [String: String] = [:]) throws -> Process {
        _ = FileManager.default.createFile(atPath: output.path, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = command
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let handle = try FileHandle(forWritingTo: output)
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        return process
    }

    static func ip(_ arguments: [String]) throws {
        try NetworkNamespace.runIP(arguments)
    }
}

/// glibc 2.34's `posix_spawn_file_actions_addclosefrom_np` (Debian 12 has 2.36), which its headers
/// declare only under _GNU_SOURCE, out of Swift's sight: the child closes every descriptor from 3 up.
@_silgen_name("posix_spawn_file_actions_addclosefrom_np")
private func addCloseFrom(_ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ from: Int32) -> Int32

/// Calls on a local network with no server: discovery through Avahi, the listener's own hub, real
/// media between two namespaces.
@Suite("LAN calls without a server", .serialized, .timeLimit(.minutes(3)))
struct LANCallTests {
    @Test func aListenerIsFoundWithItsNameAndAddressAndDisappearsWhenItLeaves() async throws {
        let lab = try await LANLab.make(devices: 2)
        defer { lab.stop() }
        let watch = try lab.start(on: 2, ["lan", "--watch"], output: "watch.txt")
        try await lab.output(watch.output, contains: "watching")
        let listener = try lab.start(on: 1, ["listen", "--lan", "--as", "bob", "--name", "Bob", "--pin", "2468",
                                             "--play", "silence", "--answer", "never"], output: "listen.txt")
        try await lab.output(listener.output, contains: "listening as bob")
        let seen = try await lab.output(watch.output, contains: "+ bob (Bob)")
        let line = try #require(seen.split(separator: "\n").first { $0.hasPrefix("+ bob") })
        #expect(line.contains("198.51.100.61:"), "the listener's address on this network: \(line)")
        #expect(line.hasSuffix("PIN"), "it asks for a PIN: \(line)")

        // The one-shot list says the same.
        let list = try await lab.run(on: 2, ["lan", "--seconds", "3"], output: "list.txt")
        #expect(list.status == 0)
        #expect(list.output.contains("bob (Bob)") && list.output.contains("198.51.100.61:"), "\(list.output)")

        listener.process.terminate()
        await LANLab.wait(for: listener.process)
        try await lab.output(watch.output, contains: "- bob (Bob)")
        let after = try await lab.run(on: 2, ["lan", "--seconds", "2"], output: "after.txt")
        #expect(!after.output.contains("bob (Bob)"), "\(after.output)")
        #expect(after.output.contains("no device is listening"))
    }

    @Test func aCallFindsTheListenerAndCarriesAudioBothWaysOnlyWithItsPIN() async throws {
        let lab = try await LANLab.make(devices: 2)
        defer { lab.stop() }
        let heardByBob = lab.directory.appendingPathComponent("bob.wav")
        let heardByAlice = lab.directory.appendingPathComponent("alice.wav")
        let listener = try lab.start(on: 1, ["listen", "--lan", "--as", "bob", "--name", "Bob", "--pin", "2468", "--play", "tone:660",
                                             "--record", heardByBob.path, "--answer", "auto", "--once"], output: "listen.txt")
        try await lab.output(listener.output, contains: "listening as bob")

        let wrong = try await lab.run(on: 2, ["call", "bob", "--lan", "--as", "mallory", "--pin", "1357", "--play", "silence"],
                                      output: "wrong.txt")
        #expect(wrong.status == 1)
        #expect(wrong.output.contains("refused: wrong PIN"), "\(wrong.output)")
        let none = try await lab.run(on: 2, ["call", "bob", "--lan", "--as", "mallory", "--play", "silence"], output: "none.txt")
        #expect(none.status == 1)
        #expect(none.output.contains("bob asks for a PIN"), "\(none.output)")
        let nobody = try await lab.run(on: 2, ["call", "carol", "--lan", "--as", "alice", "--play", "silence"], output: "nobody.txt")
        #expect(nobody.status == 1)
        #expect(nobody.output.contains("nobody called carol is listening on this network (listening: bob)"), "\(nobody.output)")
        #expect(!((try? String(contentsOf: listener.output, encoding: .utf8)) ?? "").contains("incoming call"),
                "nobody was put through without the PIN")

        let call = try await lab.run(on: 2, ["call", "bob", "--lan", "--as", "alice", "--name", "Alice", "--pin", "2468",
                                             "--play", "tone:440", "--record", heardByAlice.path, "--duration", "4"], output: "call.txt")
        try #require(call.status == 0, "\(call.output)")
        // The listener (--once) ends with the call.
        try await lab.output(listener.output, contains: "call with alice ended")
        await LANLab.wait(for: listener.process)
        let listened = try String(contentsOf: listener.output, encoding: .utf8)
        #expect(call.output.contains("found bob (Bob)  \"Bob on "), "\(call.output)")
        #expect(call.output.contains("calling Bob (bob) at 198.51.100.61:"), "\(call.output)")
        #expect(call.output.contains("call with bob ended: hung up"), "\(call.output)")
        // The callee sees who calls, under the name they chose, and from where.
        #expect(listened.contains("incoming call from Alice (alice) at 198.51.100.62"), "\(listened)")
        #expect(listener.process.terminationStatus == 0)

        // Each side hears the other's tone and not its own, in every tenth of a second of the talk.
        for (file, present, absent) in [(heardByAlice, 660.0, 440.0), (heardByBob, 440.0, 660.0)] {
            let audio = try WAV.read(file)
            let seconds = Double(audio.samples.count) / Double(audio.sampleRate)
            #expect(seconds > 3.5, "\(file.lastPathComponent) is \(seconds) s long")
            let missing = CallRecordingTests.tenthsMissing(audio, channel: 0, present: [present], absent: [absent],
                                                           from: 1.0, to: seconds - 0.3)
            #expect(missing.isEmpty, "\(file.lastPathComponent): \(missing)")
        }
    }

    @Test func twoListenersUnderOneNameAreBothFoundAndNotToldApartByGuessing() async throws {
        let lab = try await LANLab.make(devices: 3)
        defer { lab.stop() }
        var outputs: [URL] = []
        for device in [1, 3] {
            let listener = try lab.start(on: device, ["listen", "--lan", "--as", "bob", "--name", "Bob", "--play", "silence", "--answer", "never"],
                                         output: "listen\(device).txt")
            try await lab.output(listener.output, contains: "on the local network as")
            outputs.append(listener.output)
        }
        // Both asked for "Bob on <host>" (one host name here): the second got the next free name.
        let names = try outputs.map { try String(contentsOf: $0, encoding: .utf8) }
        #expect(names.contains { $0.contains(#"#2""#) }, "\(names)")
        let call = try await lab.run(on: 2, ["call", "bob", "--lan", "--as", "alice", "--play", "silence"], output: "call.txt")
        #expect(call.status == 1)
        #expect(call.output.contains("2 devices answer to bob on this network"), "\(call.output)")
        #expect(call.output.contains("198.51.100.61:") && call.output.contains("198.51.100.63:"), "\(call.output)")
        for output in outputs {
            #expect(!((try? String(contentsOf: output, encoding: .utf8)) ?? "").contains("incoming call"))
        }
    }
}
