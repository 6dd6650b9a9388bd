"""Measuring work on a device: its wall time, its peak memory, and durations as a person reads
them. Shared by the benchmarks (:mod:`ssog.bench`) and ``ssog train --dry-run``
(:mod:`ssog.train.dry_run`), which report the same quantities.

Time: :func:`timed` is the wall time of one call with the device's queued work included
(:func:`synchronize` before and after). :func:`format_duration` writes seconds as ``"42 s"``,
``"7.5 min"``, ``"2.1 h"``, ``"1.5 days"``.

Peak memory: :func:`peak_memory` is, on both devices, the bytes of the tensors that are
already resident when the call starts and that the caller names (model parameters and
buffers, optimizer state, inputs), plus the highest number of bytes the call itself had
allocated at any moment.

- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus what
  was allocated when the call started (the caching allocator's *allocated* bytes, not its
  reserved pool).
- CPU: the CPU allocator reports every allocation and free made while ``torch.profiler``
  runs with ``profile_memory=True``; the peak is the running sum of those sizes in time
  order. This counts what the allocator handed out, including buffers that operators
  allocate internally, and nothing else: not the process's resident size, not memory that
  the Python interpreter or libraries allocate outside PyTorch's allocator.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

__all__ = ["format_duration", "peak_memory", "synchronize", "tensor_bytes", "timed"]


def synchronize(device: torch.device) -> None:
    """Wait for all work queued on ``device`` (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds ``fn()`` takes on ``device``, the work it queued there included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def format_duration(seconds: float) -> str:
    """``seconds`` for a person: ``"42 s"``, ``"7.5 min"``, ``"2.1 h"``, ``"1.5 days"``."""
    for unit, size in (("days", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and tied weights count once)."""
    seen: dict[tuple[torch.device, int], int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[(tensor.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def peak_memory(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    resident: Iterable[torch.Tensor] = (),
) -> int:
    """Peak bytes while ``fn()`` runs: ``resident`` tensors plus the call's own peak allocation.

    ``fn``'s result is dropped before the measurement ends, so only memory it holds while
    running counts. Call it after a warmup so that one-time allocations (lazy
    initialisation, cuDNN/oneDNN workspaces) do not inflate the peak. ``fn`` must not free
    tensors that existed before it started (on CPU such frees are not seen).
    """
    device = torch.device(device)
    base = tensor_bytes(resident)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        allocated = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return base + torch.cuda.max_memory_allocated(device) - allocated
    if device.type != "cpu":
        raise ValueError(f"peak_memory supports 'cpu' and 'cuda' devices, got {str(device)!r}")
    return base + _cpu_peak_allocated(fn)


def _cpu_peak_allocated(fn: Callable[[], Any]) -> int:
    # Kineto logs a spurious "gpuGetDeviceCount failed" error on machines without a GPU.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_silenced():
        prof.start()
    try:
        fn()
    finally:
        with _native_stderr_silenced():
            prof.stop()
    # One "[memory]" event per allocation (positive size) or free (negative) of a block
    # allocated while profiling; the allocator does not report frees of older blocks.
    assert prof.profiler is not None and prof.profiler.kineto_results is not None  # stop() has set them
    events = sorted(
        (
            (event.start_ns(), event.nbytes())  # type: ignore[attr-defined]  # not in torch's stub of _KinetoEvent
            for event in prof.profiler.kineto_results.events()
            if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU
        ),
        key=lambda event: event[0],
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Discard what native code writes to file descriptor 2 inside the block. Some torch
    builds' Kineto writes a ``USDT: ... profiler_start`` / ``profiler_stop`` line there at
    every start and stop, whatever ``KINETO_LOG_LEVEL`` says: two lines per measurement in
    every benchmark's output. Only the profiler's start and stop run inside, never ``fn``."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)

