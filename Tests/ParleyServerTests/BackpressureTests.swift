import Foundation
import ParleyProtocol
@testable import ParleyServer
import ParleyServerTesting
import Testing

@Suite("A client that reads too slowly", .timeLimit(.minutes(5)))
struct BackpressureTests {
    @Test func isClosedWith4010AndResumesWithoutLosingAFrame() async throws {
        let server = try await LiveServer.start {
            $0.limits.maxFrameSize = 1 << 20
            $0.limits.outboundBufferBytes = 1 << 20
        }
        let codec = WireCodec()
        // bob joins a mesh room over a raw socket, then stops reading.
        let (bob, status, _) = try await RawWebSocket.upgrade(port: server.port, headers: ["Authorization": "Bearer \(try await server.token("bob"))"])
        #expect(status == 101)
        try bob.sendText(#"{"type":"hello","id":"h","device":"b1"}"#)
        guard case .text(let welcomeText) = try await bob.next(), case .welcome(let welcome) = try codec.decodeServerFrame(welcomeText).message else {
            Issue.record("no welcome"); return
        }
        try bob.sendText(#"{"type":"room.join","id":"j","room":"lobby"}"#)
        guard case .text = try await bob.next() else { Issue.record("no join ack"); return }

        let alice = try await server.device("alice", "a1")
        #expect(try await alice.request { .roomJoin(RoomJoin(id: $0, room: "lobby")) }.isSuccess)
        let filler = String(repeating: "x", count: 500_000)
        // While bob reads, he is sent three times the bound in all and never closed: the bound is on
        // what waits to be written, not on what was.
        var lastSeq = 1
        for index in 0..<6 {
            #expect(try await alice.request { id in
                .roomSignal(RoomSignal(id: id, room: "lobby", to: "b1",
                                       signal: SignalPayload(description: SessionDescription(type: "offer", sdp: "read \(index):\(filler)"))))
            }.isSuccess)
            reading: while true {
                guard case .text(let text) = try await bob.next() else { Issue.record("closed while reading"); return }
                let frame = try codec.decodeServerFrame(text)
                lastSeq = frame.seq ?? lastSeq
                if case .roomSignal(let signal) = frame.message, signal.signal.description?.sdp.hasPrefix("read \(index):") == true { break reading }
            }
        }
        #expect(server.server.metrics.exposition().contains("parley_slow_connections_closed_total 0\n"))

        // Then he stops reading: 30 MB for him, far more than the kernel's socket buffers and the
        // server's 1 MiB bound.
        let count = 60
        for index in 0..<count {
            let answer = try await alice.request { id in
                .roomSignal(RoomSignal(id: id, room: "lobby", to: "b1",
                                              signal: SignalPayload(description: SessionDescription(type: "offer", sdp: "\(index):\(filler)"))))
            }
            #expect(answer.isSuccess)
        }
        #expect(server.server.metrics.exposition().contains("parley_slow_connections_closed_total 1\n"))

        // bob reads again: what was on its way, then 4010.
        var seen: [Int] = []
        reading: while true {
            switch try await bob.next() {
            case .text(let text):
                let frame = try codec.decodeServerFrame(text)
                lastSeq = frame.seq ?? lastSeq
                if case .roomSignal(let signal) = frame.message, let sdp = signal.signal.description?.sdp {
                    seen.append(Int(sdp.prefix { $0 != ":" })!)
                }
            case .close(let code):
                #expect(code == 4010)
                break reading
            }
        }
        #expect(seen.count < count, "the close came before everything was written")

        let back = try await WSTestClient.connect(url: server.signalURL, token: server.token("bob"), maxFrameSize: 1 << 20)
        #expect(try await back.hello(device: "b1", resume: ResumeRequest(session: welcome.session, lastSeq: lastSeq)).resumed)
        while seen.count < count {
            let signal = try await back.expect { if case .roomSignal(let signal) = $0.message { signal } else { nil } }
            seen.append(Int(signal.signal.description!.sdp.prefix { $0 != ":" })!)
        }
        #expect(seen == Array(0..<count), "every frame, once, in order")
        try await server.stop()
    }
}
