#!/usr/bin/env bash
# Call setup on an impaired wire: from the answer to both people hearing each other, Parley
# (connecting while ringing, and classic) beside Chromium's classic flow and aiortc, in one run through one
# Parley server over `parley-wire`. See docs/benchmarks.md, "Call setup on a real path".
#   scripts/bench-setup.sh                       every cell and pair, 5 calls each
#   scripts/bench-setup.sh --calls 10 --report   and the table and plot in docs/benchmarks.md
#   scripts/bench-setup.sh --cells "100 ms" --pairs parley-parley,chromium-chromium
#   PARLEY_BUILD=debug scripts/bench-setup.sh …  the debug build instead of a release build
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "bench-setup.sh needs root (network namespaces and TUN devices)" >&2
  exit 1
fi
scripts/setup.sh --aiortc chromium python3-pip
python3 -c 'import numpy, matplotlib' 2>/dev/null || {
  echo "== installing numpy and matplotlib (pip)"
  python3 -m pip install -q numpy matplotlib 2>/dev/null || python3 -m pip install -q --break-system-packages numpy matplotlib
}
configuration="${PARLEY_BUILD:-release}"
if [ "$configuration" = debug ]; then
  swift build --product parley && swift build --product parley-wire
  bin=.build/debug
else
  echo "== building parley and parley-wire (release; a first build on two cores takes about 20 minutes)"
  swift build -c release --scratch-path .build-release --product parley
  swift build -c release --scratch-path .build-release --product parley-wire
  bin=.build-release/release
fi
# A private network namespace with only loopback holds the benchmark's own two namespaces' wire.
exec unshare --net bash -c 'ip link set lo up && cd scripts/quality && exec python3 setup.py --parley "$0/parley" --wire "$0/parley-wire" --build "$1" "${@:2}"' "$PWD/$bin" "$configuration" "$@"
