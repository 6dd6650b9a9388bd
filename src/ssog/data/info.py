"""What a data source is (:class:`DatasetInfo`, each built-in source's statistics) and how a
dataset is split: seeded, stratified validation splits and training subsets.

Every source of :mod:`ssog.data.factory` returns a train and a validation dataset of ``(PIL
image, class index)`` pairs, untransformed (transforms are applied by
:class:`ssog.data.loader.TransformedDataset` so that a train and a validation split can share
one underlying dataset), plus a :class:`DatasetInfo` describing them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import Dataset, Subset

from ssog.image_statistics import CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD

__all__ = [
    "DATASETS", "SOURCE_STATISTICS", "DATA_EXTRA", "DatasetInfo", "check_dataset_name", "timm_source_info",
    "shown_names", "stratified_split", "split_dataset", "dataset_targets", "training_subset",
]

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")
#: What a data source's name may hold (``cifar10``, ``hfds/user/name``, ``torch/image_folder``):
#: it is written into logs, summaries and model cards, and read back from them.
_DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]*")


def check_dataset_name(name: object, where: str = "dataset") -> str:
    """``name`` if it is a data source's name (letters, digits and ``_ . : / @ + -``), else a
    ValueError naming ``where`` it was given."""
    if not isinstance(name, str) or not _DATASET_NAME.fullmatch(name):
        raise ValueError(f"{where} must be a data source's name (letters, digits and _ . : / @ + -, e.g. cifar10 or "
                         f"hfds/user/name), got {name!r}")
    return name

#: Each built-in source's own ``(native side in pixels, mean, std, evaluation crop_pct)``: what
#: :class:`DatasetInfo` reports, and the data config a run used before runs stored theirs
#: (:func:`ssog.train.config.upgrade_checkpoint_config`). Synthetic images are made at the run's
#: ``img_size`` (32 when unset).
SOURCE_STATISTICS: dict[str, tuple[int, tuple[float, ...], tuple[float, ...], float]] = {
    "digits": (8, (0.5,), (0.5,), 1.0),
    "cifar10": (32, CIFAR10_MEAN, CIFAR10_STD, 1.0),
    "cifar100": (32, CIFAR100_MEAN, CIFAR100_STD, 1.0),
    "imagefolder": (224, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, 0.875),
    "synthetic": (32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), 1.0),
}

#: How to install what timm's sources need (webdataset, datasets), for their errors.
DATA_EXTRA = "pip install 'ssog[data]'"


@dataclass(frozen=True)
class DatasetInfo:
    """What a model and its transforms need to know about a data source.

    ``native_size`` is the side of the stored images in pixels, ``crop_pct`` the evaluation
    centre-crop fraction, ``hflip`` whether horizontal flips preserve the class.
    """

    name: str
    num_classes: int
    in_chans: int
    native_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float = 1.0
    hflip: bool = True
    classes: tuple[str, ...] = field(default=(), repr=False)


def timm_source_info(name: str, classes: Sequence[str], in_chans: int, native_size: int) -> DatasetInfo:
    """The :class:`DatasetInfo` of a timm data source (``native_size`` in pixels, 0 when unknown)."""
    # mean/std/crop_pct here only describe the source; a run takes them from its data config.
    return DatasetInfo(name, len(classes), in_chans, native_size, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD,
                       crop_pct=1.0, classes=tuple(classes))


def shown_names(names: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names``, and how many there are in all when that is more."""
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def stratified_split(
    targets: Sequence[int] | np.ndarray, val_split: float | int, seed: int, class_names: Sequence[str] | None = None
) -> tuple[list[int], list[int]]:
    """Seeded stratified split of ``range(len(targets))`` into (train, val) index lists.

    ``val_split`` is a fraction in (0, 1) or a number of validation samples; ``class_names``
    (by class index) name the classes an error is about.
    """
    n = len(targets)
    valid = (isinstance(val_split, float) and 0.0 < val_split < 1.0) or (
        isinstance(val_split, int) and not isinstance(val_split, bool) and 0 < val_split < n
    )
    if not valid:
        raise ValueError(
            f"val_split (--val-split) must be a fraction in (0, 1) or a sample count in [1, {n - 1}], "
            f"got {val_split!r}"
        )
    counts = np.bincount(np.asarray(targets))
    classes = int((counts > 0).sum())
    single = [int(label) for label in np.flatnonzero(counts == 1)]
    if single:
        names = [str(class_names[label]) if class_names is not None and label < len(class_names) else
                 f"class {label}" for label in single]
        raise ValueError(f"val_split (--val-split): a stratified split needs at least 2 images of every class, and "
                         f"{len(single)} of the {classes} classes have only 1: {shown_names(names)}")
    # scikit-learn's sizes: ceil(fraction * n) held out; each side needs one image per class.
    held_out = math.ceil(val_split * n) if isinstance(val_split, float) else val_split
    if not classes <= held_out <= n - classes:
        raise ValueError(
            f"val_split {val_split!r} (--val-split) holds out {held_out} of {n} images, and a stratified split of "
            f"{classes} classes needs at least {classes} on each side: give a count in [{classes}, {n - classes}] "
            f"or a fraction in [{math.ceil(1e4 * classes / n) / 1e4:g}, {math.floor(1e4 * (n - classes) / n) / 1e4:g}]"
        )
    return _stratified_indices(targets, val_split, seed)


