"""Figures of the analyses, drawn on bare matplotlib ``Figure`` objects (no pyplot, so no
display or global backend is touched)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib
from matplotlib.figure import Figure
from torch import nn

from ..files import save_figure
from .kernels import kernel_maps, kernel_snapshots
from .steering import MOVE_LABELS

__all__ = ["plot_field", "plot_kernels", "plot_lipschitz", "plot_steering", "TARGETS"]

TARGETS = {"mixer": "token mixer (worst layer)", "field": "continuous vector field (worst step)"}


def _positive(values: Sequence[float]) -> list[float]:
    """Log axes cannot show 0 (e.g. a fresh adaLN-Zero field): leave those points out."""
    return [v if v > 0 else math.nan for v in values]


def plot_lipschitz(results: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Lipschitz estimates against input scale, one panel per target (mixer, field).

    ``results``: :func:`ssog.analysis.lipschitz.lipschitz_analysis` outputs, each with a
    ``label``. Solid: largest estimate over scales up to x; dotted: estimate at x;
    dashed: analytic bound.
    """
    targets = [t for t in TARGETS if any(r["summary"].get(t) for r in results)]
    fig = Figure(figsize=(5.5 * len(targets), 4.2))
    axes = fig.subplots(1, len(targets), squeeze=False)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, target in zip(axes[0], targets):
        for i, result in enumerate(results):
            curve = result["summary"].get(target)
            if not curve:
                continue
            if not any(v > 0 for v in curve["ball"]):
                ax.text(0.5, 0.5 - 0.06 * i, f"{result['label']}: all estimates 0", transform=ax.transAxes,
                        ha="center", fontsize=7)
                continue
            color = colors[i % len(colors)]
            ax.plot(result["scales"], _positive(curve["ball"]), "-o", color=color, ms=3, label=result["label"])
            ax.plot(result["scales"], _positive(curve["local"]), ":", color=color, alpha=0.7)
            if curve["bound"]:
                ax.axhline(curve["bound"], color=color, ls="--", lw=1)
        ax.set(xscale="log", xlabel="input scale", ylabel="Lipschitz estimate", title=TARGETS[target])
        if ax.lines:
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("solid: max over scales <= x   dotted: at x   dashed: analytic bound", fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_field(results: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """The continuous field's branches along the flow, one colour per model: left, the size
    of each gated branch (solid: token mixer, dashed: MLP); middle, the mean |gate| of each;
    right, with any SSoG model, its kernels' reach (mean over heads).

    ``results``: :func:`ssog.analysis.field.field_branches` outputs, each with a ``label``.
    """
    with_reach = any("kernel_reach" in e for r in results for e in r["evaluations"])
    fig = Figure(figsize=(16 if with_reach else 11, 4.2 + 0.2 * len(results)))
    sizes, gates, *reach = fig.subplots(1, 3 if with_reach else 2)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, result in enumerate(results):
        color, steps = colors[i % len(colors)], result["evaluations"]
        times = [e["t"] for e in steps]
        for ax, (mixer, mlp) in ((sizes, ("mixer", "mlp")), (gates, ("gate_mixer", "gate_mlp"))):
            ax.plot(times, [e[mixer] for e in steps], "-o", color=color, ms=3, label=f"{result['label']} mixer")
            ax.plot(times, [e[mlp] for e in steps], "--s", color=color, ms=3, label=f"{result['label']} MLP")
        if reach and "kernel_reach" in steps[0]:
            reach[0].plot(times, [e["kernel_reach"] for e in steps], "-o", color=color, ms=3)
    sizes.set(xlabel="t", ylabel="RMS of the gated branch per token", title="branch sizes along the flow")
    gates.set(xlabel="t", ylabel="mean |gate| over channels", title="adaLN-Zero gates")
    if reach:
        reach[0].set(xlabel="t", ylabel="RMS distance read, tokens (mean over heads)", title="SSoG kernels' reach")
    for ax in (sizes, gates, *reach):
        ax.grid(True, alpha=0.3)
    fig.legend(*sizes.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, 0.03 + 0.035 * len(results), 1, 1))  # room for the legend below
    return _save(fig, path)


def plot_steering(results: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """How far steering moves the mixtures, one colour per model, against the steered mixer
    (in model order): the gates' open fraction (mean over the steered parameters), then one
    panel per move (solid: mean over heads; dashed: the largest head's).

    ``results``: :func:`ssog.analysis.steering.steering_moves` outputs, each with a ``label``.
    """
    fig = Figure(figsize=(14, 3.6 + 0.2 * len(results)))
    gates, *moves = fig.subplots(1, 1 + len(MOVE_LABELS))
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, result in enumerate(results):
        color, mixers = colors[i % len(colors)], result["mixers"]
        where = range(len(mixers))
        gates.plot(where, [sum(m["gates"].values()) / len(m["gates"]) for m in mixers], "-o", color=color, ms=3,
                   label=result["label"])
        for ax, key in zip(moves, MOVE_LABELS):
            mean = [m.get(key, math.nan) for m in mixers]
            top = [m.get(f"{key}_top_head", math.nan) for m in mixers]
            ax.plot(where, mean, "-o", color=color, ms=3)
            ax.plot(where, top, "--", color=color, alpha=0.6)
    gates.set(ylabel="gate open, sigmoid(alpha)", yscale="log", title="steering gates")
    for ax, label in zip(moves, MOVE_LABELS.values()):
        ax.set(ylabel=label, title=label)
    for ax in (gates, *moves):
        ax.set_xlabel("steered mixer (block, in order)")
        ax.grid(True, alpha=0.3)
    fig.legend(*gates.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    fig.tight_layout(rect=(0, 0.03 + 0.035 * len(results), 1, 1))  # room for the legend below
    return _save(fig, path)


def plot_kernels(model: nn.Module, path: str | Path, title: str = "") -> Path:
    """One row per SSoG mixer, one column per head: the mixing weights from the central
    query of the model's token grid, with each atom's centre marked (size ~ its weight); a
    mixer whose kernels move with ``t`` has a row per time (:func:`kernel_snapshots`)."""
    patch_embed: Any = model.patch_embed  # timm's PatchEmbed
    grid = tuple(patch_embed.grid_size)
    snapshots = kernel_snapshots(model)
    heads = max(m.num_heads for _, m, _ in snapshots)
    fig = Figure(figsize=(1.7 * heads, 1.8 * len(snapshots) + 0.4))
    axes = fig.subplots(len(snapshots), heads, squeeze=False)
    qy, qx = grid[0] // 2, grid[1] // 2
    for row, (name, mixer, offset) in zip(axes, snapshots):
        maps = kernel_maps(mixer, grid, (qy, qx), offset).cpu()
        params = {k: v.detach().cpu() for k, v in mixer.kernel_parameters(offset).items()}
        for head, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            if head >= mixer.num_heads:
                ax.axis("off")
                continue
            ax.imshow(maps[head].numpy(), cmap="viridis")
            centres = params["mu"][head] + params["mu"].new_tensor([qy, qx])
            ax.scatter(centres[:, 1], centres[:, 0], s=80 * params["weight"][head] + 4, c="red", marker="x", lw=1)
            ax.set(xlim=(-0.5, grid[1] - 0.5), ylim=(grid[0] - 0.5, -0.5))  # centres may lie outside
            ax.set_title(f"h{head} min sigma {float(params['sigma'][head].min()):.2f}", fontsize=7)
            if head == 0:
                ax.set_ylabel(name, fontsize=7)
    fig.suptitle(f"{title}  query ({qy}, {qx}) of a {grid[0]}x{grid[1]} grid; x: atom centres", fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    return path
