#!/usr/bin/env bash
# Builds Parley and runs every test. Installs what the build and the tests need on a fresh Debian machine.
#
# The tests run in a network namespace of their own with only loopback up: headless Chromium
# gathers ICE candidates on every interface it sees, and nothing a test starts may reach beyond
# this machine. Browser and Janus tests fail (rather than skip) here if they cannot run. Tests run
# one at a time: real calls, Chromium and Janus side by side on two cores starve each other's timers.
#
#   scripts/test.sh [swift test arguments…]     e.g. --filter CallTests
#   scripts/test.sh --build-only                 install and build, no tests
#   scripts/test.sh --no-build […]               the tests of the last build (.ci/run builds first,
#                                                then builds for the sanitizers beside the tests)
set -euo pipefail
cd "$(dirname "$0")/.."

step=all
case "${1:-}" in
  --build-only) step=build; shift ;;
  --no-build) step=test; shift ;;
esac

if [ "$step" != test ]; then
  scripts/setup.sh --tests
  echo "== building (a first build on two cores takes several minutes)"
  mkdir -p .build
  swift build --build-tests 2>&1 | tee .build/build-output.txt
  # Parley's own sources build without a warning, and stay so: a new one fails the run. (An
  # incremental build shows only the files it recompiled; CI's fresh clone compiles them all.)
  # Warnings inside a macro's expansion (#expect, #require) name the macro, not the file.
  if grep -E "^($PWD/(Sources|Tests)/[^:]+|macro expansion #[A-Za-z]+):[0-9]+:[0-9]+: warning:" .build/build-output.txt; then
    echo "scripts/test.sh: the warnings above come from Parley's own sources; fix them" >&2
    exit 1
  fi
  # Two closures of one function given one name: Swift 6.3 may number a closure written inside a
  # macro's argument (#expect) like another one beside it, and LLVM then renames one of the two,
  # so a call may reach the other. A test here once sent call.accept where its source said
  # call.state, and checked something else than it said. Such a pair fails the run, named.
  command -v nm >/dev/null || { echo "scripts/test.sh: nm (binutils) is missing; scripts/setup.sh --tests installs it" >&2; exit 1; }
  clashes=$(find .build/debug/ -name '*.swift.o' -path '*Parley*' -print0 | xargs -0 -r nm --defined-only 2>/dev/null \
    | awk '{print $NF}' | grep -E '^\$s.*\.[0-9]+$' | swift demangle \
    | grep -E '^(partial apply forwarder for )?closure #[0-9]+ .* with unmangled suffix' || true)
  if [ -n "$clashes" ]; then
    echo "$clashes" >&2
    echo "scripts/test.sh: the compiler named each closure above like another of its function, so a call may reach the wrong one;" \
      "move the closure out of the macro's argument (or reorder them) until this is empty" >&2
    exit 1
  fi
  [ "$step" = all ] || exit 0
fi
# Network namespaces a killed run left behind. Tests name theirs "parley-…" ending in their process's
# ID modulo 10 000 (TunWire's, LANLab's), and remove them when they finish; `ip netns add` keeps
# each in /run/netns until removed. One is stale when no live process has that number: one that
# may still be in use (another run's, here or under a sanitizer) is kept, and so is every
# namespace not named so, the tools' (parley-wire's parley-a, the benchmark's parley-qa) and others'.
remove_stale_namespaces() {
  [ "$(id -u)" -eq 0 ] && [ -d /run/netns ] || return 0
  local live name inside
  live=" $(ls /proc | grep -E '^[0-9]+$' | awk '{ printf "%d ", $1 % 10000 }')"
  for name in $(ip netns list | awk '{ print $1 }' | grep -E '^parley-[a-z0-9-]*[a-z-][0-9]+$'); do
    case "$live" in *" ${name##*[!0-9]} "*) continue ;; esac
    # Processes a test started inside (LANLab's D-Bus and Avahi) outlive the name: say so, leave them.
    inside=$(ip netns pids "$name" 2>/dev/null | xargs)
    echo "== removing the network namespace $name, left by a run that ended without its cleanup${inside:+ (still inside: processes $inside)}"
    ip netns delete "$name" || echo "scripts/test.sh: could not remove the network namespace $name" >&2
  done
}
remove_stale_namespaces

echo "== testing"
export PARLEY_REQUIRE_ALL_TESTS=1
log=.build/test-output.txt
run_tests() {
  if [ "$(id -u)" -eq 0 ] && unshare --net true 2>/dev/null; then
    unshare --net sh -c 'ip link set lo up && exec swift test --skip-build --disable-xctest --no-parallel "$@"' sh "$@"
  else
    echo "scripts/test.sh: cannot make a private network namespace (unshare --net needs root): the browser tests will fail and say why;" >&2
    echo "  run 'swift test' yourself to skip them instead" >&2
    swift test --skip-build --disable-xctest --no-parallel "$@"
  fi
}
status=0
run_tests "$@" 2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
  # A CI log is often read from its tail: repeat what failed there, with each issue's detail.
  echo "== what failed (the whole output is in $log)"
  grep -E -A6 "recorded an issue|✘ Test .*\) failed|Exited with|Fatal error" "$log" | grep -v "^◇\|passed after" | head -80 || true
fi
exit "$status"
