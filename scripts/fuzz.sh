#!/usr/bin/env bash
# Searches for inputs that break Parley's decoders: each fuzz target (Sources/ParleyFuzzTargets) under
# libFuzzer with AddressSanitizer, for a given time each.
#
#   scripts/fuzz.sh                        every target, 60 s each
#   scripts/fuzz.sh --seconds 600 token    one target, ten minutes
#   scripts/fuzz.sh --list                 the targets
#   scripts/fuzz.sh --jobs 2 …             two targets at a time (each a process of its own: CI's two cores)
#   scripts/fuzz.sh --build-all …          build everything of the AddressSanitizer build first, not only
#                                          parley-fuzz (CI: after a build of everything, asking for one
#                                          product plans another build, and relinks it and then the tests)
#
# The build is scripts/asan-build.sh's (.build-asan, shared with scripts/sanitize.sh address: every
# package instrumented; a first one on two cores takes 15 minutes or more). Each target's corpus
# grows in .build-asan/fuzz/corpus/TARGET from the seeds
# (Fuzz/seeds, the protocol's golden frames). An input that crashes a target or breaks one of its
# rules is saved in Fuzz/findings/TARGET/: commit it with the fix, and the test suite replays it
# from then on (Tests/ParleyFuzzTests). `swift run parley-fuzz TARGET FILE` replays one by hand.
# A finding fails the run, and so does a target that did not search: no libFuzzer run statistics.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
jobs=1
targets=()
build=(--product parley-fuzz)
all=(client-frame server-frame http-body token sdp wav janus hub)
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --list) printf '%s\n' "${all[@]}"; exit 0 ;;
    --build-all) build=(--build-tests); shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "scripts/fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if ! printf '%s\n' "${all[@]}" | grep -qx "$1"; then
        echo "scripts/fuzz.sh: no target '$1'; targets: ${all[*]}" >&2; exit 2
      fi
      targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

scripts/setup.sh
scripts/asan-build.sh "${build[@]}"
binary=.build-asan/debug/parley-fuzz

# A target counts as searched only on libFuzzer's own word: its closing statistics ("#N DONE cov: C
# ft: …" and "Done N runs in S second(s)") with runs and coverage above zero, and a clean exit. A
# binary that is not libFuzzer's (a plain build takes the arguments for files and stops), or a build
# without coverage, prints none of these, and "found nothing" from it would mean nothing.
mkdir -p .build-asan/fuzz/logs
# One target: fuzzes it, prints what is worth a CI log's space, and ends with a last line that says
# how it went: "result found", "result failed" or "result searched".
fuzz_target() {
  local target="$1" corpus findings log before after status runs coverage
  local -a statuses
  corpus=.build-asan/fuzz/corpus/$target
  findings=Fuzz/findings/$target
  log=.build-asan/fuzz/logs/$target.txt
  mkdir -p "$corpus" "$findings"
  case "$target" in
    client-frame) cp Tests/ParleyProtocolTests/Golden/client-* "$corpus"/ ;;
    server-frame) cp Tests/ParleyProtocolTests/Golden/server-* "$corpus"/ ;;
    *) cp Fuzz/seeds/"$target"/* "$corpus"/ ;;
  esac
  echo "== $target: $seconds s (corpus $corpus, $(ls "$corpus" | wc -l) inputs)"
  before=$(ls "$findings" | wc -l)
  # -close_fd_mask=1: a target prints nothing worth reading; libFuzzer's own lines go to stderr.
  # SWIFT_BACKTRACE: the runtime's crash handler trips AddressSanitizer after a finding; libFuzzer says enough.
  # The whole output goes to $log; the lines worth a CI log's space are shown. The fuzzer's status
  # is the pipeline's first (errexit off around it, so that a failure is reported, not fatal).
  set +e
  SWIFT_BACKTRACE=enable=no PARLEY_FUZZ_TARGET=$target "$binary" "$corpus" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
    -rss_limit_mb=4096 -artifact_prefix="$findings/" -print_final_stats=1 -close_fd_mask=1 2>&1 \
    | tee "$log" \
    | grep -E "^#[0-9]+[[:space:]]+(DONE|INITED)|^Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss|ERROR|SUMMARY|Test unit written|FuzzFailure|Fatal error"
  statuses=("${PIPESTATUS[@]}")
  set -e
  status=${statuses[0]}
  runs=$(sed -nE 's/^Done ([0-9]+) runs in [0-9]+ second.*/\1/p' "$log" | tail -1)
  coverage=$(sed -nE 's/^#[0-9]+[[:space:]]+DONE[[:space:]]+cov: ([0-9]+) ft: [0-9]+.*/\1/p' "$log" | tail -1)
  after=$(ls "$findings" | wc -l)
  if [ "$after" -gt "$before" ] || grep -q "Test unit written to" "$log"; then
    echo "   FOUND (exit status $status): replay with: swift run parley-fuzz $target FILE"
    # libFuzzer names the reproducer it wrote ("Test unit written to PATH").
    sed -nE 's/.*Test unit written to (.*)$/   reproducer: \1/p' "$log"
    echo "result found"
  elif [ "$status" -ne 0 ]; then
    echo "   FAILED: the fuzzer exited with status $status without a finding; its last lines ($log):"
    tail -15 "$log" | sed 's/^/     /'
    echo "result failed"
  elif [ -z "$runs" ]; then
    echo "   FAILED: no libFuzzer run statistics (\"Done N runs\"): the target did not run under libFuzzer ($log)"
    tail -15 "$log" | sed 's/^/     /'
    echo "result failed"
  elif [ "$runs" -eq 0 ]; then
    echo "   FAILED: libFuzzer ran no inputs ($log)"
    echo "result failed"
  elif [ -z "$coverage" ] || [ "$coverage" -eq 0 ]; then
    # libFuzzer leaves "cov:" out of its "#N DONE" line when it has no coverage counters to read.
    echo "   FAILED: no coverage in libFuzzer's statistics: the build is not instrumented for it ($log)"
    echo "result failed"
  else
    echo "   ran $runs inputs, coverage $coverage"
    echo "result searched"
  fi
}

# Up to $jobs targets at a time, each reporting to a file of its own; the reports are shown in the
# targets' order once all have run.
echo "== fuzzing ${#targets[@]} targets for $seconds s each, $jobs at a time"
found=0
failed=()
for target in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_target "$target" > ".build-asan/fuzz/logs/$target.report" 2>&1 &
done
wait
for target in "${targets[@]}"; do
  report=.build-asan/fuzz/logs/$target.report
  grep -v "^result " "$report" || true
  case "$(tail -1 "$report")" in
    "result found") found=1 ;;
    "result searched") ;;
    *) failed+=("$target") ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "scripts/fuzz.sh: did not search: ${failed[*]} (above)" >&2
  exit 1
fi
[ "$found" -eq 0 ] && echo "== nothing found" || { echo "== findings saved: fix them, and commit each input with its fix"; exit 1; }
