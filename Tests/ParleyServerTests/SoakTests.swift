import Foundation
import Testing

/// The chaos soak, short: `parley bench soak` runs random call flows from a dozen devices through a
/// proxy that cuts connections and delays frames while the server is killed and restarted, then
/// checks that no call record was lost or made up, every call ended once with a reason, nothing
/// rings, and memory came back. The long run is `scripts/soak.sh` (docs/benchmarks.md has its figures).
@Suite("Chaos soak", .timeLimit(.minutes(10)))
struct SoakTests {
    @Test func aShortSoakKeepsEveryInvariant() async throws {
        let (status, printed) = try ServeProcessTests.parley(["bench", "soak", "--seconds", "25", "--users", "8", "--kill-every", "6",
                                                              "--cut-every", "0.5", "--seed", "7"])
        #expect(status == 0, "\(printed)")
        #expect(printed.contains("every check held"), "\(printed)")
        // The chaos happened: the server was stopped at least once, and connections were cut.
        #expect(printed.contains("started again"), "\(printed)")
        let stored = printed.firstMatch(of: /(\d+) calls stored/).flatMap { Int($0.1) } ?? 0
        #expect(stored >= 10, "enough calls to mean something: \(printed)")
    }
}
