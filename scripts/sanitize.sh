#!/usr/bin/env bash
# Parley's tests under the sanitizers, each in a build of its own:
#
#   scripts/sanitize.sh thread    ThreadSanitizer over the unit and integration tests: the server,
#                                 the SDK core, the protocol, the Janus client, the fuzz targets
#                                 (.build-tsan)
#   scripts/sanitize.sh address   AddressSanitizer over everything and UndefinedBehaviorSanitizer
#                                 (trap mode) over the C edge (CParleyGst), with real calls: the
#                                 engine's tests (audio, video), calls with data channels and
#                                 recordings, GStreamer and OpenSSL underneath (.build-asan,
#                                 scripts/asan-build.sh: the build scripts/fuzz.sh fuzzes with)
#   scripts/sanitize.sh           both
#   scripts/sanitize.sh address --filter CallTests    what runs, narrowed (swift test --filter)
#   scripts/sanitize.sh address --skip REGEX          and tests left out (swift test --skip)
#
# A report stops the run (halt_on_error) and fails it, as does a run in which no test ran (a filter
# that matches nothing). GStreamer's own leaks are by design (its registry, its type system), so
# LeakSanitizer is off; what ASan checks is every access. A first build of each takes 15 minutes or
# more on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."

kinds=()
skip=()
while [ $# -gt 0 ]; do
  case "$1" in
    thread|address) kinds+=("$1"); shift ;;
    --filter) filter="$2"; shift 2 ;;
    --skip) skip=(--skip "$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "scripts/sanitize.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#kinds[@]} -gt 0 ] || kinds=(thread address)

scripts/setup.sh --tests
in_namespace() {
  if [ "$(id -u)" -eq 0 ] && unshare --net true 2>/dev/null; then
    unshare --net sh -c 'ip link set lo up && exec "$@"' sh "$@"
  else
    "$@"
  fi
}

status=0
for kind in "${kinds[@]}"; do
  case "$kind" in
    thread)
      scratch=.build-tsan
      flags=(--scratch-path "$scratch" --sanitize=thread)
      unset PARLEY_LIBFUZZER
      tests="${filter:-ParleyServerTests|ParleyKitTests|ParleyProtocolTests|ParleyJanusTests|ParleyFuzzTests|ParleyWireTests}"
      ;;
    address)
      # The build shared with scripts/fuzz.sh: AddressSanitizer, and UBSan on the C edge.
      scratch=.build-asan
      printed=$(scripts/asan-build.sh --print-flags)
      mapfile -t flags <<< "$printed"
      PARLEY_LIBFUZZER=$(scripts/asan-build.sh --print-libfuzzer)
      export PARLEY_LIBFUZZER
      tests="${filter:-ParleyMediaTests.CallTests|ParleyMediaTests.EngineTests|ParleyMediaTests.CallRecordingTests}"
      ;;
  esac
  if [ "$kind" = address ]; then
    scripts/asan-build.sh --build-tests
  else
    echo "== $kind: building ($scratch)"
    log=$(mktemp)
    if ! swift build --build-tests "${flags[@]}" > "$log" 2>&1; then
      grep -E "error" "$log" | sort -u | head -20 >&2
      echo "scripts/sanitize.sh: the $kind build failed (above)" >&2
      rm -f "$log"; exit 1
    fi
    rm -f "$log"
  fi
  echo "== $kind: testing $tests"
  output=$scratch/sanitize-output.txt
  # The test run's own status is the pipeline's first (errexit off around it, so a failure is
  # reported below, not fatal here).
  set +e
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ASAN_OPTIONS="detect_leaks=0 halt_on_error=1 detect_stack_use_after_return=0" \
    UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1" \
    PARLEY_REQUIRE_ALL_TESTS=1 \
    in_namespace swift test --skip-build "${flags[@]}" --disable-xctest --no-parallel --filter "$tests" "${skip[@]}" \
    2>&1 | tee "$output" | grep -E "✘|WARNING: ThreadSanitizer|ERROR: AddressSanitizer|runtime error:|SUMMARY|Test run with"
  statuses=("${PIPESTATUS[@]}")
  set -e
  # A run is clean only if it ran tests: a filter that matches none passes with "Test run with 0
  # tests", which says nothing about the code. Swift Testing's summary counts what ran.
  ran=$(sed -nE 's/.*Test run with ([0-9]+) tests?.*/\1/p' "$output" | tail -1)
  if grep -qE "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|runtime error:|✘ Test run|Exited with" "$output" \
     || ! grep -q "✔ Test run with" "$output" || [ "${statuses[0]}" -ne 0 ]; then
    echo "== $kind: FOUND something (exit status ${statuses[0]}; the whole output is in $output)"
    status=1
  elif [ "${ran:-0}" -eq 0 ]; then
    echo "== $kind: FAILED: no test ran (the filter '$tests' matches none; the whole output is in $output)"
    status=1
  else
    echo "== $kind: clean ($ran tests)"
  fi
done
exit "$status"
