/// What a wire does to the packets crossing it in one direction, written as a spec such as
/// `loss=5%,jitter=30ms` or `burst=10%:3,rate=24kbit,queue=200ms`:
///
/// | key | meaning |
/// |---|---|
/// | `delay=20ms` | every packet waits this long |
/// | `jitter=30ms` | and a further uniform 0…2×30 ms (mean 30 ms), drawn per packet |
/// | `reorder` | a packet drawn a shorter wait overtakes the one before it; without it, packets keep their order and wait behind a late one, as on one FIFO link |
/// | `loss=5%` | each packet is lost with this probability, independently |
/// | `burst=10%:3` | losses in bursts (Gilbert–Elliott): 10 % lost overall, bursts of 3 packets on average |
/// | `rate=24kbit` | a bottleneck: packets are sent one after another at this rate |
/// | `queue=200ms` | the bottleneck's queue; a packet that would wait longer is dropped (default 200 ms) |
///
/// `clean` (or an empty spec) is a perfect wire.
public struct Impairment: Hashable, Sendable, CustomStringConvertible {
    public var delayMs: Double = 0
    public var jitterMs: Double = 0
    public var reorder = false
    /// Percent of packets lost, independently (`burstLength == nil`) or in bursts.
    public var lossPct: Double = 0
    /// The mean length of a loss burst in packets; nil: independent losses.
    public var burstLength: Double?
    public var rateKbps: Double?
    public var queueMs: Double = 200

    public static let clean = Impairment()

    public init() {}

    public init(spec: String) throws(ImpairmentError) {
        let trimmed = spec.trimmingWhitespace
        guard !trimmed.isEmpty, trimmed != "clean" else { return }
        for item in trimmed.split(separator: ",") {
            let parts = item.split(separator: "=", maxSplits: 1).map { String($0).trimmingWhitespace }
            let key = parts[0], value = parts.count > 1 ? parts[1] : nil
            switch (key, value) {
            case ("reorder", nil): reorder = true
            case ("delay", let value?): delayMs = try Self.milliseconds(value, key)
            case ("jitter", let value?): jitterMs = try Self.milliseconds(value, key)
            case ("queue", let value?): queueMs = try Self.milliseconds(value, key)
            case ("loss", let value?): lossPct = try Self.percent(value, key)
            case ("burst", let value?):
                let halves = value.split(separator: ":", maxSplits: 1).map(String.init)
                guard halves.count == 2, let length = Double(halves[1]), length >= 1, length <= 1_000 else {
                    throw ImpairmentError("burst takes <loss>%:<mean burst length 1–1000>, e.g. burst=10%:3; got \(value)")
                }
                lossPct = try Self.percent(halves[0], key)
                burstLength = length
                // The chain enters its bad state with p = loss / (length · (1 − loss)), which must be a probability.
                let loss = lossPct / 100
                guard loss < 1, loss / (length * (1 - loss)) <= 1 else {
                    throw ImpairmentError("burst=\(value) cannot be made: that much loss needs longer bursts")
                }
            case ("rate", let value?):
                let number = value.hasSuffix("kbit") ? String(value.dropLast(4)) : value
                guard let kbps = Double(number), kbps > 0, kbps <= 10_000_000 else {
                    throw ImpairmentError("rate takes kilobits per second, e.g. rate=24kbit; got \(value)")
                }
                rateKbps = kbps
            default:
                throw ImpairmentError("unknown impairment '\(item)': use delay, jitter, reorder, loss, burst, rate, queue (e.g. loss=5%,jitter=30ms)")
            }
        }
    }

    /// The spec that parses back to this impairment.
    public var description: String {
        var parts: [String] = []
        if delayMs > 0 { parts.append("delay=\(Self.format(delayMs))ms") }
        if jitterMs > 0 { parts.append("jitter=\(Self.format(jitterMs))ms") }
        if reorder { parts.append("reorder") }
        if let burstLength { parts.append("burst=\(Self.format(lossPct))%:\(Self.format(burstLength))") }
        else if lossPct > 0 { parts.append("loss=\(Self.format(lossPct))%") }
        if let rateKbps { parts.append("rate=\(Self.format(rateKbps))kbit") }
        if rateKbps != nil || queueMs != 200 { parts.append("queue=\(Self.format(queueMs))ms") }
        return parts.isEmpty ? "clean" : parts.joined(separator: ",")
    }

    private static func milliseconds(_ text: String, _ key: String) throws(ImpairmentError) -> Double {
        let number = text.hasSuffix("ms") ? String(text.dropLast(2)) : text
        guard let value = Double(number), value >= 0, value <= 60_000 else {
            throw ImpairmentError("\(key) takes milliseconds from 0 to 60000, e.g. \(key)=30ms; got \(text)")
        }
        return value
    }

    private static func percent(_ text: String, _ key: String) throws(ImpairmentError) -> Double {
        let number = text.hasSuffix("%") ? String(text.dropLast()) : text
        guard let value = Double(number), value >= 0, value <= 100 else {
            throw ImpairmentError("\(key) takes a percentage from 0 to 100, e.g. \(key)=5%; got \(text)")
        }
        return value
    }

    private static func format(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(value)
    }
}

public struct ImpairmentError: Error, CustomStringConvertible, Sendable {
    public var description: String
    init(_ description: String) { self.description = description }
}

extension String {
    var trimmingWhitespace: String {
        String(drop { $0.isWhitespace }.reversed().drop { $0.isWhitespace }.reversed())
    }
}
