import ParleyGStreamer
import Testing

@Suite("Adaptive jitter buffer")
struct JitterBufferControllerTests {
    @Test func growsAtOnceWithJitterAndShrinksSlowlyWhenItCalms() {
        var controller = JitterBufferController()
        #expect(controller.latencyMs == 50)
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, now: .seconds(1)) == nil, "a calm network keeps the floor")
        // 30 ms of jitter: 3 × 30 + 10.
        #expect(controller.update(jitterMs: 30, lateSoFar: 0, now: .seconds(2)) == 100)
        // Calm again: nothing until the target has stayed low for 3 s, then 10 ms at a time.
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, now: .seconds(3)) == nil)
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, now: .seconds(5)) == nil)
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, now: .seconds(6)) == 90)
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, now: .seconds(7)) == nil)
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, now: .seconds(9)) == 80)
        // A spike in between restarts the wait.
        #expect(controller.update(jitterMs: 24, lateSoFar: 0, now: .seconds(10)) == 82)
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, now: .seconds(12)) == nil)
    }

    @Test func latePacketsGrowItWhateverTheEstimateSays() {
        var controller = JitterBufferController()
        #expect(controller.update(jitterMs: 2, lateSoFar: 0, now: .seconds(1)) == nil)
        #expect(controller.update(jitterMs: 2, lateSoFar: 3, now: .seconds(2)) == 75)
        #expect(controller.update(jitterMs: 2, lateSoFar: 3, now: .seconds(3)) == nil, "no new late packets")
        #expect(controller.update(jitterMs: 2, lateSoFar: 4, now: .seconds(4)) == 113)
    }

    @Test func itDoesNotShrinkBackToWherePacketsCameLateUntilNoneHasForAWhile() {
        var controller = JitterBufferController()
        // Late at 79 ms (3 × 23 + 10; the estimate then reads 3 × 20 + 10 = 70, short of the spread).
        #expect(controller.update(jitterMs: 23, lateSoFar: 0, now: .seconds(1)) == 79)
        #expect(controller.update(jitterMs: 20, lateSoFar: 5, now: .seconds(2)) == 119)
        // It shrinks, but stays clear of 79 while the late packets are recent.
        var latencies: [Int] = []
        for second in 3...21 {
            if let latency = controller.update(jitterMs: 20, lateSoFar: 5, now: .seconds(second)) { latencies.append(latency) }
        }
        #expect(latencies == [109, 99], "\(latencies)")
        // Twenty seconds without a late packet: back to the estimate, step by step.
        for second in 22...40 {
            if let latency = controller.update(jitterMs: 20, lateSoFar: 5, now: .seconds(second)) { latencies.append(latency) }
        }
        #expect(latencies.count > 2 && latencies.last! <= 79, "\(latencies)")
    }

    @Test func waitsForRetransmissionsWhileLostPacketsAreAskedForAgain() {
        var controller = JitterBufferController()
        // Asks, but no retransmission has come yet: nothing to size by.
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, askedAgainSoFar: 4, now: .seconds(1)) == nil)
        // A retransmission took 45 ms: 45 + 3 × 5 + 30.
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, askedAgainSoFar: 9, retransmissionRttMs: 45, now: .seconds(2)) == 90)
        // No asks for a while: it shrinks as it does after jitter.
        for second in 3...5 {
            #expect(controller.update(jitterMs: 5, lateSoFar: 0, askedAgainSoFar: 9, retransmissionRttMs: 45, now: .seconds(second)) == nil)
        }
        #expect(controller.update(jitterMs: 5, lateSoFar: 0, askedAgainSoFar: 9, retransmissionRttMs: 45, now: .seconds(6)) == 80)
    }

    @Test func staysWithinItsBounds() {
        var controller = JitterBufferController()
        for second in 1...20 { _ = controller.update(jitterMs: 500, lateSoFar: UInt64(second), now: .seconds(second)) }
        #expect(controller.latencyMs == 300)
        for second in 21...200 { _ = controller.update(jitterMs: 0, lateSoFar: 20, now: .seconds(second)) }
        #expect(controller.latencyMs == 50)
    }
}
