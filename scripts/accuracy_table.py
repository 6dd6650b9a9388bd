"""Markdown table (and a curve plot) of finished `ssog train` runs, for docs/results/accuracy.md.

    python scripts/accuracy_table.py RUN_DIR [RUN_DIR ...] [--plot curves.png] [--title TEXT]

One row per run folder, named by the folder: parameters, the last epoch's validation
Acc@1/3/5 and loss, its final train loss, the best Acc@1 and its epoch, and the training
time (sum of the epochs' seconds). Reads only what `ssog train` writes: `log.jsonl`,
`summary.json` and `config.yaml`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


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
        style = "--" if run.name.startswith("mha") else "-"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of `ssog train`")
    parser.add_argument("--plot", type=Path, help="also plot validation Acc@1 and losses per epoch here")
    parser.add_argument("--title", default="", help="title of the plot")
    args = parser.parse_args()
    print("| run | params | epochs | Acc@1 | Acc@3 | Acc@5 | val loss | train loss | best Acc@1 | train min |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        print(row(run))
    if args.plot:
        plot(args.runs, args.plot, args.title)


if __name__ == "__main__":
    main()
