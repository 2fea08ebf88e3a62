"""The setup benchmark's section of docs/benchmarks.md and its plot, from one run of setup.py."""

import datetime
import re

BEGIN, END = "<!-- setup-benchmark: begin (scripts/bench-setup.sh --report writes this) -->", "<!-- setup-benchmark: end -->"
PLOT = "benchmarks/answer-to-voice.png"


def plot(results, cells, pairs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.6), sharey=True, squeeze=False)
    for axis, cell in zip(axes[0], cells):
        data = [[r["bothHear"] for r in results if r["cell"] == cell and r["pair"] == pair and "failed" not in r] for pair in pairs]
        axis.boxplot([d if d else [float("nan")] for d in data], whis=(5, 95), showfliers=True)
        for index, values in enumerate(data, start=1):
            axis.scatter([index] * len(values), values, s=8, alpha=0.6)
        axis.set_xticks(range(1, len(pairs) + 1), [p.replace("parley-parley-classic", "parley classic").replace("parley-parley", "parley early")
                                                   .replace("chromium-chromium", "chromium").replace("chromium-parley", "chr→parley")
                                                   for p in pairs], rotation=30, fontsize=8)
        axis.set_title(f"round trip {cell}", fontsize=9)
        axis.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("answer → both hear (ms)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def section(results, table, failures, cells, pairs, args, ratio_lines):
    calls = args.calls
    lines = [BEGIN, "",
             f"{datetime.date.today().isoformat()}, this machine (2 cores), {args.build} build of `parley`, {calls} calls per cell "
             f"and pair, each ringing {args.ring:g} s; p50 / p95 in ms (`bash scripts/bench-setup.sh --report`):", ""]
    from setup import MEASURES
    for key, words in MEASURES:
        lines.append(f"**{words}**")
        lines.append("")
        lines.append("| round trip | " + " | ".join(pairs) + " |")
        lines.append("|---|" + "---:|" * len(pairs))
        for cell in cells:
            cells_text = []
            for pair in pairs:
                value = table.get((cell, pair), {}).get(key)
                text = f"{value[0]:.0f} / {value[1]:.0f}" if value else "—"
                if failures.get((cell, pair)):
                    text += f" ({failures[(cell, pair)]} failed)"
                cells_text.append(text)
            lines.append(f"| {cell} | " + " | ".join(cells_text) + " |")
        lines.append("")
    lines += [f"![answer to both hearing, per cell and pair]({PLOT})", ""]
    lines += [f"- {line}" for line in ratio_lines]
    lines += ["", END]
    return "\n".join(lines)


def write(results, table, failures, cells, pairs, args, docs):
    from setup import ratios
    plot(results, cells, pairs, docs / PLOT)
    text = section(results, table, failures, cells, pairs, args, ratios(table))
    path = docs / "benchmarks.md"
    current = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(current):
        raise SystemExit(f"{path} has no setup-benchmark markers")
    path.write_text(pattern.sub(lambda _: text, current))
    print(f"== wrote {path} and {docs / PLOT}")
