"""Markdown table (and a curve plot) of finished `ssog train` runs, for docs/results/accuracy.md.

    python scripts/accuracy_table.py RUN_DIR [RUN_DIR ...] [--plot curves.png] [--title TEXT]
        [--grad-plot grad_norms.png] [--margin-plot margin.png]

One row per run folder, named by the folder: parameters, the last epoch's validation
Acc@1/3/5 and loss, its final train loss, the best Acc@1 and its epoch, and the training
time (sum of the epochs' seconds). `--grad-plot` draws one panel per parameter group: the
epoch's mean gradient norm (`grad_norm` in log.jsonl) per epoch, a line per run.
`--margin-plot` pairs the MHA and SSoG runs of one family, token grid and length (read from
each run's config.yaml) and draws their last-epoch Acc@1 and SSoG's margin against the
training length. `--paper-table` prints the paper's layout instead: per family, width, token
grid and length, each operator setting (MHA; SSoG fixed or steered) with its seeds averaged:
parameters, forward GFLOPs per image, Acc@1, Acc@5, SSoG's margin over MHA and its parameter
saving (where MHA ran at several learning rates, over its best one; rows of one operator name
the settings that set them apart). `--seed-intervals` adds, for each margin with two or more seeds on
both sides, the 95% interval over seeds (Welch's t on the seeds' Acc@1: what training's randomness
leaves open, where `ssog eval --compare` measures only the validation images' noise; needs scipy,
which `[dev]` installs). Reads only what `ssog train` writes: `log.jsonl`, `summary.json` and
`config.yaml`.
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml


def _history(run: Path) -> list[dict]:
    log = run / "log.jsonl"
    if not log.is_file():
        raise SystemExit(f"{run} has no log.jsonl: not an `ssog train` run folder")
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def row(run: Path) -> str:
    history = _history(run)
    last = history[-1]
    best = max(history, key=lambda r: r["acc1"])
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    params = f"{summary['params']:,}" if "params" in summary else "-"
    minutes = sum(r.get("epoch_time_s", 0.0) for r in history) / 60
    return (
        f"| {run.name} | {params} | {last['epoch']} | {last['acc1']:.2f} | {last['acc3']:.2f} | {last['acc5']:.2f} "
        f"| {last['val_loss']:.3f} | {last['train_loss']:.3f} | {best['acc1']:.2f} (ep {best['epoch']}) "
        f"| {minutes:.1f} |"
    )


def plot(runs: list[Path], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        history = _history(run)
        epochs = [r["epoch"] for r in history]
        style = "--" if _is_mha(run) else "-"
        ax_acc.plot(epochs, [r["acc1"] for r in history], style, marker=".", label=run.name)
        (line,) = ax_loss.plot(epochs, [r["train_loss"] for r in history], style, label=f"{run.name} train")
        ax_loss.plot(epochs, [r["val_loss"] for r in history], style, color=line.get_color(), alpha=0.5)
    ax_acc.set(xlabel="epoch", ylabel="validation Acc@1 (%)", title=title)
    ax_loss.set(xlabel="epoch", ylabel="loss (train solid/dashed, val faint)", title="loss")
    ax_acc.legend(fontsize=7)
    ax_acc.grid(alpha=0.3)
    ax_loss.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def grad_plot(runs: list[Path], path: Path, title: str) -> None:
    """One panel per parameter group (the union over runs): mean gradient norm per epoch, log y."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    histories = {}
    for run in runs:
        history = [r for r in _history(run) if "grad_norm" in r]
        if history:
            histories[run] = history
        else:
            print(f"note: {run} has no grad_norm records (a run from before they were logged): skipped")
    if not histories:
        print("no run has grad_norm records: no gradient plot")
        return
    groups = sorted({group for history in histories.values() for r in history for group in r["grad_norm"]})
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    colours = {run: f"C{index}" for index, run in enumerate(histories)}  # one colour per run in every panel
    for ax, group in zip(axes.flat, groups):
        for run, history in histories.items():
            points = [(r["epoch"], r["grad_norm"][group]) for r in history if r["grad_norm"].get(group)]
            if points:
                style = "--" if _is_mha(run) else "-"
                ax.plot(*zip(*points), style, marker=".", color=colours[run], label=run.name)
        ax.set(xlabel="epoch", ylabel="mean gradient L2 norm", title=group, yscale="log")
        ax.grid(alpha=0.3, which="both")
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], linestyle="--" if _is_mha(run) else "-", marker=".",
                          color=colours[run], label=run.name) for run in histories]
    axes.flat[0].legend(handles=handles, fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _is_mha(run: Path) -> bool:
    """Whether the run's model mixes tokens by attention (drawn dashed), from its config.yaml."""
    return _setting(run)[0] == "mha"


def _setting(run: Path) -> tuple[str, str, str, int]:
    """(operator, family, token grid, scheduled epochs) of a run, from its config.yaml: the model name
    (e.g. ``ssog_loopvit_tiny_patch4_32``), ``model_kwargs.patch_size`` over it, and ``img_size``."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    match = re.fullmatch(r"(mha|ssog)_(\w+?)_.*patch(\d+)_\d+", config["model"])
    if match is None:
        raise SystemExit(f"{run}: model {config['model']!r} is not an MHA or SSoG model of this project")
    operator, family, patch = match.group(1), match.group(2), int(match.group(3))
    patch = (config.get("model_kwargs") or {}).get("patch_size", patch)
    side = config["img_size"] // patch
    return operator, family, f"{side}x{side}", config["epochs"]


def paired_acc1(runs: list[Path]) -> dict[tuple[str, str], list[tuple[int, float, float]]]:
    """{(family, token grid): [(epochs, MHA Acc@1, SSoG Acc@1), ...] by length}: the last-epoch
    validation Acc@1 of the settings that have one run of each operator (others are noted)."""
    acc1: dict[tuple[str, str], dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for run in runs:
        operator, family, grid, epochs = _setting(run)
        last = _history(run)[-1]
        if last["epoch"] < epochs:
            print(f"note: {run} has {last['epoch']} of its {epochs} epochs: not in the margin plot")
            continue
        if operator in acc1[family, grid][epochs]:
            raise SystemExit(f"{run}: a second {operator} run of {family}, {grid} tokens, {epochs} epochs")
        acc1[family, grid][epochs][operator] = last["acc1"]
    pairs = {}
    for (family, grid), by_length in sorted(acc1.items()):
        for epochs, ops in sorted(by_length.items()):
            if len(ops) == 2:
                pairs.setdefault((family, grid), []).append((epochs, ops["mha"], ops["ssog"]))
            else:
                print(f"note: {family} {grid} tokens, {epochs} epochs has no {'SSoG' if 'mha' in ops else 'MHA'} "
                      "run: not in the margin plot")
    return pairs


def _setting_of(config: dict) -> dict:
    """A run's config without its seed and output: runs that share it are seeds of one row."""
    return {k: v for k, v in config.items() if k not in ("seed", "output", "overwrite")}


def _identity(config: dict) -> str:
    return json.dumps(_setting_of(config), sort_keys=True, default=str)


def _operator_label(config: dict, operator: str) -> str:
    kwargs = config.get("model_kwargs") or {}
    if operator == "mha":
        return "MHA"
    steer = kwargs.get("steer") or []
    if not steer:
        return "SSoG"
    gate = kwargs.get("steer_gate_init", -8.0)
    return f"SSoG steer {'+'.join(steer)} ({'cold' if gate <= -4 else 'warm'})"


def _num_classes(config: dict, summary: dict) -> int:
    """The run's classifier outputs: its summary's (runs since the data-path change write it), else
    its config's ``num_classes``."""
    classes = summary.get("num_classes") or config.get("num_classes")
    if not classes:
        raise SystemExit(f"{summary.get('model')}: its summary.json and config.yaml do not say its classes")
    return classes


def _gflops(config: dict, num_classes: int) -> float:
    """Forward GFLOPs of one image of the run's model (built on the meta device)."""
    import timm
    import torch

    import ssog.models  # noqa: F401  (registers the models)
    from ssog.models import count_flops

    with torch.device("meta"):
        model = timm.create_model(config["model"], num_classes=num_classes, img_size=config["img_size"],
                                  **(config.get("model_kwargs") or {})).eval()
    return count_flops(model)["total_gflops"]


def _operator_rows(runs: list[Path]) -> dict[str, dict]:
    """{setting: row}: each operator setting of the finished runs (seeds of one setting share a row),
    with its group (family, width, token grid, epochs), label, parameters, GFLOPs and the last
    epoch's Acc@1 and Acc@5 of each seed. Where a group holds one operator setting several times
    (at several learning rates, say), each such row's label names what sets it apart."""
    rows: dict[str, dict] = {}
    for run in runs:
        config = yaml.safe_load((run / "config.yaml").read_text())
        operator, family, grid, epochs = _setting(run)
        last = _history(run)[-1]
        if last["epoch"] < epochs:
            print(f"note: {run} has {last['epoch']} of its {epochs} epochs: left out")
            continue
        summary = json.loads((run / "summary.json").read_text())
        width = (config.get("model_kwargs") or {}).get("embed_dim", "preset")
        row = rows.setdefault(_identity(config), {
            "group": (family, width, grid, epochs), "operator": operator,
            "label": _operator_label(config, operator), "config": config, "params": summary["params"],
            "gflops": _gflops(config, _num_classes(config, summary)), "acc1": [], "acc5": []})
        row["acc1"].append(last["acc1"])
        row["acc5"].append(last["acc5"])
    for group, label in {(row["group"], row["label"]) for row in rows.values()}:
        _name_differences([row for row in rows.values() if (row["group"], row["label"]) == (group, label)])
    return rows


def _groups(rows: dict[str, dict]) -> list[tuple[tuple, list[dict], dict | None]]:
    """[(group, its rows sorted by label, its baseline MHA row or None)], groups ordered by family,
    width, token grid and length. The baseline is the best MHA row by mean Acc@1 (each operator at
    its best rate, as the sweeps choose them)."""
    groups = sorted({row["group"] for row in rows.values()}, key=lambda g: (g[0], str(g[1]).zfill(6), *g[2:]))
    result = []
    for group in groups:
        members = sorted((row for row in rows.values() if row["group"] == group), key=lambda r: r["label"])
        mha = [row for row in members if row["operator"] == "mha"]
        result.append((group, members, max(mha, key=lambda r: _mean(r["acc1"])) if mha else None))
    return result


def _flat(config: dict, prefix: str = "") -> dict[str, Any]:
    """{"model_kwargs.embed_dim": 64, ...}: a config's settings, nested ones by dotted name."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Where and how a run ran, not what it trained: left out of a label (still apart as rows).
_WHERE_RUN = ("data_dir", "device", "progress", "threads", "num_workers")


def _name_differences(rows: list[dict]) -> None:
    """Appends to each row's label the settings (seed aside) in which rows of one label differ,
    e.g. ``MHA, lr 0.002``. A setting a row's config lacks (one written before the setting
    existed) ran at its default, and its label says ``default``."""
    if len(rows) < 2:
        return
    flats = [_flat(_setting_of(row["config"])) for row in rows]
    keys = sorted({key for flat in flats for key in flat})
    differing = [key for key in keys if key not in _WHERE_RUN
                 and len({json.dumps(flat.get(key), default=str) for flat in flats}) > 1]
    for row, flat in zip(rows, flats):
        row["label"] += "".join(f", {key} {_setting_text(flat, key)}" for key in differing)


def _setting_text(flat: dict[str, Any], key: str) -> str:
    if key not in flat:
        return "default"
    value = flat[key]
    return f"{value:g}" if isinstance(value, float) else str(value)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _is_compared(row: dict, baseline: dict | None) -> bool:
    """Whether the row gets a margin over the baseline: every SSoG row of a group with an MHA row."""
    return baseline is not None and row["operator"] != "mha"


def paper_table(runs: list[Path]) -> list[str]:
    """Markdown rows in the paper's layout (module docstring), one per operator setting."""
    lines = ["| family | width | tokens | epochs | operator | seeds | params | saving | GFLOPs | Acc@1 | Acc@5 "
             "| margin |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for group, members, baseline in _groups(_operator_rows(runs)):
        for row in members:
            is_ssog = _is_compared(row, baseline)
            saving = f"{1 - row['params'] / baseline['params']:.1%}" if is_ssog else ""
            margin = f"{_mean(row['acc1']) - _mean(baseline['acc1']):+.2f}" if is_ssog else ""
            seeds = ", ".join(f"{a:.2f}" for a in row["acc1"]) if len(row["acc1"]) > 1 else "1"
            family, width, grid, epochs = group
            lines.append(f"| {family} | {width} | {grid} | {epochs} | {row['label']} | {seeds} | {row['params']:,} "
                         f"| {saving} | {row['gflops']:.4f} | {_mean(row['acc1']):.2f} | {_mean(row['acc5']):.2f} "
                         f"| {margin} |")
    return lines


def seed_intervals(runs: list[Path]) -> list[str]:
    """Markdown rows: each SSoG setting's margin over its group's MHA baseline (as in
    `paper_table`) where both rows hold two or more seeds, with the 95% interval and p-value of a
    difference of two seed means (Welch's t, unequal variances). Two seeds a side leave one or two
    degrees of freedom, so the interval is wide: it says how far another draw of seeds could move
    the margin."""
    from scipy import stats  # Welch's interval needs Student's t quantiles at fractional degrees of freedom

    lines = ["| family | width | tokens | epochs | operator | seeds (SSoG / MHA) | margin | 95% over seeds | p |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (family, width, grid, epochs), members, baseline in _groups(_operator_rows(runs)):
        for row in members:
            if not _is_compared(row, baseline):
                continue
            if min(len(row["acc1"]), len(baseline["acc1"])) < 2:
                print(f"note: {family} width {width} {grid} tokens, {row['label']} against {baseline['label']}: "
                      "fewer than two seeds a side, no interval over seeds")
                continue
            test = stats.ttest_ind(row["acc1"], baseline["acc1"], equal_var=False)
            low, high = test.confidence_interval(0.95)
            lines.append(f"| {family} | {width} | {grid} | {epochs} | {row['label']} against {baseline['label']} "
                         f"| {len(row['acc1'])} / {len(baseline['acc1'])} "
                         f"| {_mean(row['acc1']) - _mean(baseline['acc1']):+.2f} | {low:+.2f} to {high:+.2f} "
                         f"| {test.pvalue:.2g} |")
    return lines


def margin_plot(runs: list[Path], path: Path, title: str) -> None:
    """Last-epoch validation Acc@1 of each operator (left) and SSoG minus MHA (right) against the
    training length, one line per family and token grid (`paired_acc1`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_margin) = plt.subplots(1, 2, figsize=(11, 4))
    plotted_lengths: set[int] = set()
    for index, ((family, grid), pairs) in enumerate(paired_acc1(runs).items()):
        lengths = [n for n, _, _ in pairs]
        plotted_lengths.update(lengths)
        label = f"{family} {grid}"
        ax_acc.plot(lengths, [mha for _, mha, _ in pairs], "--", marker="o", color=f"C{index}", label=f"{label} MHA")
        ax_acc.plot(lengths, [ssog for _, _, ssog in pairs], "-", marker="o", color=f"C{index}", label=f"{label} SSoG")
        margins = [ssog - mha for _, mha, ssog in pairs]
        ax_margin.plot(lengths, margins, marker="o", color=f"C{index}", label=label)
        for n, margin in zip(lengths, margins):
            ax_margin.annotate(f"{margin:+.2f}", (n, margin), textcoords="offset points",
                               xytext=(4, 4 + 11 * index), fontsize=8, color=f"C{index}")  # lines apart
    for ax in (ax_acc, ax_margin):
        ax.set_xscale("log")
        ax.set_xticks(sorted(plotted_lengths), [str(n) for n in sorted(plotted_lengths)])
        ax.minorticks_off()
        ax.set_xlabel("training length (epochs, each with its own schedule)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    ax_acc.set(ylabel="validation Acc@1 after the last epoch (%)", title=title or "accuracy")
    ax_margin.set(ylabel="SSoG - MHA (Acc@1 points)", title="margin")
    ax_margin.axhline(0, color="black", linewidth=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def setting_margin_plot(runs: list[Path], path: Path, title: str, goals: dict[str, float]) -> None:
    """SSoG's margin over MHA (Acc@1 points, seeds averaged, each seed a dot) per family, width and
    token grid, one bar per SSoG setting; `goals` ({family: points}) draws each family's target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = []  # (x label, setting label, mean margin, per-seed margins, goal)
    for (family, width, grid, epochs), members, baseline in _groups(_operator_rows(runs)):
        if baseline is None:
            print(f"note: {family} width {width} {grid} tokens has no MHA run: not in the margin plot")
            continue
        for row in members:
            if _is_compared(row, baseline):
                seeds = [acc - _mean(baseline["acc1"]) for acc in row["acc1"]]
                bars.append((f"{family}\nw{width} {grid}\n{epochs} ep", row["label"], _mean(seeds), seeds,
                             goals.get(family)))
    if not bars:
        print("no MHA/SSoG pair has finished: no margin plot")
        return
    settings = sorted({label for _, label, *_ in bars})
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(bars) + 1), 4))
    x_labels = list(dict.fromkeys(x for x, *_ in bars))
    width = 0.8 / len(settings)
    for x_label, label, margin, seeds, goal in bars:
        x = x_labels.index(x_label) + (settings.index(label) - (len(settings) - 1) / 2) * width
        colour = f"C{settings.index(label)}"
        ax.bar(x, margin, width * 0.9, color=colour, alpha=0.7)
        ax.plot([x] * len(seeds), seeds, "o", color="black", markersize=3)
        ax.annotate(f"{margin:+.2f}", (x, margin), textcoords="offset points", xytext=(0, 3 if margin >= 0 else -11),
                    ha="center", fontsize=8)
        if goal is not None:
            ax.hlines(goal, x - width / 2, x + width / 2, colors="red", linestyles=":")
    handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{i}", alpha=0.7, label=label) for i, label in enumerate(settings)]
    if goals:
        handles.append(plt.Line2D([], [], color="red", linestyle=":", label="goal"))
    ax.legend(handles=handles, fontsize=7)
    ax.set_xticks(range(len(x_labels)), x_labels, fontsize=8)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(ylabel="SSoG - MHA, validation Acc@1 (points)", title=title or "margin over MHA")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _goals(text: str) -> dict[str, float]:
    """``vit=2,loopvit=5`` -> {"vit": 2.0, "loopvit": 5.0}."""
    try:
        return {family: float(points) for family, points in (item.split("=") for item in text.split(",") if item)}
    except ValueError:
        raise SystemExit(f"--goals {text!r}: expected FAMILY=POINTS[,FAMILY=POINTS...], e.g. vit=2,loopvit=5") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of `ssog train`")
    parser.add_argument("--plot", type=Path, help="also plot validation Acc@1 and losses per epoch here")
    parser.add_argument("--title", default="", help="title of the plots")
    parser.add_argument("--grad-plot", type=Path,
                        help="also plot each parameter group's mean gradient norm per epoch here")
    parser.add_argument("--margin-plot", type=Path,
                        help="also plot each MHA/SSoG pair's Acc@1 and margin against the training length here")
    parser.add_argument("--paper-table", action="store_true",
                        help="print the paper's layout: MHA against SSoG per family, width and token grid")
    parser.add_argument("--seed-intervals", action="store_true",
                        help="also print each margin's 95%% interval over seeds (two or more seeds a side; scipy)")
    parser.add_argument("--setting-margin-plot", type=Path,
                        help="also plot SSoG's margin over MHA per family, width and token grid here (bars, seeds "
                             "as dots)")
    parser.add_argument("--goals", type=_goals, default={},
                        help="targets drawn on the setting margin plot, FAMILY=POINTS,..., e.g. vit=2,loopvit=5")
    args = parser.parse_args()
    if args.paper_table:
        print("\n".join(paper_table(args.runs)))
    else:
        print("| run | params | epochs | Acc@1 | Acc@3 | Acc@5 | val loss | train loss | best Acc@1 | train min |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for run in args.runs:
            print(row(run))
    if args.seed_intervals:
        print("\n" + "\n".join(seed_intervals(args.runs)))
    if args.setting_margin_plot:
        setting_margin_plot(args.runs, args.setting_margin_plot, args.title, args.goals)
    if args.plot:
        plot(args.runs, args.plot, args.title)
    if args.grad_plot:
        grad_plot(args.runs, args.grad_plot, args.title)
    if args.margin_plot:
        margin_plot(args.runs, args.margin_plot, args.title)


if __name__ == "__main__":
    main()
