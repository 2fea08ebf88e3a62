#!/usr/bin/env bash
# AudioBridge rooms of 2, 4, 8, 16 Linux clients on a private Janus: join and webrtcup times, Janus
# and client CPU. Builds a release `parley`, installs Janus when missing, and runs the benchmark in
# a private network namespace (it makes a veth pair there; Janus never uses loopback).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh janus iproute2 procps
echo "== building parley (release; a first build on two cores takes about 20 minutes)"
swift build -c release --scratch-path .build-release --product parley
if [ "$(id -u)" -ne 0 ]; then
  echo "bench-rooms.sh needs root for a network namespace (unshare --net)" >&2
  exit 1
fi
exec unshare --net bash -c 'ip link set lo up && exec .build-release/release/parley bench rooms "$@"' bench "$@"
