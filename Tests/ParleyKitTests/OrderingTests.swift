import Foundation
@testable import ParleyKit
import ParleyNIOTransport
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

/// A real WebSocket transport whose server answers (acks and errors) reach the client late, as over
/// a slow uplink; it notes when each client frame left and each answer arrived.
final class SlowAnswersTransport: SignalingTransport, @unchecked Sendable {
    struct Note: Sendable {
        var at: ContinuousClock.Instant
        var sent: ClientMessage?
        var answered: String?
    }

    private let inner = WebSocketSignalingTransport()
    let delay: Duration
    private let lock = NSLock()
    private var notes: [Note] = []

    init(delay: Duration) { self.delay = delay }

    var log: [Note] { lock.withLock { notes } }
    fileprivate func note(_ note: Note) { lock.withLock { notes.append(note) } }

    func connect(to url: URL, token: String) async throws -> any SignalingConnection {
        Connection(inner: try await inner.connect(to: url, token: token), transport: self)
    }

    final class Connection: SignalingConnection, @unchecked Sendable {
        let inner: any SignalingConnection
        let events: AsyncStream<TransportEvent>
        weak var transport: SlowAnswersTransport?

        init(inner: any SignalingConnection, transport: SlowAnswersTransport) {
            self.inner = inner
            self.transport = transport
            let (events, sink) = AsyncStream<TransportEvent>.makeStream()
            self.events = events
            let delay = transport.delay
            Task { [weak transport] in
                let codec = WireCodec()
                for await event in inner.events {
                    if case .text(let text) = event, let frame = try? codec.decodeServerFrame(text) {
                        switch frame.message {
                        case .ack(let ack):
                            try? await Task.sleep(for: delay)
                            transport?.note(Note(at: .now, answered: ack.re))
                        case .error(let error):
                            try? await Task.sleep(for: delay)
                            transport?.note(Note(at: .now, answered: error.re))
                        default: break
                        }
                    }
                    sink.yield(event)
                }
                sink.finish()
            }
        }

        func send(_ text: String) {
            transport?.note(Note(at: .now, sent: try? WireCodec().decodeClientMessage(text)))
            inner.send(text)
        }

        func close() { inner.close() }
    }
}

@Suite("Requests leave in order, without waiting for each other")
struct OrderingTests {
    @Test func localCandidatesLeaveBackToBackBehindTheirDescription() async throws {
        let server = try await LiveServer.start()
        let slow = SlowAnswersTransport(delay: .milliseconds(500))
        let alice = SDKDevice(server, user: "alice", device: "a1", transport: slow)
        let bob = SDKDevice(server, user: "bob", device: "b1")
        try await alice.start()
        try await bob.start()
        let (call, _) = alice.call("bob")
        try await eventually("bob's phone rings") { bob.incomingCall() == call }
        _ = bob.provider.perform { .answer($0, call: call) }
        try await eventually(timeout: .seconds(15), "alice connects") { await alice.phase(call) == .connected }

        let log = slow.log
        let signals = log.compactMap { note -> (String, ContinuousClock.Instant)? in
            if case .callSignal(let signal)? = note.sent { (signal.id, note.at) } else { nil }
        }
        #expect(signals.count >= 3, "the offer, a candidate and the end of candidates")
        // Behind their description: the first signal out carries it, every candidate follows.
        let payloads = log.compactMap { note -> SignalPayload? in if case .callSignal(let signal)? = note.sent { signal.signal } else { nil } }
        #expect(payloads.first?.description != nil, "the description leaves first")
        #expect(payloads.dropFirst().allSatisfy { $0.description == nil }, "then only candidates")
        let signalIDs = Set(signals.map(\.0))
        let firstAnswer = try #require(log.first { $0.answered.map(signalIDs.contains) == true }?.at)
        let beforeAnyAnswer = signals.filter { $0.1 < firstAnswer }.count
        #expect(beforeAnyAnswer >= 3, "description and candidates left before the first answer came (\(beforeAnyAnswer) of \(signals.count))")
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    @Test func aCancelledRequestStopsWaitingAndIsForgotten() async throws {
        let server = try await LiveServer.start()
        let slow = SlowAnswersTransport(delay: .seconds(3))
        let client = makeClient(server, user: "alice", device: "a1", transport: slow)
        await client.start()
        try await eventually { await client.session != nil }
        let waiting = Task { () throws(SignalingError) -> Ack in try await client.request { .ping(Ping(id: $0)) } }
        try await Task.sleep(for: .milliseconds(100))
        waiting.cancel()
        let started = ContinuousClock.now
        let outcome = await waiting.result
        #expect(ContinuousClock.now - started < .seconds(2), "no waiting for the late answer")
        guard case .failure(let error) = outcome else { Issue.record("the cancelled request answered"); return }
        #expect((error as? SignalingError)?.code == .cancelled)
        await client.stop()
        try await server.stop()
    }
}

/// CallKit's answer action is held until the server accepted and the peer connection exists.
@Suite("The answer action waits for the accept and the peer connection")
struct AnswerActionTests {
    func ring(_ server: LiveServer, bob: SDKDevice) async throws -> (SDKDevice, UUID) {
        let alice = SDKDevice(server, user: "alice", device: "a1")
        try await alice.start()
        try await bob.start()
        let (call, _) = alice.call("bob")
        try await eventually("bob's phone rings") { bob.incomingCall() == call }
        return (alice, call)
    }

