import Foundation
import Logging
@testable import ParleyKit
import ParleyProtocol
import ParleyServerTesting
import ParleyTesting
import Testing

/// One call's controller on its own: the test routes the call's signaling as `CallManager` would,
/// and watches the call's tasks end with it.
@Suite("A call's controller, without a manager")
struct CallControllerTests {
    /// Alice's side: a signaling client, fake system parts, and one controller for her call to bob.
    final class Caller: Sendable {
        let signaling: SignalingClient<ContinuousClock>
        let provider = FakeSystemCallProvider()
        let audio = FakeAudioSession()
        let peers = FakePeerConnectionFactory(name: "alice-a1")
        let call: CallController<ContinuousClock>
        let uuid = UUID()
        let start: ProviderActionID
        /// What the state machine asked for when the call was made.
        let startActions: [CallStateMachine.Action]
        let events: AsyncStream<CallEvent>
        /// Set once the controller's `run()` returned.
        let finished = Locked(false)

        init(_ server: LiveServer, retention: Duration) {
            signaling = makeClient(server, user: "alice", device: "a1")
            var configuration = CallManager<ContinuousClock>.Configuration()
            configuration.statsInterval = .milliseconds(100)
            configuration.endedCallRetention = retention
            let (events, sink) = AsyncStream<CallEvent>.makeStream()
            self.events = events
            let environment = CallController<ContinuousClock>.Environment(
                signaling: signaling, provider: provider, audio: audio, peers: peers, clock: ContinuousClock(),
                logger: Logger(label: "test.controller"), configuration: configuration, events: sink, iceServers: { [] })
            let uuid = self.uuid
            start = provider.perform { .start($0, call: uuid, to: "bob", video: false) }
            let (machine, actions) = CallStateMachine.outgoing(CallID(uuid: uuid), to: "bob", media: MediaSpec(audio: true, video: false), action: start)
            startActions = actions
            call = CallController(machine, environment: environment)
        }

        /// Runs the call, routes its signaling to it (what the manager does), and starts it.
        func run() async throws -> Task<Void, Never> {
            await signaling.start()
            try await eventually("alice is online") { await signaling.session != nil }
            let (call, finished, client) = (self.call, self.finished, self.signaling)
            let running = Task {
                await withDiscardingTaskGroup { group in
                    group.addTask {
                        for await event in client.events {
                            guard case .message(let message) = event else { continue }
                            switch message {
                            case .callAccepted: await call.perform { $0.remoteAccepted() }
                            case .callSignal(let signal): await call.received(signal.signal)
                            case .callEnded(let ended): await call.perform { $0.remoteEnded(ended.reason) }
                            default: break
                            }
                        }
                    }
                    await call.run()
                    finished.set(true)
                    group.cancelAll()
                }
            }
            await call.start(startActions)
            return running
        }
    }

    /// The user hangs up: the call ends, and once its retention has passed its `run()` returns by
    /// itself, every request answered and every CallKit action completed.
    @Test func anEndedCallsTasksEndWithIt() async throws {
        let server = try await LiveServer.start()
        let alice = Caller(server, retention: .milliseconds(300))
        let running = try await alice.run()
        try await eventually("the invite is acknowledged") { alice.provider.outcome(of: alice.start) == true }
        let uuid = alice.uuid
        let end = alice.provider.perform { .end($0, call: uuid) }
        await alice.call.perform { $0.end(end, anotherCallActive: false) }
        #expect(await alice.call.phase.isEnded)
        try await eventually("the call's run() returns after its retention") { alice.finished.value }
        #expect(alice.provider.openActions.isEmpty, "\(alice.provider.openActions)")
        #expect(alice.provider.violations.isEmpty, "\(alice.provider.violations)")
        await running.value
        await alice.signaling.stop()
        try await server.stop()
    }

    /// A connected call: the negotiator, the quality loop and the requests' answers run as the
    /// controller's children. Cancelling its `run()` ends them all: it returns at once, and no
    /// quality report comes after.
    @Test func cancellingACallEndsEveryTaskOfIt() async throws {
        let server = try await LiveServer.start()
        let bob = SDKDevice(server, user: "bob", device: "b1")
        try await bob.start()
        let alice = Caller(server, retention: .seconds(300))
        let reports = Locked(0)
        let events = alice.events
        Task { for await event in events { if case .quality = event { reports.set(reports.value + 1) } } }
        let running = try await alice.run()
        try await eventually("bob's phone rings") { bob.incomingCall() == alice.uuid }
        let uuid = alice.uuid
        _ = bob.provider.perform { .answer($0, call: uuid) }
        bob.provider.deliver(.audioSessionActivated)
        try await eventually("alice is connected") { await alice.call.phase == .connected }
        try await eventually("quality reports come") { reports.value >= 2 }

        running.cancel()
        try await eventually(timeout: .seconds(2), "run() returns once cancelled") { alice.finished.value }
        let after = reports.value
        try await Task.sleep(for: .milliseconds(400))  // checks that nothing happens: four report intervals
        #expect(reports.value == after, "no quality report after the call's tasks were cancelled")
        await alice.signaling.stop()
        await bob.stop()
        try await server.stop()
    }
}
