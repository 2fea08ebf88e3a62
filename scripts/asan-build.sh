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
# casts by itself). PARLEY_LIBFUZZER=1 makes Package.swift link parley-fuzz alone with libFuzzer.
# The same arguments must be given to `swift test --skip-build`: asan_test_flags below.
set -euo pipefail
cd "$(dirname "$0")/.."

export PARLEY_LIBFUZZER=1
asan_flags=(
  --scratch-path .build-asan
  --sanitize=address
  -Xswiftc -sanitize-coverage=edge,indirect-calls,trace-cmp,pc-table,inline-8bit-counters
  -Xcc -fsanitize=undefined -Xcc -fsanitize-trap=undefined -Xcc -fsanitize=fuzzer-no-link
)
if [ "${1:-}" = "--print-flags" ]; then
  printf '%s\n' "${asan_flags[@]}"
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== building under AddressSanitizer (.build-asan: $*; a first build on two cores takes 15 minutes or more)"
if ! swift build "${asan_flags[@]}" "$@" > "$log" 2>&1; then
  grep -E "error" "$log" | sort -u | head -20 >&2
  echo "scripts/asan-build.sh: the build failed (above)" >&2
  exit 1
fi
tail -1 "$log"