def _stratified_indices(
    targets: Sequence[int] | np.ndarray, test_size: float | int, seed: int
) -> tuple[list[int], list[int]]:
    """The seeded stratified split of ``range(len(targets))`` as sorted (kept, held out) index
    lists; ``test_size`` is a fraction or a count, already checked.

    The split is scikit-learn's ``train_test_split(..., stratify=targets, random_state=seed)``
    (its ``StratifiedShuffleSplit``), drawn from the same ``numpy.random.RandomState`` stream in
    the same order, so runs split as they did when scikit-learn drew them (tests/data/test_data.py
    checks them against scikit-learn).
    """
    n = len(targets)
    held_out = math.ceil(test_size * n) if isinstance(test_size, float) else int(test_size)
    classes, class_of, class_counts = np.unique(np.asarray(targets), return_inverse=True, return_counts=True)
    members = np.split(np.argsort(class_of, kind="stable"), np.cumsum(class_counts)[:-1])
    rng = np.random.RandomState(seed)
    kept_per_class = _approximate_mode(class_counts, n - held_out, rng)
    held_per_class = _approximate_mode(class_counts - kept_per_class, held_out, rng)
    kept: list[int] = []
    held: list[int] = []
    for index in range(len(classes)):
        shuffled = members[index].take(rng.permutation(class_counts[index]), mode="clip")
        kept.extend(shuffled[:kept_per_class[index]].tolist())
        held.extend(shuffled[kept_per_class[index]:kept_per_class[index] + held_per_class[index]].tolist())
    return sorted(kept), sorted(held)


def _approximate_mode(class_counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """How many of ``draws`` samples each class gives: its share rounded down, the rest to the
    classes with the largest remainders, ties broken by ``rng`` (scikit-learn's
    ``_approximate_mode``)."""
    continuous = class_counts / class_counts.sum() * draws
    floored = np.floor(continuous)
    need_to_add = int(draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (tied,) = np.where(remainder == value)
            add_now = min(len(tied), need_to_add)
            floored[rng.choice(tied, size=add_now, replace=False)] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    return floored.astype(int)


def split_dataset(dataset: Dataset, targets: Sequence[int], val_split: float | int,
                  seed: int) -> tuple[Subset, Subset]:
    """``dataset`` as (train, val) subsets by :func:`stratified_split` of its ``targets``
    (an error names the classes by the dataset's ``classes`` where it has them)."""
    train_idx, val_idx = stratified_split(targets, val_split, seed, getattr(dataset, "classes", None))
    return Subset(dataset, train_idx), Subset(dataset, val_idx)


def dataset_targets(dataset: Dataset) -> list[int]:
    """Class index of every sample of ``dataset`` (a source with ``targets``, or a ``Subset``
    of one), read without loading any image."""
    if isinstance(dataset, Subset):
        targets = dataset_targets(dataset.dataset)
        return [targets[i] for i in dataset.indices]
    source: Any = dataset  # torchvision's, timm's and ssog's sources list targets; Dataset does not declare it
    return list(source.targets)


def training_subset(dataset: Dataset, size: int, seed: int) -> Dataset:
    """A seeded subset of ``size`` samples of ``dataset`` with its class proportions.

    The small-data regime of docs/results/accuracy.md: the validation split is untouched, and
    the same ``(size, seed)`` always picks the same images. ``size`` must leave every class at
    least one sample and be below the dataset's size.
    """
    targets = dataset_targets(dataset)
    classes = len(set(targets))
    if isinstance(size, bool) or not isinstance(size, int) or not classes <= size < len(targets):
        raise ValueError(
            f"train_subset must be a sample count in [{classes}, {len(targets) - 1}] (at least one "
            f"image per class, fewer than the {len(targets)} training images), got {size!r}"
        )
    keep, _ = _stratified_indices(targets, len(targets) - size, seed)
    return Subset(dataset, keep)
