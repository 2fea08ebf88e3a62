import Foundation
import ParleyProtocol
import ParleyServerTesting
#if canImport(Glibc)
import Glibc
#endif

/// A WebSocket client on a plain blocking socket, for what a library client hides: an upgrade's
/// exact HTTP answer, and a client that stops reading (so TCP pushes back on the server).
final class RawWebSocket: @unchecked Sendable {
    let fd: Int32
    private var received: [UInt8] = []

    /// Connects to 127.0.0.1:`port` and sends an upgrade request for `path` with `headers`.
    /// Answers the socket and the HTTP status line and headers of the answer.
    /// `source`: the loopback address to connect from (127.0.0.1 when nil).
    static func upgrade(port: Int, path: String = "/v1/signal", headers: [String: String],
                        source: String? = nil) async throws -> (RawWebSocket, status: Int, head: String) {
        try await offThePool { try blockingUpgrade(port: port, path: path, headers: headers, source: source) }
    }

    private static func blockingUpgrade(port: Int, path: String, headers: [String: String], source: String?) throws -> (RawWebSocket, status: Int, head: String) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestFailure("socket() failed") }
        if let source {
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            local.sin_addr.s_addr = inet_addr(source)
            let bound = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else { close(fd); throw TestFailure("bind(\(source)) failed") }
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { close(fd); throw TestFailure("connect() failed") }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let socket = RawWebSocket(fd: fd)
        var request = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        request += "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        for (name, value) in headers { request += "\(name): \(value)\r\n" }
        request += "\r\n"
        try socket.send(Array(request.utf8))
        let head = try socket.readHead()
        let status = head.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        return (socket, status, head)
    }

    private init(fd: Int32) { self.fd = fd }

    deinit { close(fd) }

    func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard sent > 0 else { throw TestFailure("send() failed") }
            offset += sent
        }
    }

    /// Sends one masked text frame, as a client must.
    func sendText(_ text: String) throws {
        let payload = Array(text.utf8)
        var frame: [UInt8] = [0x81]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else {
            frame.append(0x80 | 126)
            frame += [UInt8(payload.count >> 8), UInt8(payload.count & 0xff)]
        }
        let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        try send(frame)
    }

    private func fill() throws {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { throw TestFailure("the connection ended (recv \(count))") }
        received += chunk[0..<count]
    }

    /// A refused upgrade's body (`Content-Length` bytes after `head`), read as protocol v1's error body.
    func refusal(head: String) async throws -> HTTPErrorBody {
        let length = head.split(separator: "\r\n").compactMap { line -> Int? in
            let parts = line.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, parts[0].lowercased() == "content-length" else { return nil }
            return Int(parts[1].trimmingCharacters(in: .whitespaces))
        }.first ?? 0
        let body: [UInt8] = try await offThePool {
            while self.received.count < length { try self.fill() }
            defer { self.received.removeFirst(length) }
            return Array(self.received[0..<length])
        }
        return try JSONDecoder().decode(HTTPErrorBody.self, from: Data(body))
    }

    private func readHead() throws -> String {
        while true {
            if let end = findHeadEnd() {
                let head = String(decoding: received[0..<end], as: UTF8.self)
                received.removeFirst(end + 4)
                return head
            }
            try fill()
        }
    }

    private func findHeadEnd() -> Int? {
        guard received.count >= 4 else { return nil }
        for index in 0...(received.count - 4) where received[index..<index + 4].elementsEqual([13, 10, 13, 10]) { return index }
        return nil
    }

    enum Frame: Equatable, Sendable {
        case text(String)
        case close(code: UInt16)
    }

    /// The next text or close frame from the server (it sends them unmasked).
    func next() async throws -> Frame {
        try await offThePool { try self.blockingNext() }
    }

    private func blockingNext() throws -> Frame {
        while true {
            if let frame = try parse() { return frame }
            try fill()
        }
    }

    private func parse() throws -> Frame? {
        guard received.count >= 2 else { return nil }
        let opcode = received[0] & 0x0f
        var length = Int(received[1] & 0x7f)
        var header = 2
        if length == 126 {
            guard received.count >= 4 else { return nil }
            length = Int(received[2]) << 8 | Int(received[3])
            header = 4
        } else if length == 127 {
            guard received.count >= 10 else { return nil }
            length = received[2..<10].reduce(0) { $0 << 8 | Int($1) }
            header = 10
        }
        guard received.count >= header + length else { return nil }
        let payload = Array(received[header..<header + length])
        received.removeFirst(header + length)
        switch opcode {
        case 1: return .text(String(decoding: payload, as: UTF8.self))
        case 8: return .close(code: payload.count >= 2 ? UInt16(payload[0]) << 8 | UInt16(payload[1]) : 1005)
        default: return try parse()
        }
    }
}
