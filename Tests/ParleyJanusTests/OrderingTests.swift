import Foundation
import ParleyJanus
import Testing

/// A Janus transport whose first plugin message is slow to leave (a big offer on a busy socket).
final class SlowFirstMessageTransport: JanusTransport, @unchecked Sendable {
    let incoming: AsyncStream<String>
    private let sink: AsyncStream<String>.Continuation
    private let lock = NSLock()
    private var sent: [String] = []
    private var slowed = false

    init() { (incoming, sink) = AsyncStream.makeStream() }

    var verbsSent: [String] { lock.withLock { sent } }

    func send(_ text: String) async throws {
        let frame = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] ?? [:]
        let verb = frame["janus"] as? String ?? "?"
        let transaction = frame["transaction"] as? String ?? ""
        if verb == "create" {
            lock.withLock { sent.append(verb) }
            sink.yield(#"{"janus":"success","transaction":"\#(transaction)","data":{"id":7}}"#)
            return
        }
        let slow = lock.withLock { () -> Bool in
            defer { slowed = true }
            return verb == "message" && !slowed
        }
        if slow { try await Task.sleep(for: .milliseconds(300)) }
        lock.withLock { sent.append(verb) }
    }

    func close() async { sink.finish() }
}

@Suite("Janus frames leave in order")
struct JanusOrderingTests {
    @Test func aTrickledCandidateNeverOvertakesItsOffer() async throws {
        let transport = SlowFirstMessageTransport()
        let client = JanusClient(transport: transport, requestTimeout: .seconds(1))
        try await client.createSession()
        let offer = Task { try? await client.message(1, body: ["request": "configure"], jsep: JSEP(type: "offer", sdp: "v=0")) }
        try await Task.sleep(for: .milliseconds(50))  // the offer was asked for first
        let candidate = Task { try? await client.trickle(1, candidate: "candidate:1 1 udp 1 127.0.0.1 9 typ host", sdpMid: "0", sdpMLineIndex: 0) }
        _ = await (offer.value, candidate.value)
        #expect(transport.verbsSent == ["create", "message", "trickle"])
        await transport.close()
    }
}
