#!/usr/bin/env bash
# Installs the Debian packages Parley builds and runs with, when they are missing:
# SQLite for the server, GStreamer with webrtcbin and libnice for the media engine, Avahi's client
# library for LAN calls (`parley lan`, `call --lan` and `listen --lan` also need avahi-daemon running).
#   scripts/setup.sh                 what `parley demo`, `call` and `listen` need
#   scripts/setup.sh --tests         and what the tests start (coturn, Chromium with chromedriver, Janus, PostgreSQL, HAProxy),
#                                    and aiortc, a third-party WebRTC peer, from PyPI into .build-python
#   scripts/setup.sh --aiortc        only aiortc (and websockets, for the setup benchmark's aiortc callee)
#   scripts/setup.sh chromium        and any other packages named (the call benchmark adds chromium)
set -euo pipefail

cd "$(dirname "$0")/.."
extra=()
aiortc=0
for argument in "$@"; do
  case "$argument" in
    --aiortc) aiortc=1; extra+=(python3-venv) ;;
    --tests) aiortc=1; extra+=(binutils coturn chromium chromium-driver janus postgresql haproxy iproute2 procps util-linux espeak-ng sox avahi-daemon dbus-daemon python3-venv) ;;
    *) extra+=("$argument") ;;
  esac
done

packages=(
  libsqlite3-dev
  libavahi-client-dev
  libssl-dev
  pkg-config
  libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev libgstreamer-plugins-bad1.0-dev libnice-dev
  gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-nice
  gstreamer1.0-tools
  "${extra[@]}"
)

need=()
for package in "${packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || need+=("$package")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${need[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# aiortc: its DTLS client offers only the ECDSA suites RFC 8827 requires, which is what the strict-peer
# test needs (Tests/ParleyMediaTests/StrictDTLSTests.swift); with websockets it is also the setup
# benchmark's third-party callee (scripts/quality/aiortc_peer.py). A virtual environment of the
# project's own, so the system's Python is left as it is.
aiortc_version=1.16.0
websockets_version=13.1
if [ "$aiortc" -eq 1 ] && ! .build-python/bin/python -c "import aiortc, websockets, sys; sys.exit(aiortc.__version__ != '$aiortc_version' or websockets.__version__ != '$websockets_version')" 2>/dev/null; then
  echo "== installing aiortc $aiortc_version and websockets $websockets_version from PyPI into .build-python"
  rm -rf .build-python
  python3 -m venv .build-python
  .build-python/bin/pip install -q --disable-pip-version-check "aiortc==$aiortc_version" "websockets==$websockets_version"
fi
