#!/usr/bin/env python3
"""Speech quality on impaired networks, Parley beside Chromium on the same wire in the same run.

Two network namespaces joined by `parley-wire`; the Parley server on side b; for every cell of the
matrix (loss, bursty loss, jitter, a bottleneck, a mid-call change) and every pair (Parley ↔ Parley,
Chromium ↔ Chromium, and both mixed pairs), a call from side a to side b in which both ends send the
same reference speech (espeak-ng, several voices) and record what they hear. Each recording is
scored with PESQ (ITU-T P.862.2, wideband) per utterance, each utterance found in the recording by
cross-correlation. Prints a line per call and writes results.json; with --report, the report in
docs/quality.md and its plots. Run through scripts/bench-quality.sh, which installs and builds what
this needs.
"""

import argparse
import ctypes
import http.server
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import wave

import numpy as np

import calibrate

ROOT = pathlib.Path(__file__).resolve().parents[2]
NS_A, NS_B = "parley-qa", "parley-qb"
ADDR_A, ADDR_B = "198.51.100.1", "198.51.100.2"
SERVER_PORT = 8090
CALL_SECONDS = 27

# (name, impairment spec, [(seconds after connect, spec), ...] for changes during the call). Every
# cell has 20 ms of delay each way on top (a 40 ms round trip, a nearby server over Wi-Fi): a
# zero-delay wire would flatter any scheme that recovers losses by asking again.
BASE = "delay=20ms"
CELLS = [
    ("clean", BASE, []),
    ("loss 2%", f"{BASE},loss=2%", []),
    ("loss 5%", f"{BASE},loss=5%", []),
    ("loss 10%", f"{BASE},loss=10%", []),
    ("loss 20%", f"{BASE},loss=20%", []),
    ("bursty 10%", f"{BASE},burst=10%:3", []),
    ("jitter 30 ms", f"{BASE},jitter=30ms", []),
    ("jitter 80 ms", f"{BASE},jitter=80ms", []),
    ("5% + jitter 30 ms", f"{BASE},loss=5%,jitter=30ms", []),
    ("10% + jitter 80 ms", f"{BASE},loss=10%,jitter=80ms", []),
    # A deep queue, as cellular links have: a 200 ms one (600 bytes) could not pass one DTLS flight.
    ("24 kbit/s", f"{BASE},rate=24kbit,queue=2000ms", []),
    ("good→bad→good", BASE, [(8, f"{BASE},loss=15%,jitter=40ms"), (17, BASE)]),
]
PAIRS = ["parley-parley", "chromium-chromium", "parley-chromium", "chromium-parley"]

# Harvard sentences (IEEE 1969), two to an utterance, each utterance in its own voice.
UTTERANCES = [
    ("en-us", "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background."),
    ("en-gb+f3", "It's easy to tell the depth of a well. These days a chicken leg is a rare dish."),
    ("en-us+m3", "Rice is often served in round bowls. The juice of lemons makes fine punch."),
]
LEAD_SECONDS, GAP_SECONDS = 3.0, 1.0

libc = ctypes.CDLL("libc.so.6", use_errno=True)
CLONE_NEWNET = 0x40000000


def say(line):
    print(line, flush=True)


