import Foundation
import ParleyFuzzTargets

// Built in the AddressSanitizer build (scripts/asan-build.sh: PARLEY_LIBFUZZER set, libFuzzer linked
// without its main): this main runs libFuzzer's driver on `fuzzOne`, and PARLEY_FUZZ_TARGET names the
// target. (SwiftPM renames an executable's entry point unless it is told to link libFuzzer's main,
// which it would then do in every executable and test bundle of the build.) Built plainly (as
// `swift build` builds it), `parley-fuzz TARGET FILE…` feeds files to a target once each: how a
// finding is replayed.

#if PARLEY_LIBFUZZER
/// Runs `body` to its end from a thread outside Swift's cooperative pool (libFuzzer's, or main).
private func waitFor(_ body: @escaping @Sendable () async -> Void) {
    let done = DispatchSemaphore(value: 0)
    Task.detached {
        await body()
        done.signal()
    }
    done.wait()
}

private let target: FuzzTarget = {
    let name = ProcessInfo.processInfo.environment["PARLEY_FUZZ_TARGET"] ?? ""
    guard let target = FuzzTarget(rawValue: name) else {
        FileHandle.standardError.write(Data("PARLEY_FUZZ_TARGET must be one of: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", "))\n".utf8))
        exit(2)
    }
    return target
}()

/// libFuzzer's entry for a program with a main of its own (compiler-rt's FuzzerInterface.h).
@_silgen_name("LLVMFuzzerRunDriver")
private func runFuzzerDriver(_ argc: UnsafeMutablePointer<CInt>,
                             _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
                             _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> CInt

@main
struct FuzzDriver {
    static func main() {
        var argc = CommandLine.argc
        var argv = Optional(CommandLine.unsafeArgv)
        exit(runFuzzerDriver(&argc, &argv) { data, count in fuzzOne(UnsafeRawPointer(data), count) })
    }
}

func fuzzOne(_ start: UnsafeRawPointer?, _ count: Int) -> CInt {
    let data = start.map { Data(bytes: $0, count: count) } ?? Data()
    let target = target
    if !target.isAsync {
        do { try target.runOnThisThread(data) } catch { fatalError("\(target.rawValue): \(error)") }
        return 0
    }
    waitFor {
        do { try await target.run(data) } catch { fatalError("\(target.rawValue): \(error)") }
    }
    return 0
}
#else
@main
struct FuzzCommand {
    static func main() async {
        let arguments = Array(CommandLine.arguments.dropFirst())
        guard let name = arguments.first, let target = FuzzTarget(rawValue: name), arguments.count > 1 else {
            print("usage: parley-fuzz TARGET FILE…   (targets: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")))")
            print("Feeds each file to the target once. scripts/fuzz.sh builds this with libFuzzer to search for findings.")
            exit(2)
        }
        var failed = 0
        for path in arguments.dropFirst() {
            guard let data = FileManager.default.contents(atPath: path) else {
                print("\(path): cannot be read")
                failed += 1
                continue
            }
            do {
                try await target.run(data)
                print("\(path): passed")
            } catch {
                print("\(path): FAILED: \(error)")
                failed += 1
            }
        }
        exit(failed == 0 ? 0 : 1)
    }
}
#endif
