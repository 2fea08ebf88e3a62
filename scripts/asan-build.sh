#!/usr/bin/env bash
# The AddressSanitizer build (.build-asan) that scripts/sanitize.sh tests in and scripts/fuzz.sh
# fuzzes with: one build, so that CI compiles the package under AddressSanitizer once, not twice.
#
#   scripts/asan-build.sh [swift build arguments…]     e.g. --build-tests, or --product parley-fuzz
#
# Swift code gets AddressSanitizer and libFuzzer's coverage counters (the -sanitize-coverage that
# swiftc's -sanitize=fuzzer implies, without linking libFuzzer's main into every executable); the
# C targets get AddressSanitizer, the same coverage and UndefinedBehaviorSanitizer in trap mode (it
# needs no runtime of its own; swiftc has no UBSan on Linux, and Swift traps on overflow and bad
# casts by itself). PARLEY_LIBFUZZER, the path of libFuzzer without its main (the toolchain's
# compiler-rt), makes Package.swift link parley-fuzz alone with it; its main runs libFuzzer's driver.
# `swift test --skip-build` must get the same arguments and environment: `--print-flags` prints the
# arguments, and PARLEY_LIBFUZZER must be exported as here (scripts/sanitize.sh does both).
set -euo pipefail
cd "$(dirname "$0")/.."

PARLEY_LIBFUZZER=$(ls "$(dirname "$(readlink -f "$(command -v swiftc)")")"/../lib/clang/*/lib/linux/libclang_rt.fuzzer_no_main-"$(uname -m)".a 2>/dev/null | head -1)
if [ -z "$PARLEY_LIBFUZZER" ]; then
  echo "scripts/asan-build.sh: the Swift toolchain has no libFuzzer (lib/clang/*/lib/linux/libclang_rt.fuzzer_no_main-$(uname -m).a)" >&2
  exit 1
fi
export PARLEY_LIBFUZZER
asan_flags=(
  --scratch-path .build-asan
  --sanitize=address
  -Xswiftc -sanitize-coverage=edge,indirect-calls,trace-cmp,pc-table,inline-8bit-counters
  -Xcc -fsanitize=undefined -Xcc -fsanitize-trap=undefined -Xcc -fsanitize=fuzzer-no-link
)
case "${1:-}" in
  --print-flags) printf '%s\n' "${asan_flags[@]}"; exit 0 ;;
  --print-libfuzzer) echo "$PARLEY_LIBFUZZER"; exit 0 ;;
esac
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== building under AddressSanitizer (.build-asan: $*; a first build on two cores takes 15 minutes or more)"
if ! swift build "${asan_flags[@]}" "$@" > "$log" 2>&1; then
  grep -E "error" "$log" | sort -u | head -20 >&2 || true
  echo "scripts/asan-build.sh: the build failed (above)" >&2
  exit 1
fi
tail -1 "$log"