class InNamespace:
    """Runs a block with the calling thread in a network namespace: sockets made there stay there."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"cannot enter network namespace {self.name}")
        finally:
            os.close(target)

    def __exit__(self, *exc):
        libc.setns(self.home, CLONE_NEWNET)
        os.close(self.home)


# MARK: Reference speech

def make_reference(directory):
    """The reference: lead silence, then each utterance and a gap, at 48 kHz (sent) and 16 kHz (scored)."""
    parts, segments, position = [], [], LEAD_SECONDS
    for index, (voice, text) in enumerate(UTTERANCES):
        raw, norm = directory / f"u{index}.wav", directory / f"u{index}-48k.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(raw), text], check=True)
        subprocess.run(["sox", str(raw), "-r", "48000", "-c", "1", "-b", "16", str(norm), "gain", "-n", "-3"], check=True)
        seconds = float(subprocess.run(["soxi", "-D", str(norm)], check=True, capture_output=True, text=True).stdout)
        segments.append((position, position + seconds))
        parts.append(str(norm))
        position += seconds + GAP_SECONDS
    ref48, ref16 = directory / "reference-48k.wav", directory / "reference-16k.wav"
    gapped = []
    for index, path in enumerate(parts):
        padded = directory / f"u{index}-gap.wav"
        subprocess.run(["sox", path, str(padded), "pad", "0", f"{GAP_SECONDS}"], check=True)
        gapped.append(str(padded))
    subprocess.run(["sox", *gapped, str(ref48), "pad", f"{LEAD_SECONDS}", "0"], check=True)
    subprocess.run(["sox", str(ref48), "-r", "16000", str(ref16)], check=True)
    return ref48, ref16, segments


def read_wav(path, rate=16000):
    """Mono samples at `rate` as floats, resampled with sox."""
    converted = pathlib.Path(str(path) + f".{rate}.wav")
    subprocess.run(["sox", str(path), "-r", str(rate), "-c", "1", "-b", "16", str(converted)], check=True)
    with wave.open(str(converted)) as w:
        data = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float64) / 32768
    converted.unlink()
    return data


def wav_seconds(path):
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


def score(reference, recording_path, segments, rate=16000):
    """PESQ (wideband) of each utterance, found in the recording by cross-correlation, and where in
    the recording each utterance ends (seconds; None where the recording is too short to hold it)."""
    from pesq import pesq  # here: the setup benchmark shares this module without PESQ
    recording = read_wav(recording_path, rate)
    scores, ends = [], []
    for start, end in segments:
        utterance = reference[int(start * rate):int(end * rate)]
        if len(recording) < len(utterance) // 2:
            scores.append(1.0)
            ends.append(None)
            continue
        n = 1 << int(np.ceil(np.log2(len(recording) + len(utterance))))
        correlation = np.fft.irfft(np.fft.rfft(recording, n) * np.conj(np.fft.rfft(utterance, n)), n)
        lag = int(np.argmax(correlation[:len(recording)]))
        ends.append((lag + len(utterance)) / rate)
        degraded = recording[lag:lag + len(utterance)]
        if len(degraded) < len(utterance):
            degraded = np.concatenate([degraded, np.zeros(len(utterance) - len(degraded))])
        try:
            scores.append(float(pesq(rate, utterance, degraded, "wb")))
        except Exception:  # no utterance detected in the degraded signal: nothing was heard
            scores.append(1.0)
    return scores, ends


# MARK: Processes

class Wire:
    def __init__(self, binary, seed):
        self.process = subprocess.Popen(
            [binary, "--namespace-a", NS_A, "--namespace-b", NS_B, "--address-a", ADDR_A, "--address-b", ADDR_B,
             "--seed", str(seed), "--control"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for line in self.process.stdout:
            if line.strip() == "ready":
                return
        raise RuntimeError("parley-wire did not start")

    def command(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        if answer.startswith("error"):
            raise RuntimeError(f"parley-wire: {answer}")
        return answer

    def stats(self):
        return json.loads(self.command("stats"))

    def stop(self):
        try:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        self.process.wait(timeout=10)


def serve(parley, out, peers):
    """`parley serve` on side b, in memory, taking the pages of both namespaces; once it listens."""
    origins = ",".join(peers.origin(ns) for ns in (NS_A, NS_B))
    server = subprocess.Popen(["ip", "netns", "exec", NS_B, parley, "serve", "--host", ADDR_B, "--port", str(SERVER_PORT),
                               "--database", ":memory:", "--dev", "true", "--token-secret", os.urandom(16).hex(),
                               "--allowed-origins", origins],
                              stdout=open(out / "server.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while "listening on" not in (out / "server.log").read_text():
        if server.poll() is not None or time.monotonic() > deadline:
            stop_group(server)
            sys.exit(f"parley serve did not start: {(out / 'server.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return server


def stop_group(process):
    """SIGTERM to the process's group, SIGKILL if it is still there 10 s later."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Peers:
    """The pages' HTTP servers, one in each namespace, and what the pages post back."""

    def __init__(self, directory):
        self.directory = directory
        self.events = {}
        self.condition = threading.Condition()
        page = (ROOT / "scripts/quality/peer.html").read_bytes()
        peers = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.end_headers()
                self.wfile.write(page)

            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path.startswith("/upload?name="):
                    name = self.path.split("=", 1)[1]
                    (peers.directory / f"{name}.wav").write_bytes(body)
                else:
                    event = json.loads(body)
                    with peers.condition:
                        peers.events.setdefault(event["name"], []).append(event)
                        peers.condition.notify_all()
                self.send_response(204)
                self.end_headers()

        self.servers = {}
        for namespace in (NS_A, NS_B):
            with InNamespace(namespace):
                server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers[namespace] = server

    def origin(self, namespace):
        return f"http://127.0.0.1:{self.servers[namespace].server_address[1]}"

    def wait(self, name, event, timeout):
        deadline = time.monotonic() + timeout
        with self.condition:
            while True:
                for e in self.events.get(name, []):
                    if e["event"] == event:
                        return e
                    if e["event"] == "error":
                        raise RuntimeError(f"{name}: {e['message']}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{name}: no '{event}' in {timeout} s")
                self.condition.wait(left)


