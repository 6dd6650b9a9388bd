"""Training state for exact resume: the run's progress and every process's RNG streams.

A run's ``last.safetensors`` holds, besides weights and optimizer, its :class:`Progress`
(saved under ``"progress"``) and the python/numpy/torch(/CUDA) RNG state of every rank
(``"rng"``, one entry per rank), so a resumed run draws the same mixup and drop-path
numbers as an uninterrupted one.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ssog.data.streams import StreamLoader
from ssog.train.distributed import DistContext
from ssog.train.metrics import GradNormMeter

__all__ = [
    "RESUME_CHANGES", "RESUME_SETTINGS", "Progress", "gather_rng_states", "rng_state", "seed_all", "set_rng_state",
]

#: Settings ``--resume`` may change without changing the run's results.
RESUME_SETTINGS = ("progress", "threads", "device", "num_workers")
#: Settings ``--resume`` may change that change the results: the resumed run is then no
#: longer bit-identical to an uninterrupted one (the learning-rate schedule is rebuilt).
RESUME_CHANGES = ("lr", "epochs")


def seed_all(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch (and, where present, CUDA) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_rng_states(ctx: DistContext) -> list[dict[str, Any]]:
    """:func:`rng_state` of every process, by rank (a collective: every process calls it)."""
    states: list[Any] = [rng_state()]
    if ctx.distributed:
        states = [None] * ctx.world_size
        dist.all_gather_object(states, rng_state())
    return states


def _gather_stream_state(stream: StreamLoader, ctx: DistContext) -> dict[str, Any]:
    """Every reader's shard position in the epoch (each process knows its own readers)."""
    parts: list[Any] = [stream.state_dict()]
    if ctx.distributed:
        parts = [None] * ctx.world_size
        dist.all_gather_object(parts, stream.state_dict())
    return {"readers": parts[0]["readers"],
            "finished": {reader: done for part in parts for reader, done in part["finished"].items()}}


@dataclass
class Progress:
    """Where a run is: epochs completed, optimizer steps taken (in the epoch in progress and in
    all), and the partial epoch's training loss sums (this process's), training time (seconds)
    and gradient norms; with an iterable source, the ``stream``'s shard positions.

    Saved as the checkpoint's ``"progress"`` dict: the counters by name, ``grad_norm`` (the
    meter's state) and, for a stream, ``stream``.
    """

    grad_norms: GradNormMeter
    stream: StreamLoader | None = None
    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    epoch_time: float = 0.0
    #: CPU seconds of the epoch in progress (:func:`ssog.runtime.cpu_seconds`): in all, and in
    #: optimizer steps (forward, backward, update); the rest is loading, augmentation and logging
    cpu_time: float = 0.0
    step_cpu_time: float = 0.0

    #: The fields saved as they are (the meter and the stream save their own state).
    COUNTERS = ("epoch", "step_in_epoch", "global_step", "loss_sum", "loss_count", "epoch_time")
    #: Saved counters that older checkpoints lack (restored as 0).
    NEWER_COUNTERS = ("cpu_time", "step_cpu_time")

    def position(self) -> tuple[int, int]:
        """``(epoch, step)``: the epoch in progress (or just completed, 1-based) and the
        optimizer steps taken."""
        return self.epoch + (1 if self.step_in_epoch else 0), self.global_step

    def end_epoch(self) -> None:
        """Count the epoch as completed and clear the partial epoch's sums."""
        self.epoch += 1
        self.step_in_epoch, self.loss_sum, self.loss_count, self.epoch_time = 0, 0.0, 0, 0.0
        self.cpu_time = self.step_cpu_time = 0.0
        self.grad_norms.reset()

    def state_dict(self, ctx: DistContext) -> dict[str, Any]:
        """The checkpoint's ``"progress"`` (a collective with a stream: every process calls it)."""
        state: dict[str, Any] = {name: getattr(self, name) for name in self.COUNTERS + self.NEWER_COUNTERS}
        state["grad_norm"] = self.grad_norms.state_dict()
        if self.stream is not None:
            state["stream"] = _gather_stream_state(self.stream, ctx)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore a checkpoint's ``"progress"``; returns False when a stream cannot continue
        inside the epoch in progress (it then reads the epoch's stream from its start)."""
        for name in self.COUNTERS:
            setattr(self, name, state[name])
        for name in self.NEWER_COUNTERS:
            setattr(self, name, state.get(name, 0.0))
        self.grad_norms.load_state_dict(state.get("grad_norm", {}))  # absent in older checkpoints
        if self.stream is None or not self.step_in_epoch:
            return True
        return self.stream.load_state_dict(state.get("stream") or {})

