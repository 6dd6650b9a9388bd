"""Loaders whose randomness survives a restart: per-sample seeded augmentation and resumable samplers.

Augmentation randomness is a function of ``(seed, epoch, sample index)`` only, not of which
worker process or rank loads the sample or of what was loaded before. So a run resumed in
the middle of an epoch sees exactly the images an uninterrupted run would, whatever
``num_workers``, and a run on N processes sees the same images as a run on one.
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

__all__ = ["TransformedDataset", "EpochSampler", "ShardSampler", "build_loader", "sample_seed", "seeded_rngs"]


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
        torch.default_generator.manual_seed(seed)  # torch.manual_seed also seeds CUDA: 100x slower
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
        return len(self.base)

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
        self.indices = list(range(rank, len(dataset), num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


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
    call ``loader.sampler.set_epoch(epoch, start)`` before each epoch.
    """
    sampler = EpochSampler(dataset, world_size, rank, seed) if train else ShardSampler(dataset, world_size, rank)
    return DataLoader(
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
