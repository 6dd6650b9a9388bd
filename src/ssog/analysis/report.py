"""Plain-text tables of the analyses' results."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

__all__ = ["field_table", "kernels_table", "lipschitz_table", "sinks_table"]


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _label(result: dict[str, Any]) -> str:
    """The model's name and, for a trained one, its run folder (runs of one model differ by it)
    unless the folder is named after the model."""
    source, model = result["source"], result["model"]
    folder = None if source.startswith("random init") else Path(source).parent.name
    return model if folder in (None, model) else f"{model} ({folder})"


def _setting(result: dict[str, Any]) -> str:
    steer = f" steered ({','.join(result['steer'])})" if result.get("steer") else ""
    return f"{result['family']} {result['op']}{steer}"


def sinks_table(results: Sequence[dict[str, Any]]) -> str:
    """Table 5: one row per model."""
    header = ["model", "setting", "source", "images", "layers", "sink mean", "sink worst", "rollout",
              "same key %", "CLS %", "high-norm %"]
    rows = [[
        r["model"], _setting(r), r["source"], str(r["images"]), str(r["layers"]),
        f"{r['sink_mean']:.2f}", f"{r['sink_worst']:.2f}", f"{r['rollout']:.2f}",
        f"{r['same_key_percent']:.0f}", "-" if r["cls_percent"] is None else f"{r['cls_percent']:.2f}",
        f"{r['high_norm_percent']:.2f}",
    ] for r in results]
    return _table(header, rows)


def lipschitz_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per model and target: the bound, then the largest estimate over scales up to
    each column's scale."""
    scales = results[0]["scales"] if results else []
    header = ["model", "setting", "target", "bound", *(f"s={s:g}" for s in scales)]
    rows = []
    for r in results:
        for target in ("mixer", "field"):
            curve = r["summary"].get(target)
            if curve:
                rows.append([_label(r), _setting(r), target, _number(curve["bound"]),
                             *(_number(v) for v in curve["ball"])])
    return _table(header, rows)


def kernels_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per SSoG mixer; then each model's mixture weights per head."""
    header = ["model", "mixer", "steer", "min sigma", "mean |mu|", "max |mu|", "max weight", "effective atoms"]
    rows, weights = [], []
    for r in results:
        stats = r["kernels"]
        for m in stats["mixers"]:
            rows.append([_label(r), m["module"], ",".join(m["steer"]) or "-", f"{m['min_sigma']:.3f}",
                         f"{m['mean_abs_mu']:.3f}", f"{m['max_abs_mu']:.3f}", f"{m['max_weight']:.3f}",
                         f"{m['effective_atoms']:.2f}"])
            weights.append(f"{_label(r)} {m['module']} weights: "
                           + "  ".join(f"h{h} " + " ".join(f"{w:.2f}" for w in head)
                                       for h, head in enumerate(m["weight"])))
        rows.append([_label(r), "(all)", "", f"{stats['min_sigma']:.3f}", f"{stats['mean_abs_mu']:.3f}", "",
                     f"{stats['max_weight']:.3f}", f"{stats['effective_atoms']:.2f}"])
    return _table(header, rows) + "\n\n" + "\n".join(weights)


def field_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per model: the continuous field's branches, means over its evaluations."""
    header = ["model", "setting", "evaluations", "|gate| mixer", "|gate| MLP", "mixer RMS", "MLP RMS",
              "MLP share", "state RMS"]
    rows = [[
        _label(r), _setting(r), str(len(r["evaluations"])), _number(r["mean"]["gate_mixer"]),
        _number(r["mean"]["gate_mlp"]), _number(r["mean"]["mixer"]), _number(r["mean"]["mlp"]),
        "-" if r["mlp_share"] is None else f"{r['mlp_share']:.2f}", _number(r["mean"]["state"]),
    ] for r in results]
    return _table(header, rows)
