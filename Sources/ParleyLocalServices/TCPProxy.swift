import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A loopback TCP relay in front of a server, so a test can cut every connection through it at
/// once, as a network would, without either end choosing to close; make them go silent without a
/// reset (`blackHole`), as a path that breaks does; or hold back what goes through (`delay`), as a
/// slow link or a loaded server would.
public final class TCPProxy: @unchecked Sendable {
    public let port: Int
    private let listener: Int32
    private var upstream = (host: "127.0.0.1", port: 0)
    private let lock = NSLock()
    private var sockets: Set<Int32> = []
    private var stopped = false
    private var _delay: Duration = .zero
    private var accepted = 0
    private var silencedBelow = 0

    /// How long each read, either way, waits before it is passed on.
    public var delay: Duration {
        get { lock.withLock { _delay } }
        set { lock.withLock { _delay = newValue } }
    }

    public init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = Self.address("127.0.0.1", port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            close(fd)
            throw POSIXError(.EADDRINUSE)
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    public var url: String { "http://127.0.0.1:\(port)" }

    /// Where connections go: the server's port, on loopback or `host` (an IPv4 address).
    public func connect(to port: Int, host: String = "127.0.0.1") { lock.withLock { upstream = (host, port) } }

    /// Resets every connection relayed so far; new ones are relayed as before.
    public func cut() {
        let open: Set<Int32> = lock.withLock { defer { sockets = [] }; return sockets }
        for socket in open {
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)  // RST, as a broken path looks
            setsockopt(socket, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
            shutdown(socket, Int32(SHUT_RDWR))
        }
    }

    /// Every connection relayed so far goes silent both ways and stays open: what either end sends
    /// is read and dropped, and neither hears of the other closing. New connections are relayed as
    /// before. Only a heartbeat tells such a connection from an idle one.
    public func blackHole() {
        lock.withLock { silencedBelow = accepted }
    }

    public func stop() {
        lock.withLock { stopped = true }
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        cut()
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 { return }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            let target = lock.withLock { upstream }
            var address = Self.address(target.host, port: target.port)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0, lock.withLock({ !stopped }) else {
                close(client)
                close(server)
                continue
            }
            let number = lock.withLock {
                _ = sockets.insert(client)
                _ = sockets.insert(server)
                accepted += 1
                return accepted
            }
            let pair = Pair(client, server) { [weak self] in self?.lock.withLock { _ = self?.sockets.remove(client); _ = self?.sockets.remove(server) } }
            let silenced: @Sendable () -> Bool = { [self] in lock.withLock { number <= silencedBelow } }
            Thread.detachNewThread { [self] in Self.pump(from: client, to: server, delay: { self.delay }, silenced: silenced); pair.finished() }
            Thread.detachNewThread { [self] in Self.pump(from: server, to: client, delay: { self.delay }, silenced: silenced); pair.finished() }
        }
    }

    private static func pump(from source: Int32, to destination: Int32, delay: () -> Duration, silenced: () -> Bool) {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = read(source, &buffer, buffer.count)
            // A silent path passes on neither data nor the end of it; the socket closes with the pair.
            if silenced() { if count <= 0 { return } else { continue } }
            if count <= 0 { break }
            let wait = delay()
            if wait > .zero { Thread.sleep(forTimeInterval: Double(wait.components.seconds) + Double(wait.components.attoseconds) / 1e18) }
            var sent = 0
            while sent < count {
                let written = buffer[sent..<count].withUnsafeBytes { write(destination, $0.baseAddress, count - sent) }
                if written <= 0 { break }
                sent += written
            }
            if sent < count { break }
        }
        shutdown(source, Int32(SHUT_RDWR))
        shutdown(destination, Int32(SHUT_RDWR))
    }

    /// The two sockets of one relayed connection, closed when both directions are done.
    private final class Pair: @unchecked Sendable {
        private let lock = NSLock()
        private var running = 2
        private let a: Int32, b: Int32
        private let forget: () -> Void
        init(_ a: Int32, _ b: Int32, forget: @escaping () -> Void) { (self.a, self.b, self.forget) = (a, b, forget) }
        func finished() {
            guard lock.withLock({ running -= 1; return running == 0 }) else { return }
            forget()
            close(a)
            close(b)
        }
    }

    private static func address(_ host: String, port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr(host)
        return address
    }
}
