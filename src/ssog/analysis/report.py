"""Tables of the analyses' results: plain text for the terminal, and, for the sinks, the
kernels and the steering, the same rows as CSV and a Markdown table (:data:`TABLE_ROWS`, :func:`csv_table`,
:func:`markdown_table`) for a paper's or a README's table."""
from __future__ import annotations

import csv
import io
from typing import Any, Callable, Sequence

from .loading import source_folder
from .steering import MOVE_LABELS

__all__ = [
    "TABLE_ROWS", "csv_table", "field_table", "kernels_rows", "kernels_table", "lipschitz_table", "markdown_table",
    "sinks_rows", "sinks_table", "steering_rows", "steering_table",
]

#: A table's header and rows (cells as text).
Rows = tuple[list[str], list[list[str]]]


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _label(result: dict[str, Any]) -> str:
    """The model's name and, for a trained one, its run or release folder (runs of one model
    differ by it) unless the folder is named after the model."""
    model, folder = result["model"], source_folder(result["source"])
    return model if folder in (None, model) else f"{model} ({folder})"


def _setting(result: dict[str, Any]) -> str:
    steer = f" steered ({','.join(result['steer'])})" if result.get("steer") else ""
    return f"{result['family']} {result['op']}{steer}"


def csv_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The table as CSV (a header line, then one line per row)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The table in Markdown (``|`` in a cell escaped)."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, rows)]) + "\n"


def sinks_table(results: Sequence[dict[str, Any]]) -> str:
    """Table 5: one row per model."""
    return _table(*sinks_rows(results))


def sinks_rows(results: Sequence[dict[str, Any]]) -> Rows:
    """Table 5's header and rows: one per model."""
    header = ["model", "setting", "source", "images", "layers", "sink mean", "sink worst", "rollout",
              "same key %", "CLS %", "high-norm %"]
    rows = [[
        r["model"], _setting(r), r["source"], str(r["images"]), str(r["layers"]),
        f"{r['sink_mean']:.2f}", f"{r['sink_worst']:.2f}", f"{r['rollout']:.2f}",
        f"{r['same_key_percent']:.0f}", "-" if r["cls_percent"] is None else f"{r['cls_percent']:.2f}",
        f"{r['high_norm_percent']:.2f}",
    ] for r in results]
    return header, rows


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
    weights = [f"{_label(r)} {m['module']} weights: "
               + "  ".join(f"h{h} " + " ".join(f"{w:.2f}" for w in head) for h, head in enumerate(m["weight"]))
               for r in results for m in r["kernels"]["mixers"]]
    return _table(*kernels_rows(results)) + "\n\n" + "\n".join(weights)


def kernels_rows(results: Sequence[dict[str, Any]]) -> Rows:
    """The kernel statistics' header and rows: one per SSoG mixer, then one per model (``(all)``)."""
    header = ["model", "mixer", "steer", "min sigma", "mean |mu|", "max |mu|", "max weight", "effective atoms"]
    rows = []
    for r in results:
        stats = r["kernels"]
        for m in stats["mixers"]:
            rows.append([_label(r), m["module"], ",".join(m["steer"]) or "-", f"{m['min_sigma']:.3f}",
                         f"{m['mean_abs_mu']:.3f}", f"{m['max_abs_mu']:.3f}", f"{m['max_weight']:.3f}",
                         f"{m['effective_atoms']:.2f}"])
        rows.append([_label(r), "(all)", "", f"{stats['min_sigma']:.3f}", f"{stats['mean_abs_mu']:.3f}", "",
                     f"{stats['max_weight']:.3f}", f"{stats['effective_atoms']:.2f}"])
    return header, rows


def field_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per model: the continuous field's branches, means over its evaluations."""
    header = ["model", "setting", "evaluations", "|gate| mixer", "|gate| MLP", "mixer RMS", "MLP RMS",
              "MLP share", "state RMS", "kernel reach"]
    rows = [[
        _label(r), _setting(r), str(len(r["evaluations"])), _number(r["mean"]["gate_mixer"]),
        _number(r["mean"]["gate_mlp"]), _number(r["mean"]["mixer"]), _number(r["mean"]["mlp"]),
        "-" if r["mlp_share"] is None else f"{r['mlp_share']:.2f}", _number(r["mean"]["state"]), _reach(r),
    ] for r in results]
    return _table(header, rows)


def _reach(result: dict[str, Any]) -> str:
    """The field's kernel reach (tokens) along the flow: one number, or first -> last when it moves."""
    reach = [e["kernel_reach"] for e in result["evaluations"] if "kernel_reach" in e]
    if not reach:
        return "-"
    if max(reach) - min(reach) < 5e-4:
        return _number(reach[0])
    return f"{_number(reach[0])} -> {_number(reach[-1])}"


def steering_rows(results: Sequence[dict[str, Any]]) -> Rows:
    """How far steering moves each steered mixer's mixture: one row per mixer, each move as
    "mean (largest head)", ``-`` for a parameter the mixer does not steer."""
    header = ["model", "mixer", "applications", "gates open", *MOVE_LABELS.values()]
    rows = []
    for r in results:
        for m in r["mixers"]:
            gates = " ".join(f"{part} {_number(value, 2)}" for part, value in m["gates"].items())
            moves = [f"{_number(m[key])} ({_number(m[key + '_top_head'])})" if key in m else "-"
                     for key in MOVE_LABELS]
            rows.append([_label(r), m["module"], str(m["applications"]), gates, *moves])
    return header, rows


def steering_table(results: Sequence[dict[str, Any]]) -> str:
    """:func:`steering_rows` as a terminal table."""
    return _table(*steering_rows(results))


#: The analyses whose rows are also written as ``<analysis>.csv`` and ``<analysis>.md``.
TABLE_ROWS: dict[str, Callable[[Sequence[dict[str, Any]]], Rows]] = {"sinks": sinks_rows, "kernels": kernels_rows,
                                                                       "steering": steering_rows}
