#!/usr/bin/env python3
"""Call setup on a real path: how soon both people hear each other after the answer.

Two network namespaces joined by `parley-wire` (the same wire as the quality benchmark); the Parley
server on side b, beside the callee; the caller on side a. For every cell (round trips of 0, 100 and
300 ms, and 100 ms with 2 % loss each way, each ringing `--ring` seconds before the callee answers;
and 0 ms answered at once) and every pair, `--calls` calls:

  parley-parley          `parley call` → `parley listen`, connecting while ringing (the default)
  parley-parley-classic  the same, both with --no-connect-while-ringing (the path made after the answer)
  parley-parley-classic-regular
                         the classic flow with webrtcbin's own regular ICE nomination on both ends
                         (--no-aggressive-ice-nomination): what Parley's classic flow was before
  chromium-chromium      two Chromium pages (scripts/quality/peer.html), the classic flow
  chromium-parley        a Chromium page calling `parley listen` (which rings early; the page ignores it)
  chromium-aiortc        a Chromium page calling aiortc (scripts/quality/aiortc_peer.py), a third-party stack

Each end writes its timeline in Unix milliseconds (the softphone in its quality log, the page posts
it), one clock for all: invite → the callee rings, answer → first audio the caller hears, answer →
first audio the callee hears, and invite → first audio less the ring. p50 and p95 per cell and pair,
the ratios last; results.json, and each softphone's and aiortc's output in <name>.out (PARLEY_LOG_LEVEL=debug
logs the softphones); with --report, the table and plot in docs/benchmarks.md. Run through
scripts/bench-setup.sh, which installs and builds what this needs.
"""

import argparse
import json
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading

from bench import ADDR_A, ADDR_B, NS_A, NS_B, ROOT, SERVER_PORT, Peers, Wire, say, serve, stop_group

# (name, impairment both ways, seconds the callee rings: None for --ring). The last cell answers at
# once, on loopback delays: invite → first audio with an auto-answering callee, callee against callee
# behind the same (Chromium) caller.
CELLS = [
    ("0 ms", "clean", None),
    ("100 ms", "delay=50ms", None),
    ("300 ms", "delay=150ms", None),
    ("100 ms + 2% loss", "delay=50ms,loss=2%", None),
    ("0 ms answered at once", "clean", 0),
]
PAIRS = ["parley-parley", "parley-parley-classic", "parley-parley-classic-regular", "chromium-chromium", "chromium-parley",
         "chromium-aiortc"]
TALK_SECONDS = 2
# What each call yields, in ms: (key, words).
MEASURES = [
    ("ringing", "invite → callee rings"),
    ("callerHears", "answer → caller hears"),
    ("calleeHears", "answer → callee hears"),
    ("bothHear", "answer → both hear"),
    ("inviteToAudio", "invite → caller hears, less the ring"),
]