class End:
    """One end of a call: a Parley softphone or a Chromium page, in its namespace."""

    def __init__(self, kind, namespace, role, name, args, peers, directory, reference48):
        self.kind, self.name, self.peers, self.directory = kind, name, peers, directory
        self.connected = threading.Event()
        self.lines = []
        server = f"http://{ADDR_B}:{SERVER_PORT}"
        address = ADDR_A if namespace == NS_A else ADDR_B
        if kind == "parley":
            command = [args.parley]
            if role == "caller":
                command += ["call", args.callee, "--duration", str(CALL_SECONDS)]
            else:
                command += ["listen", "--answer", "auto", "--once"]
            command += ["--server", server, "--as", args.user, "--play", str(reference48),
                        "--record", str(directory / f"{name}.wav"), "--ice-address", address,
                        "--quality-log", str(directory / f"{name}.jsonl")]
            self.process = subprocess.Popen(["ip", "netns", "exec", namespace, *command], stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
            self.ready = threading.Event()
            threading.Thread(target=self._read, daemon=True).start()
        else:
            query = (f"server={server}&user={args.user}&role={role}&callee={args.callee}"
                     f"&duration={CALL_SECONDS}&name={name}")
            profile = tempfile.mkdtemp(prefix="parley-chromium-")
            self.profile = profile
            command = ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                       f"--user-data-dir={profile}", "--use-fake-ui-for-media-stream",
                       "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={reference48}%noloop",
                       "--autoplay-policy=no-user-gesture-required",
                       "--disable-features=WebRtcHideLocalIpsWithMdns",
                       f"{peers.origin(namespace)}/peer.html?{query}"]
            self.process = subprocess.Popen(["ip", "netns", "exec", namespace, *command], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("listening as"):
                self.ready.set()
            if "● connected" in line:
                self.connected.set()

    def wait_ready(self, timeout=30):
        if self.kind == "parley":
            if not self.ready.wait(timeout):
                raise TimeoutError(f"{self.name}: not listening: {self.lines[-5:]}")
        else:
            self.peers.wait(self.name, "ready", timeout)

    def wait_connected(self, timeout=60):
        if self.kind == "parley":
            return self.connected.wait(timeout)
        try:
            self.peers.wait(self.name, "connected", timeout)
            return True
        except TimeoutError:
            return False

    def wait_done(self, timeout):
        """What this end measured: talk time and its trace."""
        if self.kind == "parley":
            self.process.wait(timeout=timeout)
            talk = next((float(l.split()[2]) for l in self.lines if l.strip().startswith("talk time")), 0.0)
            log = self.directory / f"{self.name}.jsonl"
            trace = [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []
            # The softphone appends to its quality log: keep this call's rows only.
            trace = [t for t in trace if t.get("call") == trace[-1].get("call")] if trace else []
            return {"talkSeconds": talk, "trace": trace, "output": self.lines[-12:]}
        done = self.peers.wait(self.name, "done", timeout)
        return {"talkSeconds": done["talkSeconds"], "trace": done["trace"]}

    def stop(self):
        stop_group(self.process)
        if self.kind == "chromium":
            subprocess.run(["rm", "-rf", self.profile])


# MARK: The matrix

def run_call(args, wire, peers, directory, reference, cell, pair, run, number):
    name, spec, changes = cell
    caller_kind, callee_kind = pair.split("-")
    tag = f"c{number}"
    # Files an earlier run left in the same directory (`--out`) would be read as this call's.
    for stale in directory.glob(f"{tag}-*"):
        stale.unlink()
    callee_args = argparse.Namespace(parley=args.parley, user=f"bob{number}", callee="", )
    caller_args = argparse.Namespace(parley=args.parley, user=f"alice{number}", callee=f"bob{number}")
    wire.command("set clean")
    before = wire.stats()
    callee = End(callee_kind, NS_B, "callee", f"{tag}-callee", callee_args, peers, directory, reference["ref48"])
    caller = None
    try:
        callee.wait_ready()
        wire.command(f"set {spec}")
        caller = End(caller_kind, NS_A, "caller", f"{tag}-caller", caller_args, peers, directory, reference["ref48"])
        if not caller.wait_connected(60):
            raise RuntimeError(f"{pair} under {name}: the call did not connect")
        connected = time.monotonic()
        for at, change in changes:
            time.sleep(max(0, connected + at - time.monotonic()))
            wire.command(f"set {change}")
        caller_result = caller.wait_done(CALL_SECONDS + 60)
        callee_result = callee.wait_done(30)
    finally:
        wire.command("set clean")
        for end in (caller, callee):
            if end:
                end.stop()
    after = wire.stats()
    wire_report = {d: {k: after[d][k] - before[d][k] for k in ("received", "forwarded", "dropped", "reordered")}
                   for d in ("ab", "ba")}
    result = {"cell": name, "pair": pair, "run": run, "wire": wire_report}
    for role, end, heard_from in (("caller", caller_result, "ba"), ("callee", callee_result, "ab")):
        recording = directory / f"{tag}-{role}.wav"
        silent = ([1.0] * len(reference["segments"]), [None] * len(reference["segments"]))
        scores, ends = score(reference["ref16"], recording, reference["segments"]) if recording.exists() else silent
        seconds = wav_seconds(recording) if recording.exists() else 0
        result[role] = {"pesq": scores, "heardUntil": ends, "recordingSeconds": seconds,
                        "talkSeconds": end["talkSeconds"], "trace": end["trace"], "heard": heard_from}
    result["pesq"] = statistics.mean(result["caller"]["pesq"] + result["callee"]["pesq"])
    reports = calibrate.heard_reports(result) if pair == "parley-parley" else []
    result["sdkMos"] = statistics.mean(r["mos"] for r in reports) if reports else None
    return result


def main():
    # SIGTERM unwinds like ^C, so the server, the browsers and the wire (and its namespaces) go too.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parley", default=str(ROOT / ".build/release/parley"))
    parser.add_argument("--wire", default=str(ROOT / ".build/release/parley-wire"))
    parser.add_argument("--runs", type=int, default=1, help="calls per cell and pair (the report shows medians)")
    parser.add_argument("--cells", default="", help="comma-separated cell names to run (default: all)")
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / ".build/quality"))
    parser.add_argument("--report", action="store_true", help="write docs/quality.md and its plots from this run")
    args = parser.parse_args()

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = [c for c in CELLS if not args.cells or c[0] in args.cells.split(",")]
    pairs = args.pairs.split(",")
    if not cells:
        sys.exit(f"no cell matches {args.cells!r}; cells: {', '.join(c[0] for c in CELLS)}")

    ref48, ref16, segments = make_reference(out)
    reference = {"ref48": ref48, "ref16": read_wav(ref16), "segments": segments}
    say(f"== reference speech: {len(segments)} utterances, {wav_seconds(ref48):.1f} s; "
        f"{len(cells)} cells × {len(pairs)} pairs × {args.runs} runs, {CALL_SECONDS} s calls")

    wire = Wire(args.wire, args.seed)
    server, results, number = None, [], 0
    try:
        peers = Peers(out)
        server = serve(args.parley, out, peers)
        for run in range(args.runs):
            for cell in cells:
                for pair in pairs:
                    number += 1
                    try:
                        result = run_call(args, wire, peers, out, reference, cell, pair, run, number)
                    except Exception as error:  # a call that failed scores as nothing heard
                        say(f"   {cell[0]:<20} {pair:<18} run {run + 1}: FAILED: {error}")
                        result = {"cell": cell[0], "pair": pair, "run": run, "pesq": 1.0, "failed": str(error)}
                    else:
                        c, e = result["caller"], result["callee"]
                        say(f"   {cell[0]:<20} {pair:<18} run {run + 1}: PESQ {result['pesq']:.2f} "
                            f"(a hears {statistics.mean(c['pesq']):.2f}, b hears {statistics.mean(e['pesq']):.2f}); "
                            f"recording/talk {c['recordingSeconds']:.1f}/{c['talkSeconds']:.1f} s; "
                            f"wire a→b lost {result['wire']['ab']['dropped']}/{result['wire']['ab']['received']}"
                            + (f"; SDK MOS {result['sdkMos']:.2f}" if result.get("sdkMos") else ""))
                    results.append(result)
                    (out / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        # Interrupted (^C, SIGTERM), or failed to start: the server, the wire and its namespaces go anyway.
        stop_group(server)
        wire.stop()

    say("== median PESQ per cell")
    say(f"   {'cell':<20}" + "".join(f"{p:>19}" for p in pairs))
    for cell in cells:
        row = []
        for pair in pairs:
            values = [r["pesq"] for r in results if r["cell"] == cell[0] and r["pair"] == pair]
            row.append(f"{statistics.median(values):>19.2f}" if values else f"{'—':>19}")
        say(f"   {cell[0]:<20}" + "".join(row))
    if args.report:
        import report
        report.write(results, out, ROOT / "docs")


if __name__ == "__main__":
    main()
