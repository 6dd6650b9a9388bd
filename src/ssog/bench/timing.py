"""Timing of a callable: warmup, measured iterations and a robust summary.

Each measured iteration is timed on its own so that the summary can report a median and a
spread instead of a mean that one slow iteration (another process waking up, a page fault)
drags along. On CUDA an iteration is the time between two CUDA events recorded around the
call, i.e. the device time of the work it queued; on CPU it is ``time.perf_counter``.
"""
from __future__ import annotations

import itertools
import random
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from ssog.measure import synchronize, timed
from ssog.runtime import resolve_device

__all__ = ["TimingStats", "quartiles", "resolve_device", "synchronize", "time_callable", "time_interleaved"]


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), inclusive method; a lone value is all three."""
    if not values:
        raise ValueError("quartiles of an empty sequence")
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


@dataclass(frozen=True)
class TimingStats:
    """Durations of the measured iterations, in seconds, in measurement order."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("TimingStats needs at least one sample")

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def q1(self) -> float:
        """First quartile (see :func:`quartiles`)."""
        return quartiles(self.samples)[0]

    @property
    def q3(self) -> float:
        return quartiles(self.samples)[2]

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def to_dict(self) -> dict[str, float | int]:
        """Summary in seconds: median, quartiles, extremes and the number of iterations."""
        return {
            "median_s": self.median,
            "q1_s": self.q1,
            "q3_s": self.q3,
            "min_s": self.min,
            "max_s": self.max,
            "iters": len(self.samples),
        }


def time_callable(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 10,
    iters: int = 50,
) -> TimingStats:
    """Call ``fn`` ``warmup`` times untimed, then ``iters`` times timed one by one.

    ``fn`` takes no arguments; its result is discarded. ``device`` selects the clock: CUDA
    events on a CUDA device, ``time.perf_counter`` otherwise.
    """
    return time_interleaved({"fn": fn}, device=device, warmup=warmup, iters=iters)["fn"]


def _round_orders(fns: Mapping[str, Callable[[], Any]], rounds: int) -> list[list[tuple[str, Callable[[], Any]]]]:
    """One order of ``fns``' items per round, the first the given one, each later one chosen
    so that every callable runs right after every other one about equally often, across
    round boundaries too: the order (of all of them, or of 720 seeded samples beyond six
    callables) whose transitions have run least so far. A call right after a large one pays
    for its evicted caches and freed memory; rotating one order keeps every predecessor the
    same, seeded shuffles leave the counts to chance, and a balanced Latin square balances
    only within rounds (docs/results/operator.md)."""
    items = list(fns.items())
    n = len(items)
    if n <= 6:
        candidates = list(itertools.permutations(range(n)))
    else:
        sampler = random.Random(0)
        candidates = [tuple(sampler.sample(range(n), n)) for _ in range(720)]
    orders = [tuple(range(n))]
    transitions = Counter(zip(orders[0], orders[0][1:]))
    for _ in range(rounds - 1):
        last = orders[-1][-1]
        order = min(
            (o for o in candidates if o[0] != last or n == 1),  # no callable twice in a row
            key=lambda o: sum(transitions[pair] for pair in zip((last, *o), o)),
        )
        transitions.update(zip((last, *order), order))
        orders.append(order)
    return [[items[i] for i in order] for order in orders]


def time_interleaved(
    fns: Mapping[str, Callable[[], Any]],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 10,
    iters: int = 50,
) -> dict[str, TimingStats]:
    """Time several callables round-robin: iteration ``i`` of each before iteration ``i+1`` of any.

    Each callable is first called ``warmup`` times untimed. Interleaving makes a ratio of
    two timings robust to a machine whose speed drifts during the measurement (other
    processes on a shared CPU, clock boost): a slow phase hits every callable alike. The
    order changes from round to round (:func:`_round_orders`), so that every callable runs
    right after every other one equally often: a call after a large one pays for its evicted
    caches and, on a CPU, for memory it freed that the allocator maps back page by page
    (docs/results/operator.md).
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    device = torch.device(device)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    if device.type == "cuda":
        events = {
            name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
            for name in fns
        }
        for i, order in enumerate(_round_orders(fns, iters)):
            for name, fn in order:
                start, end = events[name][i]
                start.record()
                fn()
                end.record()
        synchronize(device)
        return {
            name: TimingStats(tuple(start.elapsed_time(end) / 1e3 for start, end in pairs))
            for name, pairs in events.items()
        }
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for order in _round_orders(fns, iters):
        for name, fn in order:
            samples[name].append(timed(fn, device))
    return {name: TimingStats(tuple(values)) for name, values in samples.items()}
