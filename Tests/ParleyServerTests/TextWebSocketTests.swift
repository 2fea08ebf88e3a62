import Foundation
import HTTPTypes
import ParleyServer
import ParleyServerTesting
import ParleyWebSocket
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The one text WebSocket client (`ParleyWebSocket`) that the Janus client, the SDK's signaling
/// transport on Linux and the benchmark share, against the real server: order, close codes, a
/// peer gone silent, cancellation.
@Suite("The text WebSocket client", .serialized, .timeLimit(.minutes(2)))
struct TextWebSocketTests {
    static func connect(_ url: String, token: String?, closeTimeout: Duration = .seconds(2)) async throws -> TextWebSocket {
        var headers = HTTPFields()
        headers[.secWebSocketProtocol] = "parley.v1"
        if let token { headers[.authorization] = "Bearer \(token)" }
        return try await TextWebSocket.connect(to: url, headers: headers, maxFrameSize: 1 << 16, closeTimeout: closeTimeout)
    }

    /// Every event until the end (or `limit` of them).
    static func events(of socket: TextWebSocket, limit: Int = .max) async -> [TextWebSocket.Event] {
        var seen: [TextWebSocket.Event] = []
        for await event in socket.events {
            seen.append(event)
            if seen.count == limit { break }
        }
        return seen
    }

    @Test func framesLeaveInOrderAndTheServersCloseCodeEndsTheEvents() async throws {
        let server = try await LiveServer.start { $0.helloTimeout = .seconds(1) }
        let socket = try await Self.connect(server.signalURL, token: try await server.token("alice"))
        #expect(socket.send(#"{"type":"hello","id":"h","device":"a1"}"#))
        for index in 1...5 { socket.send(#"{"type":"ping","id":"p\#(index)"}"#) }
        let answers = await Self.events(of: socket, limit: 6).compactMap { event -> String? in
            guard case .text(let text) = event, let range = text.range(of: #""re":"[a-z0-9]+""#, options: .regularExpression) else { return nil }
            return String(text[range].dropFirst(6).dropLast())
        }
        #expect(answers == ["h", "p1", "p2", "p3", "p4", "p5"], "the welcome, then each ping's ack in the order sent")
        socket.close()
        await socket.closed()
        #expect(!socket.send("late"), "nothing is queued once closed")

        // Nothing said: the server closes with 4001 after its hello timeout, and that is the end.
        let quiet = try await Self.connect(server.signalURL, token: try await server.token("bob"))
        let ended = await Self.events(of: quiet)
        #expect(ended == [.closed(code: 4001)])
        try await server.stop()
    }

    /// A path that goes silent: the close frame goes nowhere and no answer comes. The close gives
    /// up after its timeout rather than wait for ever.
    @Test func aCloseOnASilentPathEndsWithinTheCloseTimeout() async throws {
        let server = try await LiveServer.start()
        let proxy = try TCPProxy()
        defer { proxy.stop() }
        proxy.connect(to: server.port)
        let socket = try await Self.connect("ws://127.0.0.1:\(proxy.port)/v1/signal", token: try await server.token("alice"), closeTimeout: .seconds(1))
        socket.send(#"{"type":"hello","id":"h","device":"a1"}"#)
        #expect(await Self.events(of: socket, limit: 1).count == 1, "welcomed")
        proxy.blackHole()
        let started = ContinuousClock.now
        socket.close()
        await socket.closed()
        let took = ContinuousClock.now - started
        #expect(took < .seconds(3), "closed in \(took), with a close timeout of 1 s")
        #expect(await Self.events(of: socket) == [.closed(code: nil)], "no close code came")
        try await server.stop()
    }

    /// A listener that takes the connection and never answers the upgrade: cancelling the attempt
    /// ends it at once. Nothing listening at all: refused at once.
    @Test func aConnectAttemptEndsWhenCancelledOrRefused() async throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) == 0 && getsockname(listener, $0, &length) == 0 }
        }
        try #require(bound && listen(listener, 8) == 0)
        let port = Int(UInt16(bigEndian: address.sin_port))
        let attempt = Task { try await Self.connect("ws://127.0.0.1:\(port)/", token: nil) }
        try await Task.sleep(for: .milliseconds(300))
        let started = ContinuousClock.now
        attempt.cancel()
        await #expect(throws: (any Error).self) { _ = try await attempt.value }
        #expect(ContinuousClock.now - started < .seconds(2))

        let refused = ContinuousClock.now
        await #expect(throws: (any Error).self) { _ = try await Self.connect("ws://127.0.0.1:\(try freeTCPPort())/", token: nil) }
        #expect(ContinuousClock.now - refused < .seconds(2))
    }
}
