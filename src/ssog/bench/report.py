"""SSoG versus MHA comparisons of model-sweep rows: paired points and a Markdown table."""
from __future__ import annotations

from typing import Any, Iterable

__all__ = ["comparison_table", "paired_points"]

_KEY = ("family", "size", "resolution", "batch_size")


def paired_points(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (family, size, resolution, batch size) holding the ``mha`` and ``ssog`` rows.

    Entries keep the order in which the points were measured; a side that was not measured
    is ``None``. ``throughput_ratio`` and ``memory_ratio`` are SSoG over MHA (of the median
    throughputs and of the peaks) where both sides have status ``"ok"``, else ``None``.
    """
    pairs: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        key = tuple(row[name] for name in _KEY)
        pair = pairs.setdefault(key, {**dict(zip(_KEY, key)), "mha": None, "ssog": None})
        pair[row["op"]] = row
    for pair in pairs.values():
        mha, ssog = pair["mha"], pair["ssog"]
        both = mha is not None and ssog is not None and mha["status"] == ssog["status"] == "ok"
        pair["throughput_ratio"] = ssog["images_per_s"] / mha["images_per_s"] if both else None
        pair["memory_ratio"] = ssog["peak_memory_mib"] / mha["peak_memory_mib"] if both else None
    return list(pairs.values())


def _cell(row: dict[str, Any] | None, key: str, digits: int) -> str:
    if row is None:
        return "-"
    if row["status"] != "ok":
        return row["status"].upper() if row["status"] == "oom" else row["status"]
    return f"{row[key]:.{digits}f}"


def comparison_table(rows: Iterable[dict[str, Any]]) -> str:
    """Markdown table of throughput and peak memory, MHA vs SSoG, with SSoG/MHA ratios.

    "SSoG/MHA" is the ratio of median throughputs; "paired speedup" the median over rounds
    of ``t_mha / t_ssog`` of back-to-back calls, with its quartiles.
    """
    lines = [
        "| family | size | px | tokens | batch | MHA img/s | SSoG img/s | SSoG/MHA | paired speedup [q1, q3] "
        "| MHA MiB | SSoG MiB | SSoG/MHA mem |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pair in paired_points(rows):
        side = pair["mha"] or pair["ssog"]
        ratio = "-" if pair["throughput_ratio"] is None else f"{pair['throughput_ratio']:.2f}x"
        memory = "-" if pair["memory_ratio"] is None else f"{pair['memory_ratio']:.2f}x"
        ssog = pair["ssog"]
        paired = "-"
        if ssog is not None and ssog.get("speedup") is not None:
            paired = f"{ssog['speedup']:.2f}x [{ssog['speedup_q1']:.2f}, {ssog['speedup_q3']:.2f}]"
        lines.append(
            f"| {pair['family']} | {pair['size']} | {pair['resolution']} | {side['tokens'] or '-'} "
            f"| {pair['batch_size']} | {_cell(pair['mha'], 'images_per_s', 2)} "
            f"| {_cell(pair['ssog'], 'images_per_s', 2)} | {ratio} | {paired} "
            f"| {_cell(pair['mha'], 'peak_memory_mib', 1)} | {_cell(pair['ssog'], 'peak_memory_mib', 1)} | {memory} |"
        )
    return "\n".join(lines) + "\n"
