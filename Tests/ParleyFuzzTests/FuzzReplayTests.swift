import Foundation
import ParleyFuzzTargets
import ParleyWire
import Testing

/// Every fuzz target over its seeds, every finding saved from a fuzzing run (each a regression test),
/// and a few thousand inputs made from the seeds by the mutations libFuzzer starts with: the
/// same checks `scripts/fuzz.sh` runs for as long as it is given, in every test run.
@Suite("Fuzz targets")
struct FuzzReplayTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static func files(in folder: String, for target: FuzzTarget) -> [URL] {
        let url = root.appendingPathComponent(folder)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: url.path)) ?? []
        return names.sorted().filter(target.takes(seed:)).map { url.appendingPathComponent($0) }
    }

    static func seeds(_ target: FuzzTarget) -> [Data] {
        target.seedFolders.flatMap { files(in: $0, for: target) }.compactMap { FileManager.default.contents(atPath: $0.path) }
    }

    @Test(arguments: FuzzTarget.allCases)
    func seedsAndSavedFindingsPass(_ target: FuzzTarget) async throws {
        let seeds = Self.seeds(target)
        #expect(seeds.count >= 2, "\(target.rawValue) needs seeds in \(target.seedFolders)")
        for url in target.seedFolders.flatMap({ Self.files(in: $0, for: target) }) + Self.files(in: "Fuzz/findings/\(target.rawValue)", for: target) {
            let data = try Data(contentsOf: url)
            do { try await target.run(data) } catch { Issue.record("\(url.lastPathComponent): \(error)") }
        }
    }

    @Test(arguments: FuzzTarget.allCases)
    func mutatedSeedsKeepEveryRule(_ target: FuzzTarget) async {
        var random = Mutator(seed: 0x7061726c6579)
        var failures: [String] = []
        for seed in Self.seeds(target) {
            // 300 a seed, about 20 000 in all: libFuzzer itself searches far wider in CI's fuzz phase.
            for _ in 0..<300 {
                let input = random.mutate(seed)
                do { try await target.run(input) } catch {
                    failures.append("\(error) — input (base64): \(input.base64EncodedString())")
                }
            }
        }
        #expect(failures.isEmpty, "\(failures.prefix(3).joined(separator: "\n"))")
    }

    /// The token seed is a token the fuzz key signed: without one, the fuzzer never reaches the
    /// claims behind a good signature.
    @Test func theTokenSeedVerifies() async throws {
        let seeds = Self.seeds(.token)
        #expect(!seeds.isEmpty)
        for seed in seeds { #expect(await FuzzTarget.tokenVerifies(seed)) }
    }
}

/// libFuzzer's first mutations, from a seeded generator (the wire's): flip, set, insert, erase, cut,
/// duplicate a run, splice in a byte that parsers treat specially.
struct Mutator {
    var random: SeededRandom
    init(seed: UInt64) { random = SeededRandom(seed: seed) }

    mutating func below(_ bound: Int) -> Int { bound <= 0 ? 0 : Int(random.next() % UInt64(bound)) }

    mutating func mutate(_ seed: Data) -> Data {
        var bytes = [UInt8](seed)
        let special: [UInt8] = [0, 0xFF, 0x7F, 0x80, UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "{"), UInt8(ascii: "}"),
                                UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: ","), UInt8(ascii: ":"), UInt8(ascii: "-"),
                                UInt8(ascii: "9"), UInt8(ascii: "e"), UInt8(ascii: "."), UInt8(ascii: "\n"), UInt8(ascii: "\r"), 0xC3, 0xE2]
        for _ in 0...below(4) {
            let choice = bytes.isEmpty ? 2 : below(6)
            switch choice {
            case 0: bytes[below(bytes.count)] ^= UInt8(1 << below(8))
            case 1: bytes[below(bytes.count)] = special[below(special.count)]
            case 2: bytes.insert(special[below(special.count)], at: below(bytes.count + 1))
            case 3: bytes.remove(at: below(bytes.count))
            case 4: bytes.removeLast(below(bytes.count))
            default:
                let start = below(bytes.count)
                let run = Array(bytes[start..<min(bytes.count, start + 1 + below(16))])
                bytes.insert(contentsOf: run, at: below(bytes.count + 1))
            }
        }
        return Data(bytes)
    }
}
