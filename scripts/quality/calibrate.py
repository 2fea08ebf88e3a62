"""Fits the E-model's Opus impairment values (Ie, Bpl) to PESQ from a benchmark run.

The SDK's MOS comes from the E-model (ParleyKit's `EModel`) fed with what a call measures: round
trip, jitter and loss before FEC. For every Parley ↔ Parley call in results.json this replays the
quality reports both ends logged as each utterance ended (`heard_reports`) through the same formula for each
candidate (Ie, Bpl), without the delay impairment (PESQ is a listening test and cannot hear
delay; the SDK's `mos` counts it, its `listeningMos` does not), and keeps the pair whose estimate strays least from PESQ in the worst cell (medians of the
calls of a cell, as the report compares them; the promise made of the estimate is a bound:
within 0.5 everywhere), the squared error breaking ties.

    python3 scripts/quality/calibrate.py .build/quality/results.json
"""

import json
import pathlib
import statistics
import sys

# The values in force: ParleyKit's `EModel.opus` and the browser's quality.js hold the same.
OPUS_IE, OPUS_BPL = 11, 19
# Ie grows by OPUS_PER_KBPS for each kbit/s the codec runs below OPUS_FULL_KBPS (`EModel.opus`).
OPUS_FULL_KBPS, OPUS_PER_KBPS = 20, 5


def rating(rtt, jitter, loss, ie, bpl, codec_delay=26.5, listening=False, burst=1.0, codec_kbps=None, per_kbps=0.0):
    """The E-model's R (`EModel.rating`); with `listening`, without the delay impairment
    (`EModel.listeningRating`): what PESQ, a listening test, can be compared with. `burst` is
    G.107's BurstR (`QualityReport.burstRatio`; 1 for random loss)."""
    delay = rtt / 2 + 2 * jitter + codec_delay
    delay_impairment = 0 if listening else 0.024 * delay + (0.11 * (delay - 177.3) if delay > 177.3 else 0)
    loss = max(0.0, min(100.0, loss))
    if codec_kbps:
        ie = ie + per_kbps * max(0.0, OPUS_FULL_KBPS - codec_kbps)
    return 93.2 - delay_impairment - (ie + (95 - ie) * loss / (loss / max(1.0, burst) + bpl))


def mos(r):
    if r <= 0:
        return 1.0
    if r >= 100:
        return 4.5
    return 1 + 0.035 * r + 7e-6 * r * (r - 60) * (100 - r)


def heard_reports(result):
    """The quality reports that speak for what PESQ scored: for each utterance each end heard, the
    first report at or after the utterance ended in its recording. A report is the mean of the last
    five seconds, so it covers the utterance (three to five seconds long) and little else: PESQ
    scores the speech, and under a mid-call change a mean over the whole call would weigh the
    silence after it as much. (Runs made before the utterances' ends were kept: every report from
    the fifth second on.)"""
    chosen = []
    for role in ("caller", "callee"):
        reports = [t for t in result[role]["trace"] if "mos" in t]
        ends = result[role].get("heardUntil")
        if ends is None:
            chosen += [t for t in reports if t["t"] >= 5]
            continue
        for end in (e for e in ends if e is not None):
            after = [t for t in reports if t["t"] >= end]
            if after or reports:
                chosen.append(with_codec_kbps(after[0] if after else reports[-1], reports))
    return chosen


def with_codec_kbps(report, reports):
    """The report with `codecKbps` (`QualityReport.codecKbps`: the highest window bitrate of the
    last ten seconds), worked out from the trace for runs made before the SDK logged it."""
    if "codecKbps" in report:
        return report
    return dict(report, codecKbps=max(t["receivedKbps"] for t in reports if report["t"] - 10 <= t["t"] <= report["t"]))


def calls(results):
    for result in results:
        if result["pair"] != "parley-parley" or result.get("failed"):
            continue
        reports = heard_reports(result)
        if reports:
            yield result["cell"], result["pesq"], reports


def predicted(reports, ie, bpl, listening=True, per_kbps=OPUS_PER_KBPS):
    return sum(mos(rating(r["rttMs"], r["jitterMs"], r["lossPct"], ie, bpl, listening=listening, burst=r.get("burstRatio", 1.0),
                          codec_kbps=r.get("codecKbps"), per_kbps=per_kbps))
               for r in reports) / len(reports)


def by_cell(data):
    cells = {}
    for cell, pesq, reports in data:
        cells.setdefault(cell, []).append((pesq, reports))
    return cells


def cell_differences(data, ie, bpl, per_kbps=OPUS_PER_KBPS):
    """Per cell, the median estimate less the median PESQ: the report's comparison."""
    return {cell: statistics.median(predicted(r, ie, bpl, per_kbps=per_kbps) for _, r in calls_) - statistics.median(p for p, _ in calls_)
            for cell, calls_ in by_cell(data).items()}


def fit(results, ies=range(0, 41)):
    """The (Ie, Bpl, per kbit/s) whose estimate strays least from PESQ in the worst cell."""
    data = list(calls(results))
    best = None
    for ie in ies:
        for bpl in range(5, 61):
            for per_kbps in (0, 1, 2, 3, 4, 5, 6, 8):
                differences = list(cell_differences(data, ie, bpl, per_kbps).values())
                score = (max(abs(d) for d in differences), sum(d * d for d in differences))
                if best is None or score < best[0]:
                    best = (score, ie, bpl, per_kbps)
    return best, data


if __name__ == "__main__":
    path = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".build/quality/results.json")
    results = json.loads(path.read_text())
    # Ie held where a clean call scores as PESQ hears it (the E-model's 4.08 for Opus at 11).
    ((worst_case, error), ie, bpl, per_kbps), data = fit(results, ies=[OPUS_IE])
    print(f"Ie = {ie}, Bpl = {bpl}, {per_kbps} per kbit/s below {OPUS_FULL_KBPS} (largest difference of a cell's medians "
          f"{worst_case:.2f}, squared error {error:.3f}, {len(data)} calls)")
    old, new = cell_differences(data, OPUS_IE, OPUS_BPL), cell_differences(data, ie, bpl, per_kbps)
    print(f"{'cell':<22}{'in force':>10}{'fitted':>8}   (estimate less PESQ, medians)")
    for cell in old:
        print(f"{cell:<22}{old[cell]:>+10.2f}{new[cell]:>+8.2f}")
    # Held out: fitted on all runs but one, how far off in the one left out.
    runs = sorted({r["run"] for r in results if "run" in r})
    for run in runs if len(runs) > 1 else []:
        (_, ie_, bpl_, per_), _ = fit([r for r in results if r.get("run") != run], ies=[OPUS_IE])
        held = cell_differences(list(calls([r for r in results if r.get("run") == run])), ie_, bpl_, per_)
        print(f"run {run} left out: fitted Bpl = {bpl_}, {per_} per kbit/s; largest difference in it {max(abs(d) for d in held.values()):.2f}")
