"""The paper's scaling figures from model-sweep results, as PNG and PDF.

- Fig. 5 (``fig5_scaling``): families (rows) x batch sizes (columns); throughput (left
  axis) and peak memory (right axis) against resolution, log axes. MHA solid circles,
  SSoG dashed triangles; an ``x`` (MHA) or ``+`` (SSoG) at the first resolution that ran
  out of memory, drawn at the curve's last measured value. With ``error_bars``, each
  throughput point spans the images/s of the latency's quartiles (the spread over the
  timed iterations the sweep already measures).
- Fig. 4 (``fig4_improvement``): per family, SSoG's throughput gain and memory saving over
  MHA in percent, averaged over batch sizes, by resolution; last panel, the FLOP
  reduction of the whole model and of attention alone.
- Fig. 1 (``fig1_width``): per family, throughput against peak memory at the largest
  resolution as the width grows (drawn when the results hold at least two widths).

Figures are built on :class:`matplotlib.figure.Figure` directly, so no pyplot backend or
display is needed.
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter, NullFormatter, ScalarFormatter

from ssog.bench.report import paired_points
from ssog.bench.results import FIGURES, BenchResults
from ssog.files import save_figure

__all__ = ["FIGURES", "plot_improvement", "plot_results", "plot_scaling", "plot_width", "throughput_spread"]

THROUGHPUT_COLOR = "tab:blue"
MEMORY_COLOR = "tab:pink"
STYLE = {  # op -> line style, marker, out-of-memory marker, label
    "mha": ("-", "o", "x", "MHA"),
    "ssog": ("--", "^", "+", "SSoG"),
}
FAMILY_TITLES = {"odevit": "Continuous (ODE-ViT)", "vit": "Discrete (ViT)", "loopvit": "Looped (bViT)"}
FAMILY_ORDER = tuple(FAMILY_TITLES)
#: The figures :func:`plot_results` draws (each as ``.png`` and ``.pdf``).


def _families(rows: Sequence[dict[str, Any]]) -> list[str]:
    present = {row["family"] for row in rows}
    return [family for family in FAMILY_ORDER if family in present] + sorted(present - set(FAMILY_ORDER))


def _resolution_axis(ax, resolutions: Sequence[int]) -> None:
    ax.set_xscale("log")
    ax.set_xticks(sorted(set(resolutions)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("resolution (px)")


def _save(fig: Figure, stem: Path) -> list[Path]:
    return save_figure(fig, stem.with_suffix(".png"), stem.with_suffix(".pdf"), dpi=150, bbox_inches="tight")


def throughput_spread(row: dict[str, Any]) -> tuple[float, float] | None:
    """How far the images/s of a row's latency quartiles lie below and above its median
    throughput: ``(median - batch / q3, batch / q1 - median)``; None for a row without
    quartiles (results written before they were kept)."""
    q1, q3 = row.get("latency_ms_q1"), row.get("latency_ms_q3")
    if not q1 or not q3:
        return None
    median = row["images_per_s"]
    return median - 1e3 * row["batch_size"] / q3, 1e3 * row["batch_size"] / q1 - median


def plot_scaling(rows: Sequence[dict[str, Any]], stem: str | os.PathLike, error_bars: bool = False) -> list[Path]:
    """Fig. 5 from the rows of one width; writes ``stem.png`` and ``stem.pdf``; with
    ``error_bars``, the throughput's quartiles (:func:`throughput_spread`) as error bars."""
    families = _families(rows)
    batches = sorted({row["batch_size"] for row in rows})
    resolutions = [row["resolution"] for row in rows]
    fig = Figure(figsize=(3.4 * len(batches) + 0.6, 2.8 * len(families)), layout="constrained")
    axes = fig.subplots(len(families), len(batches), squeeze=False)
    for i, family in enumerate(families):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            memory_ax = ax.twinx()
            for op, (line, marker, oom_marker, label) in STYLE.items():
                curve = sorted(
                    (row for row in rows if (row["family"], row["batch_size"], row["op"]) == (family, batch, op)),
                    key=lambda row: row["resolution"],
                )
                done = [row for row in curve if row["status"] == "ok"]
                for axis, key, color, what in (
                    (ax, "images_per_s", THROUGHPUT_COLOR, "images/s"),
                    (memory_ax, "peak_memory_mib", MEMORY_COLOR, "MiB"),
                ):
                    spreads = [throughput_spread(row) for row in done] if error_bars and axis is ax else []
                    if spreads and all(spreads):
                        axis.errorbar([row["resolution"] for row in done], [row[key] for row in done],
                                      yerr=[[low for low, _ in filter(None, spreads)],
                                            [high for _, high in filter(None, spreads)]],
                                      linestyle=line, marker=marker, color=color, capsize=3, label=f"{label} {what}")
                    else:
                        axis.plot([row["resolution"] for row in done], [row[key] for row in done], linestyle=line,
                                  marker=marker, color=color, label=f"{label} {what}")
                    oom = next((row for row in curve if row["status"] == "oom"), None)
                    if oom is not None and done:
                        axis.plot(oom["resolution"], done[-1][key], marker=oom_marker, color=color, markersize=10,
                                  markeredgewidth=2, linestyle="none")
                    elif oom is not None:  # out of memory at the first resolution: nothing to anchor to
                        axis.plot(oom["resolution"], 0.03, marker=oom_marker, color=color, markersize=10,
                                  markeredgewidth=2, transform=axis.get_xaxis_transform(), linestyle="none")
            _resolution_axis(ax, resolutions)
            for axis, color in ((ax, THROUGHPUT_COLOR), (memory_ax, MEMORY_COLOR)):
                if axis.has_data():
                    axis.set_yscale("log")
                    axis.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
                    axis.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
                axis.tick_params(axis="y", which="both", colors=color, labelsize=7)
            ax.set_title(f"{FAMILY_TITLES.get(family, family)}, batch {batch}", fontsize=9)
            if j == 0:
                ax.set_ylabel("throughput (images/s)", color=THROUGHPUT_COLOR)
            if j == len(batches) - 1:
                memory_ax.set_ylabel("peak memory (MiB)", color=MEMORY_COLOR)
            if i == 0 and j == 0:
                handles = ax.get_legend_handles_labels()[0] + memory_ax.get_legend_handles_labels()[0]
                ax.legend(handles=handles, fontsize=7, loc="upper right")
    return _save(fig, Path(stem))


