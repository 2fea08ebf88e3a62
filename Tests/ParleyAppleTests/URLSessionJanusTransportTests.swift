import Foundation
@testable import ParleyApple
import ParleyJanus
import ParleyLocalServices
import Testing

extension OneIPhone {
    /// A voice room's connection to Janus on an iPhone: URLSession's WebSocket task (played by the test:
    /// URLSession cannot open a WebSocket on Linux) under the real Janus client.
    @Suite("Janus over URLSession")
    struct URLSessionJanusTransportTests {
        @Test func theJanusClientMakesASessionThroughIt() async throws {
            let task = ScriptedWebSocketTask()
            let transport = URLSessionJanusTransport(task: task)
            let client = JanusClient(transport: transport)
            async let session = client.createSession()
            try await eventually("the client asked for a session") { !task.sent.isEmpty }
            let create = try JSONSerialization.jsonObject(with: Data(task.sent[0].utf8)) as? [String: Any]
            #expect(create?["janus"] as? String == "create")
            let transaction = try #require(create?["transaction"] as? String)
            task.deliver(.success(.string(#"{"janus":"success","transaction":"\#(transaction)","data":{"id":4242}}"#)))
            #expect(try await session == 4242)
            await client.close()
        }

        @Test func framesArriveInOrderAndTheStreamEndsWhenJanusCloses() async throws {
            let task = ScriptedWebSocketTask()
            let transport = URLSessionJanusTransport(task: task)
            try await transport.send("first")
            try await transport.send("second")
            #expect(task.sent == ["first", "second"])
            task.deliver(.success(.string("one")))
            task.deliver(.success(.data(Data([1, 2]))))  // Janus speaks text: anything else is dropped
            task.deliver(.success(.string("two")))
            task.serverClose(1001)
            var frames: [String] = []
            for await frame in transport.incoming { frames.append(frame) }
            #expect(frames == ["one", "two"])
            await transport.close()
            #expect(task.cancelled == .normalClosure)
        }
    }
}