    @Test func thePeerConnectionFirstThenTheAccept() async throws {
        let server = try await LiveServer.start()
        let slow = SlowAnswersTransport(delay: .seconds(1))
        let bob = SDKDevice(server, user: "bob", device: "b1", transport: slow)
        let (alice, call) = try await ring(server, bob: bob)
        let answer = bob.provider.perform { .answer($0, call: call) }
        try await eventually("bob's peer connection exists") { !bob.peers.connections.isEmpty }
        let acceptID = try await Self.acceptRequest(in: slow)
        #expect(!slow.log.contains { $0.answered == acceptID }, "the accept's answer is still on its way")
        #expect(bob.provider.outcome(of: answer) == nil, "not before the server accepted")
        try await eventually("fulfilled once accepted") { bob.provider.outcome(of: answer) == true }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    /// The engine is slow: the accept is taken before the peer connection exists (made at the
    /// answer; or, connecting while ringing, made when the call began to ring and not ready yet).
    @Test(arguments: [false, true])
    func theAcceptFirstThenThePeerConnection(connectWhileRinging: Bool) async throws {
        let server = try await LiveServer.start()
        let notes = SlowAnswersTransport(delay: .zero)
        let bob = SDKDevice(server, user: "bob", device: "b1", transport: notes) { $0.connectWhileRinging = connectWhileRinging }
        if connectWhileRinging { bob.peers.holdCreation() }
        let (alice, call) = try await ring(server, bob: bob)
        bob.peers.holdCreation()
        let answer = bob.provider.perform { .answer($0, call: call) }
        let acceptID = try await Self.acceptRequest(in: notes)
        try await eventually("the server accepted") { notes.log.contains { $0.answered == acceptID } }
        try await Task.sleep(for: .milliseconds(200))
        #expect(bob.peers.connections.isEmpty)
        #expect(bob.provider.outcome(of: answer) == nil, "not before the peer connection exists")
        bob.peers.releaseCreation()
        try await eventually("fulfilled once the peer connection exists") { bob.provider.outcome(of: answer) == true }
        await alice.stop(); await bob.stop()
        try await server.stop()
    }

    static func acceptRequest(in transport: SlowAnswersTransport) async throws -> String {
        var id: String?
        try await eventually("call.accept sent") {
            id = transport.log.lazy.compactMap { note -> String? in
                if case .callAccept(let accept)? = note.sent { accept.id } else { nil }
            }.first
            return id != nil
        }
        return id!
    }
}
