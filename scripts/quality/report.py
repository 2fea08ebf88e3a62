"""The quality benchmark's report: docs/quality/results.md and its plots, from results.json.

Run by bench.py --report, or on its own over one run's results.json or several (their calls are
pooled; medians per cell and pair):
    python3 scripts/quality/report.py .build/quality/results.json [more/results.json ...]
"""

import json
import pathlib
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PAIR_LABELS = {
    "parley-parley": "Parley ↔ Parley",
    "chromium-chromium": "Chromium ↔ Chromium",
    "parley-chromium": "Parley → Chromium",
    "chromium-parley": "Chromium → Parley",
}


def median(values):
    return statistics.median(values) if values else None


def write(results, out, docs):
    folder = docs / "quality"
    folder.mkdir(parents=True, exist_ok=True)
    cells = list(dict.fromkeys(r["cell"] for r in results))
    pairs = [p for p in PAIR_LABELS if any(r["pair"] == p for r in results)]
    counts = {p: max(sum(1 for r in results if r["pair"] == p and r["cell"] == c) for c in cells) for p in pairs}
    calls = "; ".join(f"{PAIR_LABELS[p]}: {n} call{'s' if n > 1 else ''}" for p, n in counts.items())

    def cell_values(cell, pair, key="pesq"):
        return [r[key] for r in results if r["cell"] == cell and r["pair"] == pair and r.get(key) is not None]

    # webrtcbin sets up RTX for every transceiver, and in some Parley ↔ Parley calls under loss it
    # retransmitted lost packets: the receiver then counted far less loss than the wire made.
    def retransmitted(result):
        if result.get("failed") or result["pair"] != "parley-parley":
            return False
        wire = result["wire"]["ab"]
        made = 100 * wire["dropped"] / max(1, wire["received"])
        seen = [t["lossPct"] for t in result["callee"]["trace"] if "mos" in t and t["t"] >= 5]
        return made >= 3 and bool(seen) and sum(seen) / len(seen) < made / 3
    marked = {(r["cell"], r["pair"]) for r in results if retransmitted(r)}

    lines = ["# Quality benchmark results", "",
             f"Made by `scripts/bench-quality.sh`; per cell, {calls} (medians). "
             "PESQ is ITU-T P.862.2 wideband MOS-LQO, the mean over three utterances and both "
             "directions of a call. See [../quality.md](../quality.md) for the method.", "",
             "## PESQ per cell", "",
             "| cell | " + " | ".join(PAIR_LABELS[p] for p in pairs) + (" | Parley ÷ Chromium |" if "parley-parley" in pairs and "chromium-chromium" in pairs else " |"),
             "|---" * (len(pairs) + 1 + (1 if "parley-parley" in pairs and "chromium-chromium" in pairs else 0)) + "|"]
    for cell in cells:
        row = [cell]
        for pair in pairs:
            value = median(cell_values(cell, pair))
            failed = sum(1 for r in results if r["cell"] == cell and r["pair"] == pair and r.get("failed"))
            row.append("—" if value is None else f"{value:.2f}" + (" †" if (cell, pair) in marked else "")
                       + (f" ({failed} failed)" if failed else ""))
        if "parley-parley" in pairs and "chromium-chromium" in pairs:
            p, c = median(cell_values(cell, "parley-parley")), median(cell_values(cell, "chromium-chromium"))
            row.append(f"{p / c:.2f}" if p and c else "—")
        lines.append("| " + " | ".join(row) + " |")

    if marked:
        lines += ["", "† webrtcbin retransmitted lost packets in this call (RTX): the receiver counted less than a "
                  "third of the loss the wire made; see quality.md."]
    lines += ["", "## Recording length against talk time (Parley ↔ Parley)", "",
              "A recording shorter than the call means lost or late packets were skipped rather than concealed; "
              "a longer one, that audio was added (concealment each time the jitter buffer grew).", "",
              "| cell | recorded / talked (caller) | recorded / talked (callee) |", "|---|---|---|"]
    for cell in cells:
        calls = [r for r in results if r["cell"] == cell and r["pair"] == "parley-parley" and not r.get("failed")]
        if calls:
            def ratio(role):
                return median([c[role]["recordingSeconds"] / c[role]["talkSeconds"] for c in calls if c[role]["talkSeconds"]])
            lines.append(f"| {cell} | {ratio('caller'):.3f} | {ratio('callee'):.3f} |")

    # The SDK's MOS as the calls reported it, and the same reports replayed through the E-model
    # with the Opus values now in force (calibrate.py), beside PESQ.
    import calibrate
    replayed = {}
    for cell, pesq, reports in calibrate.calls(results):
        replayed.setdefault(cell, []).append(calibrate.predicted(reports, calibrate.OPUS_IE, calibrate.OPUS_BPL))
    mos_rows = [(cell, median(cell_values(cell, "parley-parley", "sdkMos")), median(replayed.get(cell, [])),
                 median(cell_values(cell, "parley-parley"))) for cell in cells]
    mos_rows = [row for row in mos_rows if row[1] is not None and row[3] is not None]
    if mos_rows:
        lines += ["", "## The SDK's MOS against PESQ (Parley ↔ Parley)", "",
                  "The SDK's estimates as each scored utterance ended, when their five-second mean covers the "
                  "utterance (`calibrate.heard_reports`), averaged as PESQ is, medians of the calls of a cell: "
                  "the conversational MOS the SDK reported (`call.report`, the status line: the E-model, "
                  "delay counted), and the listening MOS (`QualityReport.listeningMos`: the same without the "
                  "delay, which a listening test such as PESQ cannot hear) replayed from the same reports "
                  f"with the Opus values now in force (Ie = {calibrate.OPUS_IE}, Bpl = {calibrate.OPUS_BPL}, "
                  f"{calibrate.OPUS_PER_KBPS} per kbit/s below {calibrate.OPUS_FULL_KBPS}, bursty loss weighed by "
                  "its burst ratio).", "",
                  "| cell | SDK MOS (conversational) | SDK listening MOS | PESQ | listening − PESQ |", "|---|---|---|---|---|"]
        for cell, reported, now, pesq in mos_rows:
            lines.append(f"| {cell} | {reported:.2f} | {now:.2f} | {pesq:.2f} | {now - pesq:+.2f} |")
        worst = max(abs(n - p) for _, _, n, p in mos_rows)
        lines += ["", f"Largest difference of the listening MOS from PESQ: {worst:.2f}. Where the values in force were "
                  "fitted on this run, that flatters them: `python3 scripts/quality/calibrate.py results.json` also fits "
                  "on all runs but one and says how far the fit strays in the run left out."]

    # PESQ per cell, one bar a pair.
    figure, axes = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(pairs)
    for index, pair in enumerate(pairs):
        values = [median(cell_values(cell, pair)) or 0 for cell in cells]
        axes.bar([i + index * width for i in range(len(cells))], values, width, label=PAIR_LABELS[pair])
    axes.set_xticks([i + width * (len(pairs) - 1) / 2 for i in range(len(cells))])
    axes.set_xticklabels(cells, rotation=30, ha="right")
    axes.set_ylabel("PESQ (P.862.2 wideband)")
    axes.set_ylim(1, 4.7)
    axes.legend(loc="upper right", fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(folder / "pesq.png", dpi=110)
    plt.close(figure)
    lines += ["", "![PESQ per cell](pesq.png)"]

    # The mid-call change: Parley's encoder and what it measured, beside Chromium's send rate.
    change = [r for r in results if r["cell"].startswith("good") and not r.get("failed")]
    parley = next((r for r in change if r["pair"] == "parley-parley"), None)
    chromium = next((r for r in change if r["pair"] == "chromium-chromium"), None)
    if parley or chromium:
        figure, (rate, loss) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        if parley:
            trace = parley["caller"]["trace"]
            settings = [t for t in trace if "bitrateKbps" in t]
            if settings:
                times = [0] + [t["t"] for t in settings] + [max(x["t"] for x in trace)]
                rates = [32] + [t["bitrateKbps"] for t in settings] + [settings[-1]["bitrateKbps"]]
                rate.step(times, rates, where="post", label="Parley encoder bitrate")
                fec = [t for t in settings if t["fec"]]
                rate.scatter([t["t"] for t in fec], [t["bitrateKbps"] for t in fec], marker="^", color="green",
                             label="Parley: FEC on (expected loss set)", zorder=3)
            reports = [t for t in trace if "mos" in t]
            rate.plot([t["t"] for t in reports], [t["receivedKbps"] for t in reports], alpha=0.6, label="Parley received kbit/s")
            loss.plot([t["t"] for t in reports], [t["lossPct"] for t in reports], label="Parley: loss received, % (5 s mean)")
            loss.plot([t["t"] for t in reports], [(t.get("remoteLossPct") or 0) for t in reports],
                      label="Parley: loss the far end reports, %")
        if chromium:
            trace = [t for t in chromium["caller"]["trace"] if t.get("sendKbps") is not None]
            rate.plot([t["t"] for t in trace], [t["sendKbps"] for t in trace], alpha=0.8, label="Chromium sent kbit/s")
            loss.plot([t["t"] for t in trace], [t.get("lossPct", 0) for t in trace], alpha=0.8, label="Chromium: loss received, %")
        for axis in (rate, loss):
            axis.axvspan(8, 17, color="red", alpha=0.08)
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8, loc="upper right")
        rate.set_ylabel("kbit/s")
        loss.set_ylabel("%")
        loss.set_xlabel("seconds after connecting (shaded: 15 % loss, 40 ms jitter)")
        figure.tight_layout()
        figure.savefig(folder / "midcall.png", dpi=110)
        plt.close(figure)
        lines += ["", "## The mid-call change", "", "![Bitrate and loss under the mid-call change](midcall.png)"]

    (folder / "results.md").write_text("\n".join(lines) + "\n")
    print(f"== report: {folder / 'results.md'}, {folder / 'pesq.png'}")


if __name__ == "__main__":
    paths = [pathlib.Path(p) for p in sys.argv[1:]] or [pathlib.Path(".build/quality/results.json")]
    pooled = []
    for path in paths:
        offset = max((r["run"] for r in pooled), default=-1) + 1
        pooled += [{**r, "run": r["run"] + offset} for r in json.loads(path.read_text())]
    root = pathlib.Path(__file__).resolve().parents[2]
    write(pooled, paths[0].parent, root / "docs")
