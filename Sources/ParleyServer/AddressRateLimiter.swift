import HTTPTypes
import Hummingbird
import NIOConcurrencyHelpers

/// Requests per remote address, over HTTP and WebSocket upgrades alike: a token bucket per address
/// (`Limits.httpRequestsPerSecond` sustained, `Limits.httpBurst` at once). A request over the limit
/// is answered 429 with `Retry-After` before any work is done for it — before its token is verified
/// or its body read. Off when the rate is 0.
///
/// The table is bounded: past `maxAddresses` it forgets the addresses whose buckets have refilled,
/// then, if it must, those nearest to full, down to nine tenths of the bound (so a flood from many
/// addresses pays for a sort once per tenth of the table, not per request); such a flood costs
/// memory up to the bound and no more.
final class AddressRateLimiter: Sendable {
    private struct Bucket {
        var tokens: Double
        var refilled: Duration
    }

    let rate: Double
    let burst: Double
    let maxAddresses: Int
    private let buckets = NIOLockedValueBox([String: Bucket]())
    private let origin = ContinuousClock.now

    init(rate: Double, burst: Double, maxAddresses: Int = 100_000) {
        self.rate = rate
        self.burst = max(1, burst)
        self.maxAddresses = max(1, maxAddresses)
    }

    var isEnabled: Bool { rate > 0 }

    /// Whose bucket a request counts against: the peer, or for a request from a trusted proxy the
    /// client its `X-Forwarded-For` names last (the entry that proxy added). IPv6 addresses count
    /// by their /64, which one subscriber holds whole.
    static func client(peer: String, forwardedFor: String?, trustedProxies: [String]) -> String {
        var address = peer
        if trustedProxies.contains(peer), let forwarded = forwardedFor?.split(separator: ",").last {
            let named = forwarded.trimmingCharacters(in: .whitespaces)
            if !named.isEmpty { address = named }
        }
        return key(address)
    }

    /// An IPv4 address as it is; an IPv6 address as its first four groups (a /64).
    static func key(_ address: String) -> String {
        var bare = address
        if bare.hasPrefix("::ffff:"), bare.contains(".") { return String(bare.dropFirst(7)) }
        guard bare.contains(":") else { return bare }
        if let zone = bare.firstIndex(of: "%") { bare = String(bare[..<zone]) }
        // Expand "::" to the groups it stands for, then keep four.
        let halves = bare.components(separatedBy: "::")
        let head = halves[0].split(separator: ":").map(String.init)
        let tail = halves.count > 1 ? halves[1].split(separator: ":").map(String.init) : []
        let groups = head + Array(repeating: "0", count: max(0, 8 - head.count - tail.count)) + tail
        return groups.prefix(4).map { String(Int($0, radix: 16) ?? 0, radix: 16) }.joined(separator: ":") + "::/64"
    }

    /// nil: admitted; otherwise refused, and how long until one more request would be admitted.
    func admit(_ address: String) -> Duration? {
        admit(address, now: ContinuousClock.now - origin)
    }

    func admit(_ address: String, now: Duration) -> Duration? {
        guard isEnabled else { return nil }
        return buckets.withLockedValue { buckets in
            var bucket = buckets[address] ?? Bucket(tokens: burst, refilled: now)
            if now > bucket.refilled {
                bucket.tokens = min(burst, bucket.tokens + rate * seconds(now - bucket.refilled))
                bucket.refilled = now
            }
            defer {
                buckets[address] = bucket
                if buckets.count > maxAddresses {
                    Self.forget(in: &buckets, sparing: address, now: now, rate: rate, burst: burst, keep: maxAddresses)
                }
            }
            guard bucket.tokens >= 1 else { return .seconds((1 - bucket.tokens) / rate) }
            bucket.tokens -= 1
            return nil
        }
    }

    /// How many addresses the table holds (for tests).
    var addressCount: Int { buckets.withLockedValue { $0.count } }

    /// Forgets the buckets that have refilled (they would start full anyway), then, if the table is
    /// still too big, those nearest to full, never the address being admitted.
    private static func forget(in buckets: inout [String: Bucket], sparing address: String, now: Duration,
                               rate: Double, burst: Double, keep bound: Int) {
        func level(_ bucket: Bucket) -> Double { bucket.tokens + rate * seconds(now - bucket.refilled) }
        buckets = buckets.filter { $0.key == address || level($0.value) < burst }
        let keep = max(1, bound * 9 / 10)
        guard buckets.count > keep else { return }
        let fullest = buckets.filter { $0.key != address }.sorted { level($0.value) > level($1.value) }
        for (key, _) in fullest.prefix(buckets.count - keep) { buckets.removeValue(forKey: key) }
    }
}

private func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

/// Counts every request but `/healthz` (load balancers poll it) against its client's bucket.
struct AddressRateLimitMiddleware<Context: RemoteAddressRequestContext>: RouterMiddleware {
    let limiter: AddressRateLimiter
    let trustedProxies: [String]

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard limiter.isEnabled, request.uri.path != "/healthz", let peer = context.remoteAddress?.ipAddress else {
            return try await next(request, context)
        }
        let client = AddressRateLimiter.client(peer: peer, forwardedFor: request.headers[.xForwardedFor], trustedProxies: trustedProxies)
        guard let wait = limiter.admit(client) else { return try await next(request, context) }
        let seconds = AddressRateLimiter.retryAfter(wait)
        throw APIError(.tooManyRequests, .rateLimited, "too many requests from this address; retry in \(seconds) s",
                       headers: [.retryAfter: "\(seconds)"])
    }
}

extension AddressRateLimiter {
    /// Whole seconds for `Retry-After`, at least 1.
    static func retryAfter(_ wait: Duration) -> Int { max(1, Int(seconds(wait).rounded(.up))) }
}

extension HTTPField.Name {
    static let xForwardedFor = HTTPField.Name("X-Forwarded-For")!
}
