"""Fits the E-model's Opus impairment values (Ie, Bpl) to PESQ from a benchmark run.

The SDK's MOS comes from the E-model (ParleyKit's `EModel`) fed with what a call measures: round
trip, jitter and loss before FEC. For every Parley ↔ Parley call in results.json this replays the
quality reports both ends logged as each utterance ended (`heard_reports`) through the same formula for each
candidate (Ie, Bpl), and keeps the pair whose mean MOS strays least from the call's PESQ in the
worst call (the promise made of the estimate is a bound: within 0.5 everywhere), the squared
error breaking ties.

    python3 scripts/quality/calibrate.py .build/quality/results.json
"""

import json
import pathlib
import sys

# The values in force: ParleyKit's `EModel.opus` and the browser's quality.js hold the same.
OPUS_IE, OPUS_BPL = 11, 13


def rating(rtt, jitter, loss, ie, bpl, codec_delay=26.5):
    delay = rtt / 2 + 2 * jitter + codec_delay
    delay_impairment = 0.024 * delay + (0.11 * (delay - 177.3) if delay > 177.3 else 0)
    loss = max(0.0, min(100.0, loss))
    return 93.2 - delay_impairment - (ie + (95 - ie) * loss / (loss + bpl))


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


def predicted(reports, ie, bpl):
    return sum(mos(rating(r["rttMs"], r["jitterMs"], r["lossPct"], ie, bpl)) for r in reports) / len(reports)


def fit(results):
    data = list(calls(results))
    best = None
    for ie in range(0, 41):
        for bpl in range(5, 81):
            differences = [predicted(reports, ie, bpl) - pesq for _, pesq, reports in data]
            score = (max(abs(d) for d in differences), sum(d * d for d in differences))
            if best is None or score < best[0]:
                best = (score, ie, bpl)
    return best, data


if __name__ == "__main__":
    path = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".build/quality/results.json")
    ((worst_case, error), ie, bpl), data = fit(json.loads(path.read_text()))
    print(f"Ie = {ie}, Bpl = {bpl} (largest difference {worst_case:.2f}, squared error {error:.3f} over {len(data)} calls)")
    print(f"{'cell':<22}{'PESQ':>6}{'in force':>10}{'fitted':>8}")
    worst = 0.0
    for cell, pesq, reports in data:
        old, new = predicted(reports, OPUS_IE, OPUS_BPL), predicted(reports, ie, bpl)
        worst = max(worst, abs(new - pesq))
        print(f"{cell:<22}{pesq:>6.2f}{old:>10.2f}{new:>8.2f}")
    print(f"largest difference with the fitted values: {worst:.2f}")
