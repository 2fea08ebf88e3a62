#!/usr/bin/env bash
# Speech quality on impaired networks: Parley ↔ Parley beside Chromium ↔ Chromium (and both mixed
# pairs) through one Parley server over `parley-wire`, scored with PESQ. See docs/quality.md.
#   scripts/bench-quality.sh                    the whole matrix, one call per cell and pair
#   scripts/bench-quality.sh --runs 3 --report  three calls each, medians, and docs/quality.md
#   scripts/bench-quality.sh --cells "loss 10%" --pairs parley-parley
#   PARLEY_BUILD=debug scripts/bench-quality.sh …   the debug build instead of a release build
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "bench-quality.sh needs root (network namespaces and TUN devices)" >&2
  exit 1
fi
scripts/setup.sh chromium espeak-ng sox python3-pip
python3 -c 'import numpy, pesq, matplotlib' 2>/dev/null || {
  echo "== installing numpy, pesq and matplotlib (pip)"
  python3 -m pip install -q numpy pesq matplotlib 2>/dev/null || python3 -m pip install -q --break-system-packages numpy pesq matplotlib
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
exec unshare --net bash -c 'ip link set lo up && cd scripts/quality && exec python3 bench.py --parley "$0/parley" --wire "$0/parley-wire" "$@"' "$PWD/$bin" "$@"
