import ParleyProtocol
import ParleyServerTesting
@testable import ParleyServer
import Testing

@Suite("Call state machine")
struct CallStateMachineTests {
    let caller = Party(user: "alice", device: "a1", name: "Alice")
    let alice = DeviceKey(user: "alice", device: "a1")
    let phone = DeviceKey(user: "bob", device: "phone")
    let laptop = DeviceKey(user: "bob", device: "laptop")

    func ringing() -> HubCall {
        var call = HubCall(id: "6f1c0b6e-3d7a-4c55-9e7e-2b1f0a9d4c21", caller: caller, callee: "bob", media: .audioOnly,
                                    metadata: nil, createdAt: 1000, expiresAt: 46_000)
        call.rang("phone")
        call.rang("laptop")
        return call
    }

    @Test func acceptMovesToActiveAndTellsTheOthers() throws {
        var call = ringing()
        let deliveries = try call.accept(from: laptop, now: 2000)
        #expect(call.state == .active(callee: "laptop", answeredAt: 2000))
        #expect(deliveries.map(\.to) == [alice, phone])
        #expect(call.participants == [alice, laptop])
        #expect(call.record.answeredAt == 2000)
        #expect(call.record.calleeDevice == "laptop")
    }

    @Test func refusedEventsLeaveTheStateAlone() throws {
        var call = ringing()
        #expect(throws: ErrorMessage(code: .forbidden, message: "only the callee can ring, accept or decline a call")) {
            try call.accept(from: alice, now: 2000)
        }
        #expect(throws: ErrorMessage.self) { try call.accept(from: DeviceKey(user: "mallory", device: "m"), now: 2000) }
        #expect(call.phase == .ringing)
        _ = try call.accept(from: phone, now: 2000)
        #expect(throws: ErrorMessage.self) { try call.hangup(from: laptop, detail: nil, now: 3000) }
        #expect(call.phase == .active)
    }

    @Test func connectionLostOfOneRingingDeviceKeepsTheCallRinging() {
        var call = ringing()
        #expect(call.connectionLost(phone, now: 2000).isEmpty)
        #expect(call.phase == .ringing)
        #expect(call.rungDevices == ["laptop"])
        let deliveries = call.connectionLost(alice, now: 3000)
        #expect(deliveries.map(\.to) == [laptop])
        #expect(call.endReason == .connectionLost)
    }

    @Test func durationCountsFromAnswerToEnd() throws {
        var call = ringing()
        _ = try call.accept(from: phone, now: 11_000)
        _ = try call.hangup(from: alice, detail: nil, now: 68_500)
        #expect(call.record.duration == 57.5)
        #expect(call.record.endedAt == 68_500)
        #expect(call.ringTimeout(now: 90_000).isEmpty, "an ended call does not time out again")
    }
}

@Suite("Rate limiter")
struct RateLimiterTests {
    @Test func burstThenSustainedRateThenClose() {
        var limiter = RateLimiter(rate: 50, burst: 200, maxRefused: 100, refusedWindow: .seconds(2), now: .zero)
        for _ in 0..<200 { #expect(limiter.admit(now: .zero) == .allow) }
        #expect(limiter.admit(now: .zero) == .refuse)
        #expect(limiter.admit(now: .milliseconds(20)) == .allow, "one token back after 20 ms at 50/s")
        for _ in 0..<99 { _ = limiter.admit(now: .milliseconds(20)) }
        #expect(limiter.admit(now: .milliseconds(20)) == .close, "the 101st refusal within 2 s")
    }

    @Test func refusalsOutsideTheWindowAreForgotten() {
        var limiter = RateLimiter(rate: 1, burst: 1, maxRefused: 2, refusedWindow: .seconds(2), now: .zero)
        #expect(limiter.admit(now: .zero) == .allow)
        #expect(limiter.admit(now: .zero) == .refuse)
        #expect(limiter.admit(now: .milliseconds(10)) == .refuse)
        #expect(limiter.admit(now: .seconds(3)) == .allow)
        #expect(limiter.admit(now: .seconds(3)) == .refuse)
        #expect(limiter.admit(now: .seconds(3)) == .refuse)
        #expect(limiter.admit(now: .seconds(3)) == .close)
    }

    @Test func aRateOfZeroAdmitsEverything() {
        var limiter = RateLimiter(rate: 0, burst: 1, maxRefused: 0, refusedWindow: .seconds(2), now: .zero)
        for _ in 0..<10_000 { #expect(limiter.admit(now: .zero) == .allow) }
    }
}
