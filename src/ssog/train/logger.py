"""Run log: per-epoch JSONL and CSV files and a PNG of the curves; per-step and per-epoch
scalars to TensorBoard / W&B (x axis: optimizer steps)."""
from __future__ import annotations

import csv
import importlib
import io
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ssog.files import save_figure, write_atomic
from ssog.runtime import check_plotting

__all__ = ["RunLogger", "logging_backends", "plot_curves", "curves_figure", "wandb_run_id"]

PLOT_INTERVAL_S = 60.0


def flat_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with nested mappings spread into ``outer/inner`` keys (``grad_norm/mlp``), for
    the CSV columns and the TensorBoard / W&B scalars."""
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update({f"{key}/{inner}": v for inner, v in value.items()})
        else:
            flat[key] = value
    return flat


def plot_curves(history: list[dict[str, Any]], path: Path) -> None:
    """Loss (train, val) and validation Acc@1/3/5 per epoch, side by side."""
    save_figure(curves_figure(history), path, dpi=100)


#: Up to this many epochs the curves mark each epoch's point (one epoch is a point, not a line).
MARKED_EPOCHS = 50


def curves_figure(history: list[dict[str, Any]]) -> Any:
    """The ``matplotlib.figure.Figure`` of :func:`plot_curves`."""
    # A bare Figure, no pyplot: no display or backend is touched (ssog.runtime.check_plotting).
    from matplotlib.figure import Figure

    epochs = [r["epoch"] for r in history]
    marker = "o" if len(epochs) <= MARKED_EPOCHS else None
    fig = Figure(figsize=(10, 4))
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot(epochs, [r["train_loss"] for r in history], marker=marker, label="train")
    ax_loss.plot(epochs, [r["val_loss"] for r in history], marker=marker, label="val")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="Loss")
    for k in (1, 3, 5):
        ax_acc.plot(epochs, [r[f"acc{k}"] for r in history], marker=marker, label=f"Acc@{k}")
    if history and "ema_acc1" in history[0]:
        ax_acc.plot(epochs, [r["ema_acc1"] for r in history], "--", marker=marker, label="EMA Acc@1")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="Validation accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def logging_backends(tensorboard: bool, wandb_project: str | None) -> tuple[Any, Any]:
    """TensorBoard's ``SummaryWriter`` and the ``wandb`` module, each ``None`` unless asked for;
    a ValueError naming the package when one asked for is not installed."""
    summary_writer: Any = None
    wandb: Any = None
    if tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter as summary_writer
        except ImportError as error:
            raise ValueError("tensorboard logging needs the tensorboard package: "
                             "pip install 'ssog[logging]'") from error
    if wandb_project:
        try:
            wandb = importlib.import_module("wandb")
        except ImportError as error:
            raise ValueError("Weights & Biases logging needs the wandb package: "
                             "pip install 'ssog[logging]'") from error
    return summary_writer, wandb


#: Where a run keeps the id of its W&B run, so that only --resume continues that run.
WANDB_ID_FILE = Path("wandb") / "ssog-run-id"


def wandb_run_id(output: Path, resuming: bool) -> tuple[str, bool]:
    """``(id, resume)``: a resumed run's stored W&B id, else a new random one, stored in the run folder."""
    path = output / WANDB_ID_FILE
    if resuming and path.is_file():
        return path.read_text().strip(), True
    run_id = secrets.token_hex(8)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, run_id + "\n")
    return run_id, False


class RunLogger:
    """Writes ``log.jsonl``, ``log.csv`` and ``curves.png`` in ``output`` after every epoch, and
    sends per-step and per-epoch scalars to TensorBoard / W&B against the optimizer step.

    The files are rewritten from the whole history each time, so after a resume they hold
    exactly the epochs the checkpoint had completed, never duplicates; a run resumed at step
    ``resumed_at`` drops TensorBoard events after it (written past the checkpoint) and continues
    its W&B run, whose id the run folder keeps (a new run gets a new id).
    """

    def __init__(self, output: Path, config: dict[str, Any], tensorboard: bool = False,
                 wandb_project: str | None = None, resumed_at: int | None = None):
        self.output = output
        self.plotted = -float("inf")
        self.draw_curves = check_plotting()  # without matplotlib (the plot extra) the run has no curves.png
        self.tb = self.wandb = None
        summary_writer, wandb = logging_backends(tensorboard, wandb_project)
        if summary_writer is not None:
            purge = None if resumed_at is None else resumed_at + 1
            self.tb = summary_writer(str(output / "tensorboard"), purge_step=purge)
        if wandb is not None:
            run_id, resume = wandb_run_id(output, resumed_at is not None)
            self.wandb = wandb.init(project=wandb_project, config=config, dir=str(output), name=output.name,
                                    id=run_id, resume="must" if resume else None)

    def log_step(self, step: int, scalars: dict[str, float]) -> None:
        """Scalars of optimizer step ``step`` to TensorBoard / W&B."""
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def log_epoch(self, history: list[dict[str, Any]], final: bool = False) -> None:
        """Write the files for ``history`` (all epochs so far); send its last record to TB / W&B.

        The PNG, which costs more than a small model's epoch, is redrawn at most once a minute
        and after the ``final`` epoch.
        """
        write_atomic(self.output / "log.jsonl", "".join(json.dumps(r) + "\n" for r in history))
        rows = [flat_record(r) for r in history]
        buffer = io.StringIO()  # columns: every key of every row (a resumed older run's rows lack some)
        writer = csv.DictWriter(buffer, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(self.output / "log.csv", buffer.getvalue())
        if self.draw_curves and (final or time.monotonic() - self.plotted >= PLOT_INTERVAL_S):
            plot_curves(history, self.output / "curves.png")
            self.plotted = time.monotonic()
        record = rows[-1]
        self.log_step(record["step"], {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"})
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def progress_bar(enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr, drawn only when ``enabled`` and stderr is a terminal: in a file or
    pipe its carriage-return updates would flood the log (the run logs one line per epoch)."""
    return tqdm(disable=not (enabled and sys.stderr.isatty()), leave=False, dynamic_ncols=True, **kwargs)
