"""Plot several `ssog bench` runs side by side: SSoG's paired speedup and MHA's throughput.

    python scripts/compare_bench.py LABEL=RESULTS [LABEL=RESULTS ...] --plot out.png [--title TEXT]

RESULTS is a `results.json` (or its folder). One group of bars per (family, resolution,
batch size) measured in every run, one bar per run: left, the paired speedup of SSoG over
MHA (median, quartiles as error bars); right, MHA's images/s (log axis), which shows how
much the machine's state cost each run. Used for docs/results/scaling.md ("OpenMP spinning").
"""
from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter  # noqa: E402

from ssog.bench.report import paired_points  # noqa: E402
from ssog.bench.results import BenchResults  # noqa: E402


def _points(path: str) -> dict[tuple, dict]:
    pairs = paired_points(BenchResults.load(path).rows)
    return {
        (p["family"], p["resolution"], p["batch_size"]): p
        for p in pairs
        if p["throughput_ratio"] is not None
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=RESULTS")
    parser.add_argument("--plot", required=True, help="output image (PNG or PDF)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    labels, runs = [], []
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"expected LABEL=RESULTS, got {item!r}")
        labels.append(label)
        runs.append(_points(path))
    keys = [key for key in runs[0] if all(key in run for run in runs)]
    if not keys:
        raise SystemExit("the runs share no measured (family, resolution, batch size) point")
    figure, (speed_axis, mha_axis) = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / len(runs)
    for index, (label, run) in enumerate(zip(labels, runs)):
        xs = [k + (index - (len(runs) - 1) / 2) * width for k in range(len(keys))]
        ssog = [run[key]["ssog"] for key in keys]
        medians = [row["speedup"] for row in ssog]
        errors = [[m - row["speedup_q1"] for m, row in zip(medians, ssog)],
                  [row["speedup_q3"] - m for m, row in zip(medians, ssog)]]
        speed_axis.bar(xs, medians, width, yerr=errors, capsize=2, label=label)
        mha_axis.bar(xs, [run[key]["mha"]["images_per_s"] for key in keys], width, label=label)
    names = [f"{family}\n{px} px, b{batch}" for family, px, batch in keys]
    for axis in (speed_axis, mha_axis):
        axis.set_xticks(range(len(keys)), names, fontsize=8)
    speed_axis.axhline(1.0, color="grey", linewidth=0.8)
    speed_axis.set_ylabel("SSoG / MHA paired speedup (median, quartiles)")
    mha_axis.set_yscale("log")
    for formatter in (mha_axis.yaxis.set_major_formatter, mha_axis.yaxis.set_minor_formatter):
        formatter(FormatStrFormatter("%g"))
    mha_axis.set_ylabel("MHA images/s")
    speed_axis.legend(fontsize=8)
    if args.title:
        figure.suptitle(args.title)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=120)
    print(args.plot)


if __name__ == "__main__":
    main()
