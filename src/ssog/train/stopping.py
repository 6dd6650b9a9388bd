"""How a run stops: the three ways it ends early (its exceptions and their one-line messages)
and the stop signals (SIGINT, SIGTERM, SIGUSR1: :data:`~ssog.runtime.STOP_SIGNALS`) turned
into a stop at the next step boundary (docs/training.md, "When a run stops")."""
from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ssog.runtime import STOP_SIGNALS

__all__ = [
    "REPEAT_WINDOW_S", "StopRequest", "TrainingDiverged", "TrainingInterrupted", "TrainingOutOfMemory",
    "diverged_message", "interrupted_message", "resumable_message", "signals_stop_at_step_boundary",
]

class TrainingDiverged(FloatingPointError):
    """The loss or the weights became non-finite; ``last.safetensors`` keeps the last finite state."""


class TrainingOutOfMemory(MemoryError):
    """The device ran out of memory; ``last.safetensors`` keeps the last completed checkpoint."""


class TrainingInterrupted(Exception):
    """A stop signal stopped the run at a step boundary; ``signum`` is the signal (the command
    line exits with ``128 + signum``: 130 for SIGINT, 143 for SIGTERM, 138 for SIGUSR1)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


#: Seconds after the first stop signal in which another one is the same request: schedulers and
#: shells signal every process of a job, and torchrun forwards what it got to its processes,
#: so one stop can reach a process twice.
REPEAT_WINDOW_S = 2.0


class StopRequest:
    """The signal that asked the run to stop at the next step boundary (``signum``, None until
    one came) and when it came (``time.monotonic()``)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.time = 0.0


@contextmanager
def signals_stop_at_step_boundary(request: StopRequest) -> Iterator[None]:
    """In the block, the :data:`~ssog.runtime.STOP_SIGNALS` set ``request.signum`` (the first
    one's). A SIGINT more than :data:`REPEAT_WINDOW_S` after the first signal stops at once
    (KeyboardInterrupt: Ctrl-C pressed again); any other repeat is the same request. Off the
    main thread, where handlers cannot be installed, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if request.signum is None:
            request.signum, request.time = signum, time.monotonic()
        elif signum == signal.SIGINT and time.monotonic() - request.time > REPEAT_WINDOW_S:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def resumable_message(output: Path, saved_at: tuple[int, int] | None) -> str:
    """Where a failed run can be resumed from (its checkpoint saved at ``saved_at``)."""
    if saved_at is None:
        return "no checkpoint had been saved yet"
    epoch, step = saved_at
    return (f"the last checkpoint {output / 'last.safetensors'} (epoch {epoch}, step {step}) is kept; "
            f"resume it with ssog train --resume {output}")


def diverged_message(what: str, output: Path, saved_at: tuple[int, int] | None, epoch: int, step: int,
                     lr: float, clip_grad: float | None) -> str:
    """The message of :class:`TrainingDiverged`: ``what`` became non-finite at 1-based ``epoch``
    and ``step`` with learning rate ``lr``; what is kept and what to try (a lower ``lr``, ``clip_grad``)."""
    if epoch == 1 and step == 1:  # before any update: the learning rate played no part
        return (f"the first forward pass is not finite: {what}, before any update, so the model (its "
                "model_kwargs: kernel centres or widths far outside the token grid, say) or the data "
                "(images that normalise to inf or NaN) give non-finite values, not the learning rate")
    if saved_at is None:
        kept = "no checkpoint had been saved yet"
        hint = "lower lr" + ("" if clip_grad else " or set clip_grad")
    else:
        kept = (f"the last finite checkpoint {output / 'last.safetensors'} (epoch {saved_at[0]}, step {saved_at[1]}) "
                "is kept")
        hint = (f"resume it with a lower learning rate: ssog train --resume {output} --lr {lr / 10:g}"
                + ("" if clip_grad else " (or start again with clip_grad set)"))
    return f"training diverged at epoch {epoch} step {step}: {what} (lr {lr:g}); {kept}; {hint}"


def interrupted_message(output: Path, saved_at: tuple[int, int] | None, position: tuple[int, int]) -> str:
    """The message of :class:`TrainingInterrupted` at ``position`` ``(epoch, step)``, the last
    checkpoint being at ``saved_at``."""
    epoch, step = position
    kept = "" if saved_at in (None, position) else \
        f" (its last checkpoint, kept, is at epoch {saved_at[0]} step {saved_at[1]})"
    resume = f"resume with ssog train --resume {output}" if saved_at else "no checkpoint was saved"
    return f"interrupted at epoch {epoch} step {step}{kept}; {resume}"
