import Testing
@testable import ParleyWire

@Suite("Impairment model")
struct ImpairmentTests {
    /// Packets of `size` bytes every `interval` seconds through `direction`; answers what left, in
    /// order, with when it was sent and when it left.
    func pass(_ count: Int, size: Int = 100, interval: Double = 0.02, through direction: inout WireDirection)
        -> [(index: Int, departure: Double, sent: Double)] {
        var out: [(index: Int, departure: Double, sent: Double)] = []
        func leave(until time: Double, _ direction: inout WireDirection) {
            while let next = direction.nextDeparture, next <= time {
                for packet in direction.due(at: next) {
                    let index = Int(packet[0]) | Int(packet[1]) << 8 | Int(packet[2]) << 16
                    out.append((index, next, Double(index) * interval))
                }
            }
        }
        for index in 0..<count {
            let time = Double(index) * interval
            leave(until: time, &direction)
            var packet = [UInt8](repeating: 0, count: size)
            packet[0] = UInt8(index & 0xff)
            packet[1] = UInt8(index >> 8 & 0xff)
            packet[2] = UInt8(index >> 16 & 0xff)
            direction.admit(packet, at: time)
        }
        leave(until: .infinity, &direction)
        return out
    }

    @Test func specsParseAndPrintBack() throws {
        let impairment = try Impairment(spec: "burst=10%:3, jitter=30ms,reorder,rate=24kbit,queue=150ms,delay=5ms")
        #expect(impairment.lossPct == 10 && impairment.burstLength == 3 && impairment.jitterMs == 30)
        #expect(impairment.reorder && impairment.rateKbps == 24 && impairment.queueMs == 150 && impairment.delayMs == 5)
        #expect(try Impairment(spec: impairment.description) == impairment)
        #expect(try Impairment(spec: "clean") == .clean)
        #expect(Impairment.clean.description == "clean")
        #expect(throws: ImpairmentError.self) { try Impairment(spec: "loss=120%") }
        #expect(throws: ImpairmentError.self) { try Impairment(spec: "burst=5%") }
        #expect(throws: ImpairmentError.self) { try Impairment(spec: "latency=5ms") }
        #expect(throws: ImpairmentError.self) { try Impairment(spec: "rate=fast") }
        #expect(throws: ImpairmentError.self) { try Impairment(spec: "rate=inf") }
        #expect(throws: ImpairmentError.self) { try Impairment(spec: "burst=80%:1") }  // needs longer bursts
    }

    @Test func independentLossDropsItsShareAndRepeatsWithTheSeed() throws {
        var first = WireDirection(impairment: try Impairment(spec: "loss=10%"), seed: 7)
        let passed = pass(20_000, through: &first)
        let lost = 20_000 - passed.count
        #expect(first.statistics.droppedByLoss == lost)
        #expect((1_800...2_200).contains(lost))

        var again = WireDirection(impairment: try Impairment(spec: "loss=10%"), seed: 7)
        #expect(pass(20_000, through: &again).map(\.index) == passed.map(\.index))
        var other = WireDirection(impairment: try Impairment(spec: "loss=10%"), seed: 8)
        #expect(pass(20_000, through: &other).map(\.index) != passed.map(\.index))
    }

    /// The mean length of the runs of consecutive packets that did not pass.
    func meanLossRun(of count: Int, passed: Set<Int>) -> Double {
        var runs: [Int] = []
        var run = 0
        for index in 0..<count {
            if passed.contains(index) {
                if run > 0 { runs.append(run) }
                run = 0
            } else {
                run += 1
            }
        }
        return Double(runs.reduce(0, +)) / Double(runs.count)
    }

    @Test func burstyLossComesInRunsOfTheMeanLength() throws {
        var direction = WireDirection(impairment: try Impairment(spec: "burst=10%:4"), seed: 3)
        let passed = Set(pass(50_000, through: &direction).map(\.index))
        let lost = 50_000 - passed.count
        #expect(direction.statistics.droppedInBursts == lost)
        #expect((4_000...6_000).contains(lost), "lost \(lost) of 50000")
        let meanRun = meanLossRun(of: 50_000, passed: passed)
        #expect((3.3...4.7).contains(meanRun), "mean burst \(meanRun)")

        // Independent loss at the same rate makes runs of about 1/(1 − 0.1) ≈ 1.1.
        var independent = WireDirection(impairment: try Impairment(spec: "loss=10%"), seed: 3)
        let independentRun = meanLossRun(of: 50_000, passed: Set(pass(50_000, through: &independent).map(\.index)))
        #expect((1.0...1.25).contains(independentRun), "mean run \(independentRun)")
    }

