"""Loaders whose randomness survives a restart: per-sample seeded augmentation and resumable samplers.

Augmentation randomness is a function of ``(seed, epoch, sample index)`` only, not of which
worker process or rank loads the sample or of what was loaded before. So a run resumed in
the middle of an epoch sees exactly the images an uninterrupted run would, whatever
``num_workers``, and a run on N processes sees the same images as a run on one.
"""
from __future__ import annotations

import os
import random
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler
from torch.utils.data.dataloader import _BaseDataLoaderIter

from ssog.runtime import STOP_SIGNALS

__all__ = [
    "TransformedDataset", "EpochSampler", "ShardSampler", "StopSafeDataLoader", "build_loader",
    "leave_stop_signals_to_parent", "sample_seed", "seeded_rngs",
]


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed that depends only on ``(seed, epoch, index)``."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(2, np.uint64)[0] >> np.uint64(1))


@contextmanager
def seeded_rngs(seed: int):
    """Seed python, numpy and torch (CPU) for the block, then restore their previous states."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.default_generator.manual_seed(seed)  # the CPU's alone: torch.manual_seed seeds CUDA's too, far slower
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


class TransformedDataset(Dataset):
    """Applies ``transform`` to the images of ``base``.

    Indexed by ``index`` or by ``(epoch, index)`` (what :class:`EpochSampler` yields). With a
    ``seed`` the transform runs under RNGs seeded by :func:`sample_seed`; without one it must
    be deterministic (evaluation).
    """

    def __init__(self, base: Dataset, transform: Callable, seed: int | None = None):
        self.base = base
        self.transform = transform
        self.seed = seed

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]  # torch's Dataset declares no __len__

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        image, target = self.base[index]
        if self.seed is None:
            return self.transform(image), target
        with seeded_rngs(sample_seed(self.seed, epoch, index)):
            return self.transform(image), target


class EpochSampler(DistributedSampler):
    """torch's :class:`DistributedSampler` (seeded shuffle, ``drop_last``) that yields
    ``(epoch, index)`` and can start part-way through an epoch.

    Every rank takes ``perm[rank::world]`` of the same permutation, so with a per-rank batch
    of ``B / world`` the union of the ranks' k-th batches is the k-th batch of a
    single-process run with batch ``B``.
    """

    def __init__(self, dataset: Dataset, num_replicas: int = 1, rank: int = 0, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch's permutation and skip this rank's first ``start`` samples."""
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices = list(super().__iter__())[self.start:]
        return iter([(self.epoch, index) for index in indices])

    def __len__(self) -> int:
        return self.num_samples - self.start


class ShardSampler(Sampler):
    """Sequential, unpadded shard ``rank::world`` of a dataset, for evaluation
    (metrics are summed over ranks, so no sample may be counted twice)."""

    def __init__(self, dataset: Dataset, num_replicas: int = 1, rank: int = 0):
        self.indices = list(range(rank, len(dataset), num_replicas))  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def leave_stop_signals_to_parent(worker_id: int = 0) -> None:
    """A data-loader worker's ``worker_init_fn``: the :data:`~ssog.runtime.STOP_SIGNALS` that
    reach the worker from anyone but its parent (a scheduler or a shell signalling the whole
    job or process group, in any order) are left to the parent, which stops at a step boundary
    and ends its workers itself; a signal from the parent (the loader's shutdown) still acts as
    it would. Without this, a worker killed a moment before its parent heard the signal made the
    parent's loader raise ("DataLoader worker ... is killed by signal") wherever the parent
    was, even in the stop's checkpoint.

    The signals are blocked in the worker (from its birth under :class:`StopSafeDataLoader`) and
    a thread takes them with ``sigwaitinfo``, which names the sender.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    # A forked worker inherits the run's stop handlers: the default actions come back (torch's
    # own SIGTERM handler for its workers stays), for the parent's signal to act as on any worker.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    threading.Thread(target=_take_stop_signals, args=(os.getppid(),), name="ssog-stop-signals", daemon=True).start()


#: How often (seconds) a worker looks whether its parent still lives.
PARENT_CHECK_S = 1.0


def _take_stop_signals(parent: int) -> None:
    """Wait for :data:`~ssog.runtime.STOP_SIGNALS` (blocked in every other thread of the
    worker). The parent's SIGTERM (a loader's or multiprocessing's shutdown) ends the worker
    quietly, as torch's own handler for its workers does; another signal of the parent is
    raised again in this thread, unblocked, to act as it would.

    A parent that ended without shutting its loader down (killed outright, or by a signal
    before its run installed its stop handlers) ends the worker too: torch's worker would
    otherwise wait forever, at its exit, to flush results (numpy arrays go through the pipe,
    not shared memory) into a pipe nobody reads, and it leaves other senders' stop signals to
    its parent."""
    while True:
        info = signal.sigtimedwait(STOP_SIGNALS, PARENT_CHECK_S)
        if info is None:
            if os.getppid() != parent:
                os._exit(0)
            continue
        if info.si_pid == parent:
            if info.si_signo == signal.SIGTERM:
                os._exit(0)  # a worker killed by a signal would make the parent's loader complain
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [info.si_signo])
            signal.pthread_kill(threading.get_ident(), info.si_signo)
            return


class StopSafeDataLoader(DataLoader):
    """torch's DataLoader whose worker processes leave stop signals to this process
    (:func:`leave_stop_signals_to_parent`, its ``worker_init_fn``). The signals are blocked in
    this thread while the workers start, so that a worker has them blocked from its birth: a
    signal to the whole job as workers start is not lost, nor the end of a worker."""

    def __init__(self, dataset: Dataset, **kwargs: Any):
        super().__init__(dataset, worker_init_fn=leave_stop_signals_to_parent, **kwargs)

    def __iter__(self) -> _BaseDataLoaderIter:
        if self.num_workers == 0 or threading.current_thread() is not threading.main_thread():
            return super().__iter__()
        before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return super().__iter__()
        finally:  # a signal that came meanwhile reaches this process's handler now
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def build_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    train: bool,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int = 0,
    pin_memory: bool = False,
) -> DataLoader:
    """A loader of ``batch_size`` samples per process.

    Training loaders shuffle with :class:`EpochSampler` and drop the last partial batch;
    call ``loader.sampler.set_epoch(epoch, start)`` before each epoch. The workers leave stop
    signals to this process (:class:`StopSafeDataLoader`).
    """
    sampler = EpochSampler(dataset, world_size, rank, seed) if train else ShardSampler(dataset, world_size, rank)
    return StopSafeDataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=train,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        # Its own generator, so creating an iterator (which draws worker seeds) never
        # advances the global torch RNG that dropout and drop-path use.
        generator=torch.Generator().manual_seed(seed),
    )