def plot_improvement(rows: Sequence[dict[str, Any]], stem: str | os.PathLike) -> list[Path]:
    """Fig. 4 from the rows of one width; writes ``stem.png`` and ``stem.pdf``."""
    families = _families(rows)
    pairs = [pair for pair in paired_points(rows) if pair["throughput_ratio"] is not None]
    fig = Figure(figsize=(3.2 * (len(families) + 1), 3.0), layout="constrained")
    axes = fig.subplots(1, len(families) + 1, squeeze=False)[0]
    resolutions = [row["resolution"] for row in rows]
    for ax, family in zip(axes, families):
        by_resolution: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for pair in pairs:
            if pair["family"] == family:
                by_resolution[pair["resolution"]].append(pair)
        xs = sorted(by_resolution)
        throughput = [100 * mean(p["throughput_ratio"] - 1 for p in by_resolution[x]) for x in xs]
        memory = [100 * mean(1 - p["memory_ratio"] for p in by_resolution[x]) for x in xs]
        ax.plot(xs, throughput, marker="o", color=THROUGHPUT_COLOR, label="throughput gain")
        ax.plot(xs, memory, marker="s", color=MEMORY_COLOR, label="memory saved")
        ax.set_title(FAMILY_TITLES.get(family, family), fontsize=9)
    flops_ax = axes[-1]
    for family, marker in zip(families, "osD^v"):
        for key, color, what in (
            ("gflops_per_image", "tab:green", "whole model"),
            ("attention_gflops_per_image", "tab:purple", "attention"),
        ):
            per_op = {
                (row["op"], row["resolution"]): row[key]
                for row in rows
                if row["family"] == family and row.get(key) is not None
            }
            xs = sorted({res for op, res in per_op if ("mha", res) in per_op and ("ssog", res) in per_op})
            ys = [100 * (1 - per_op["ssog", x] / per_op["mha", x]) for x in xs]
            flops_ax.plot(xs, ys, marker=marker, color=color, label=f"{what}, {family}", alpha=0.8)
    flops_ax.set_title("FLOPs reduction", fontsize=9)
    for ax in axes:
        ax.axhline(0, color="gray", linestyle="--", linewidth=1)
        _resolution_axis(ax, resolutions)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("SSoG vs MHA (%)")
    return _save(fig, Path(stem))


def plot_width(rows: Sequence[dict[str, Any]], stem: str | os.PathLike) -> list[Path]:
    """Fig. 1 from rows of one resolution and batch size across widths; writes PNG and PDF."""
    families = _families(rows)
    fig = Figure(figsize=(3.6 * len(families), 3.2), layout="constrained")
    axes = fig.subplots(1, len(families), squeeze=False)[0]
    for ax, family in zip(axes, families):
        for op, (line, marker, _, label) in STYLE.items():
            points = sorted(
                (row for row in rows if row["family"] == family and row["op"] == op and row["status"] == "ok"),
                key=lambda row: row["dim"],
            )
            ax.plot(
                [row["peak_memory_mib"] for row in points],
                [row["images_per_s"] for row in points],
                linestyle=line,
                marker=marker,
                label=label,
            )
            for row in points:
                ax.annotate(f"D={row['dim']}", (row["peak_memory_mib"], row["images_per_s"]), fontsize=7,
                            textcoords="offset points", xytext=(4, 4))
        ax.set_xlabel("peak memory (MiB)")
        ax.set_title(FAMILY_TITLES.get(family, family), fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("throughput (images/s)")
    resolution, batch = rows[0]["resolution"], rows[0]["batch_size"]
    fig.suptitle(f"{resolution} px, batch {batch}", fontsize=10)
    return _save(fig, Path(stem))


def plot_results(results: BenchResults, output_dir: str | os.PathLike, error_bars: bool = False) -> list[Path]:
    """Draw every figure the sweep ``results`` support into ``output_dir`` (``error_bars``:
    Fig. 5's throughput quartiles, :func:`plot_scaling`)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    grid_size = results.config["size"]
    grid = [row for row in results.rows if row["size"] == grid_size]
    if not grid:
        raise ValueError(f"the results hold no rows of the sweep's width {grid_size!r}")
    scaling, improvement, width_figure = (output_dir / stem for stem in FIGURES)
    paths = plot_scaling(grid, scaling, error_bars) + plot_improvement(grid, improvement)
    largest = max(row["resolution"] for row in results.rows)
    width_batch = results.config.get("width_batch_size") or min(row["batch_size"] for row in grid)
    width = [row for row in results.rows if row["resolution"] == largest and row["batch_size"] == width_batch]
    if len({row["size"] for row in width}) >= 2:
        paths += plot_width(width, width_figure)
    return paths
