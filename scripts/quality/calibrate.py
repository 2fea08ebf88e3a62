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
OPUS_IE, OPUS_BPL = 11, 13


def rating(rtt, jitter, loss, ie, bpl, codec_delay=26.5, listening=False, burst=1.0):
    """The E-model's R (`EModel.rating`); with `listening`, without the delay impairment
    (`EModel.listeningRating`): what PESQ, a listening test, can be compared with. `burst` is
    G.107's BurstR (`QualityReport.burstRatio`; 1 for random loss)."""
    delay = rtt / 2 + 2 * jitter + codec_delay
    delay_impairment = 0 if listening else 0.024 * delay + (0.11 * (delay - 177.3) if delay > 177.3 else 0)
    loss = max(0.0, min(100.0, loss))
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
                chosen.append(after[0] if after else reports[-1])
    return chosen


def calls(results):
    for result in results:
        if result["pair"] != "parley-parley" or result.get("failed"):
            continue
        reports = heard_reports(result)
        if reports:
            yield result["cell"], result["pesq"], reports


def predicted(reports, ie, bpl, listening=True):
    return sum(mos(rating(r["rttMs"], r["jitterMs"], r["lossPct"], ie, bpl, listening=listening, burst=r.get("burstRatio", 1.0)))
               for r in reports) / len(reports)


def by_cell(data):
    cells = {}
    for cell, pesq, reports in data:
        cells.setdefault(cell, []).append((pesq, reports))
    return cells


def cell_differences(data, ie, bpl):
    """Per cell, the median estimate less the median PESQ: the report's comparison."""
    return {cell: statistics.median(predicted(r, ie, bpl) for _, r in calls_) - statistics.median(p for p, _ in calls_)
            for cell, calls_ in by_cell(data).items()}


def fit(results):
    data = list(calls(results))
    best = None
    for ie in range(0, 41):
        for bpl in range(5, 81):
            differences = list(cell_differences(data, ie, bpl).values())
            score = (max(abs(d) for d in differences), sum(d * d for d in differences))
            if best is None or score < best[0]:
                best = (score, ie, bpl)
    return best, data


if __name__ == "__main__":
    path = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".build/quality/results.json")
    ((worst_case, error), ie, bpl), data = fit(json.loads(path.read_text()))
    print(f"Ie = {ie}, Bpl = {bpl} (largest difference of a cell's medians {worst_case:.2f}, squared error {error:.3f}, "
          f"{len(data)} calls)")
    old, new = cell_differences(data, OPUS_IE, OPUS_BPL), cell_differences(data, ie, bpl)
    print(f"{'cell':<22}{'in force':>10}{'fitted':>8}   (estimate less PESQ, medians)")
    for cell in old:
        print(f"{cell:<22}{old[cell]:>+10.2f}{new[cell]:>+8.2f}")