    @Test func jitterKeepsOrderUnlessReorderingIsAllowed() throws {
        var fifo = WireDirection(impairment: try Impairment(spec: "delay=10ms,jitter=30ms"), seed: 5)
        let inOrder = pass(5_000, through: &fifo)
        #expect(inOrder.map(\.index) == Array(0..<5_000))
        #expect(fifo.statistics.reordered == 0)
        let delays = inOrder.map { ($0.departure - $0.sent) * 1000 }
        #expect(delays.min()! >= 10 - 1e-6)
        #expect(delays.max()! > 60)  // some packets wait behind late ones beyond 10 + 60 ms draws
        #expect(fifo.statistics.delayed == 5_000)

        var free = WireDirection(impairment: try Impairment(spec: "delay=10ms,jitter=30ms,reorder"), seed: 5)
        let shuffled = pass(5_000, through: &free)
        #expect(shuffled.count == 5_000)
        #expect(shuffled.map(\.index) != Array(0..<5_000))
        let freeDelays = shuffled.map { ($0.departure - $0.sent) * 1000 }
        #expect(freeDelays.min()! >= 10 - 1e-6 && freeDelays.max()! <= 70 + 1e-6)
        var highest = -1, reordered = 0
        for packet in shuffled {
            if packet.index < highest { reordered += 1 } else { highest = packet.index }
        }
        #expect(free.statistics.reordered == reordered && reordered > 100)
    }

    @Test func aBottleneckPacesPacketsAndDropsWhatItsQueueCannotHold() throws {
        // 100-byte packets at 50 a second offer 40 kbit/s to a 24 kbit/s link with a 200 ms queue.
        var direction = WireDirection(impairment: try Impairment(spec: "rate=24kbit"), seed: 1)
        let passed = pass(1_500, through: &direction)
        let seconds = passed.last!.departure - passed.first!.departure
        let kbps = Double(passed.count * 100 * 8) / seconds / 1000
        #expect(abs(kbps - 24) < 0.5, "\(kbps) kbit/s")
        #expect(direction.statistics.droppedByQueue == 1_500 - passed.count)
        #expect(direction.statistics.droppedByQueue > 500)
        let delays = passed.map { ($0.departure - $0.sent) * 1000 }
        let longestWaitMs: Double = 200 + 800.0 / 24  // the queue, then one packet's serialisation
        #expect(delays.max()! <= longestWaitMs + 1e-6)

        // Under the rate nothing is dropped and the wait is the serialisation alone.
        var roomy = WireDirection(impairment: try Impairment(spec: "rate=64kbit"), seed: 1)
        #expect(pass(1_000, through: &roomy).count == 1_000)
        #expect(abs(roomy.statistics.maxDelayMs - 12.5) < 0.01)
    }

    @Test func aChangeAppliesToPacketsFromThenOn() throws {
        var direction = WireDirection(impairment: .clean, seed: 2)
        #expect(pass(1_000, through: &direction).count == 1_000)
        direction.change(to: try Impairment(spec: "loss=50%"))
        let later = pass(1_000, through: &direction).count
        #expect((400...600).contains(later))
        #expect(direction.statistics.received == 2_000 && direction.statistics.forwarded == 1_000 + later)
    }

    /// The wire tells a call's packets apart as RFC 7983 does (RTCP by RFC 5761's packet types).
    @Test func countsPacketsByWhatTheyCarry() {
        func udp(_ payload: [UInt8]) -> [UInt8] {
            [0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 198, 51, 100, 1, 203, 0, 113, 1] + [0x13, 0x88, 0x13, 0x89, 0, 0, 0, 0] + payload
        }
        var tcp = udp([0])
        tcp[9] = 6
        let packets: [([UInt8], PacketKind)] = [
            (udp([0x00, 0x01]), .stun), (udp([22, 0xFE, 0xFD]), .dtls), (udp([23, 0xFE, 0xFD]), .dtls),
            (udp([0x80, 111]), .rtp), (udp([0x80, 0x80 | 111]), .rtp), (udp([0x81, 200]), .rtcp), (udp([0x80, 201]), .rtcp),
            (udp([0x40, 0x00]), .turnChannel), (udp([0xFF]), .otherUDP), (udp([]), .otherUDP), (tcp, .tcp), ([0x60] + udp([0]).dropFirst(), .other),
        ]
        for (packet, kind) in packets { #expect(PacketKind(packet) == kind, "\(packet.suffix(3))") }
        var direction = WireDirection(impairment: Impairment(), seed: 1)
        for (packet, _) in packets { direction.admit(packet, at: 0) }
        #expect(direction.statistics.kinds[.rtp] == 2 && direction.statistics.kinds[.rtcp] == 2 && direction.statistics.kinds[.dtls] == 2)
        #expect(direction.statistics.json.contains(#""kinds":{"tcp":1,"stun":1,"dtls":2,"turnChannel":1,"rtp":2,"rtcp":2,"otherUDP":2,"other":1}"#))
    }
}