class SetupEnd:
    """One end of a timed call: a Parley softphone, a Chromium page or an aiortc callee, in its namespace."""

    def __init__(self, kind, namespace, role, name, user, callee, flags, ring, args, peers, directory):
        self.kind, self.name, self.peers = kind, name, peers
        self.lines, self.ready = [], threading.Event()
        self.log = directory / f"{name}.jsonl"
        server = f"http://{ADDR_B}:{SERVER_PORT}"
        address = ADDR_A if namespace == NS_A else ADDR_B
        if kind == "parley":
            command = [args.parley]
            if role == "caller":
                command += ["call", callee, "--duration", str(TALK_SECONDS)]
            else:
                command += ["listen", "--answer", "auto", "--answer-after", str(ring), "--once"]
            command += ["--server", server, "--as", user, "--play", "tone:440", "--ice-address", address,
                        "--quality-log", str(self.log)]
            command += flags
            self._start(namespace, command)
        elif kind == "aiortc":
            self._start(namespace, [str(args.python), str(ROOT / "scripts/quality/aiortc_peer.py"), "--server", server,
                                    "--user", user, "--device", name, "--ring", str(ring)])
        else:
            query = f"server={server}&user={user}&role={role}&callee={callee}&duration={TALK_SECONDS}&name={name}"
            if role == "callee":
                query += f"&ring={int(ring * 1000)}"
            self.profile = tempfile.mkdtemp(prefix="parley-chromium-")
            command = ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                       f"--user-data-dir={self.profile}", "--use-fake-ui-for-media-stream",
                       "--use-fake-device-for-media-stream", "--autoplay-policy=no-user-gesture-required",
                       "--disable-features=WebRtcHideLocalIpsWithMdns", f"{peers.origin(namespace)}/peer.html?{query}"]
            self.process = subprocess.Popen(["ip", "netns", "exec", namespace, *command], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)

    def _start(self, namespace, command):
        self.process = subprocess.Popen(["ip", "netns", "exec", namespace, *command], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("listening as") or line.strip() == "ready":
                self.ready.set()

    def wait_ready(self, timeout=30):
        if self.kind == "chromium":
            return self.peers.wait(self.name, "ready", timeout)
        if not self.ready.wait(timeout):
            raise TimeoutError(f"{self.name}: not listening: {self.lines[-5:]}")

    def timeline(self, timeout):
        """The call's moments in Unix ms, once it ended."""
        if self.kind == "chromium":
            return self.peers.wait(self.name, "done", timeout)["timeline"]
        self.process.wait(timeout=timeout)
        self.reader.join(5)  # the last lines (aiortc's timeline) may still be unread
        if self.kind == "aiortc":
            rows = [json.loads(l) for l in self.lines if l.startswith("{")]
        else:
            rows = [json.loads(l) for l in self.log.read_text().splitlines()] if self.log.exists() else []
        timelines = [r["timeline"] for r in rows if "timeline" in r]
        if not timelines:
            raise RuntimeError(f"{self.name} wrote no timeline: {self.lines[-8:]}")
        return timelines[-1]

    def stop(self):
        stop_group(self.process)
        if self.kind == "chromium":
            subprocess.run(["rm", "-rf", self.profile])
        else:
            self.reader.join(5)
            # What the process said (with PARLEY_LOG_LEVEL=debug, its log), for a slow call's reasons.
            (self.log.parent / f"{self.name}.out").write_text("\n".join(self.lines) + "\n")


def timed_call(args, wire, peers, directory, cell, pair, number):
    name, spec, ring = cell
    ring = args.ring if ring is None else ring
    kinds = pair.split("-")[:2]
    flags = ((["--no-connect-while-ringing"] if "-classic" in pair else [])
             + (["--no-aggressive-ice-nomination"] if pair.endswith("-regular") else []))
    tag = f"s{number}"
    for stale in directory.glob(f"{tag}-*"):
        stale.unlink()
    wire.command(f"set {spec}")
    callee = SetupEnd(kinds[1], NS_B, "callee", f"{tag}-callee", f"bob{number}", "", flags, ring, args, peers, directory)
    caller = None
    try:
        callee.wait_ready()
        caller = SetupEnd(kinds[0], NS_A, "caller", f"{tag}-caller", f"alice{number}", f"bob{number}", flags, ring,
                          args, peers, directory)
        a = caller.timeline(60)
        b = callee.timeline(30)
    finally:
        for end in (caller, callee):
            if end:
                end.stop()
    missing = [f"{role}.{key}" for role, t, keys in (("caller", a, ("started", "firstAudio")),
                                                     ("callee", b, ("started", "answered", "firstAudio")))
               for key in keys if t.get(key) is None]
    if missing:
        raise RuntimeError(f"no {', '.join(missing)}")
    result = {
        "ringing": b["started"] - a["started"],
        "callerHears": a["firstAudio"] - b["answered"],
        "calleeHears": b["firstAudio"] - b["answered"],
        "inviteToAudio": a["firstAudio"] - a["started"] - (b["answered"] - b["started"]),
    }
    result["bothHear"] = max(result["callerHears"], result["calleeHears"])
    return {"cell": name, "pair": pair, **result, "caller": a, "callee": b}


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def summary(results, cells, pairs):
    """{(cell, pair): {key: (p50, p95, n)}} and the failures per cell and pair."""
    table, failures = {}, {}
    for cell in cells:
        for pair in pairs:
            rows = [r for r in results if r["cell"] == cell and r["pair"] == pair]
            ok = [r for r in rows if "failed" not in r]
            failures[(cell, pair)] = len(rows) - len(ok)
            if ok:
                table[(cell, pair)] = {key: (statistics.median(r[key] for r in ok), percentile([r[key] for r in ok], 0.95), len(ok))
                                       for key, _ in MEASURES}
    return table, failures


def ratios(table):
    """The issue's ratios, answer → both hear at p50 on the 100 ms path, against Chromium's classic flow."""
    lines = []
    chromium = table.get(("100 ms", "chromium-chromium"))
    for pair, words in (("parley-parley", "Parley connecting while ringing"), ("parley-parley-classic", "Parley classic"),
                        ("parley-parley-classic-regular", "Parley classic, regular nomination"),
                        ("chromium-parley", "Chromium caller, Parley callee")):
        parley = table.get(("100 ms", pair))
        if chromium and parley:
            lines.append(f"answer → both hear, p50, 100 ms round trip: {words} ÷ Chromium classic = "
                         f"{parley['bothHear'][0]:.0f} / {chromium['bothHear'][0]:.0f} ms = {parley['bothHear'][0] / chromium['bothHear'][0]:.2f}")
    parley = table.get(("0 ms answered at once", "chromium-parley"))
    for pair, words in (("chromium-chromium", "Chromium callee"), ("chromium-aiortc", "aiortc callee")):
        other = table.get(("0 ms answered at once", pair))
        if other and parley:
            lines.append(f"invite → caller hears, p50, loopback delays, answered at once, a Chromium caller: Parley callee ÷ {words} = "
                         f"{parley['inviteToAudio'][0]:.0f} / {other['inviteToAudio'][0]:.0f} ms = "
                         f"{parley['inviteToAudio'][0] / other['inviteToAudio'][0]:.2f}")
    return lines


def main():
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parley", default=str(ROOT / ".build/release/parley"))
    parser.add_argument("--wire", default=str(ROOT / ".build/release/parley-wire"))
    parser.add_argument("--python", default=str(ROOT / ".build-python/bin/python"), help="a Python with aiortc and websockets")
    parser.add_argument("--calls", type=int, default=5, help="calls per cell and pair")
    parser.add_argument("--ring", type=float, default=1.0, help="seconds each call rings before the answer")
    parser.add_argument("--cells", default="", help="comma-separated cell names (default: all): " + ", ".join(c[0] for c in CELLS))
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / ".build/setup"))
    parser.add_argument("--build", default="release", help="which build of parley ran (for the report)")
    parser.add_argument("--report", action="store_true", help="write the table and plot in docs/benchmarks.md from this run")
    args = parser.parse_args()
    if args.calls < 1 or not 0 <= args.ring <= 30:
        sys.exit("--calls must be at least 1 and --ring from 0 to 30 seconds")

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    asked = [c.strip() for c in args.cells.split(",")] if args.cells else [c[0] for c in CELLS]
    cells = [c for c in CELLS if c[0] in asked]
    pairs = args.pairs.split(",")
    if len(cells) != len(asked) or any(p not in PAIRS for p in pairs):
        sys.exit(f"cells: {', '.join(c[0] for c in CELLS)}; pairs: {', '.join(PAIRS)}")
    if any(p.endswith("-aiortc") for p in pairs) and not pathlib.Path(args.python).exists():
        sys.exit(f"{args.python} is missing: the aiortc pairs need aiortc and websockets (scripts/setup.sh --aiortc)")
    say(f"== call setup: {len(cells)} cells × {len(pairs)} pairs × {args.calls} calls, each ringing {args.ring} s")

    wire = Wire(args.wire, args.seed)
    server, results, number = None, [], 0
    try:
        peers = Peers(out)
        server = serve(args.parley, out, peers)
        # Cells outermost, pairs interleaved call by call: a slow minute of the machine falls on every pair.
        for cell in cells:
            for index in range(args.calls):
                for pair in pairs:
                    number += 1
                    try:
                        result = timed_call(args, wire, peers, out, cell, pair, number)
                    except Exception as error:
                        say(f"   {cell[0]:<16} {pair:<22} call {index + 1}: FAILED: {error}")
                        result = {"cell": cell[0], "pair": pair, "failed": str(error)}
                    else:
                        say(f"   {cell[0]:<16} {pair:<22} call {index + 1}: rings {result['ringing']:.0f} ms; answer → caller hears "
                            f"{result['callerHears']:.0f} ms, callee hears {result['calleeHears']:.0f} ms")
                    results.append(result)
                    (out / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        # Interrupted, or failed to start: the server (if any), the wire and its namespaces go anyway.
        stop_group(server)
        wire.stop()

    names = [c[0] for c in cells]
    table, failures = summary(results, names, pairs)
    for key, words in MEASURES:
        say(f"== {words}: p50 / p95 ms")
        say(f"   {'cell':<16}" + "".join(f"{p:>24}" for p in pairs))
        for cell in names:
            row = "".join(f"{'%.0f / %.0f' % table[(cell, p)][key][:2] if (cell, p) in table else '—':>24}" for p in pairs)
            say(f"   {cell:<16}{row}")
    if any(failures.values()):
        say("== failed calls: " + ", ".join(f"{c} {p}: {n}" for (c, p), n in failures.items() if n))
    say("== ratios")
    for line in ratios(table):
        say("   " + line)
    say("   (answer → both hear: the later of the two, per call)")
    if args.report:
        import setup_report
        setup_report.write(results, table, failures, names, pairs, args, ROOT / "docs")


if __name__ == "__main__":
    main()
