"""The one entry to the data sources: :func:`build_datasets` picks a source by name (timm's
``create_dataset`` does the same for timm's) and is the only module that imports them all.
"""
from __future__ import annotations

from typing import Any, Mapping

from torch.utils.data import Dataset

from ssog.data.builtin import cifar_datasets, digits_datasets, synthetic_datasets
from ssog.data.folder import imagefolder_datasets
from ssog.data.info import DATASETS, DatasetInfo
from ssog.data.streams import stream_datasets
from ssog.data.timm_map import timm_map_datasets

__all__ = ["TIMM_PREFIXES", "ITERABLE_PREFIXES", "DEFAULT_VAL_SPLIT", "is_timm_source", "timm_datasets",
           "build_datasets"]

TIMM_PREFIXES = ("hfds/", "hfids/", "wds/", "tfds/", "torch/")
ITERABLE_PREFIXES = ("hfids/", "wds/", "tfds/")
#: The validation split's name when ``val_split`` is unset (timm's train.py default).
DEFAULT_VAL_SPLIT = "validation"


def is_timm_source(name: str) -> bool:
    """Whether ``name`` is a ``timm.data.create_dataset`` name with a source prefix."""
    return name.lower().startswith(TIMM_PREFIXES)


def timm_datasets(
    name: str,
    root: str | None,
    *,
    train_split: str = "train",
    val_split: str | float | int | None = None,
    split_seed: int = 0,
    download: bool = False,
    seed: int = 0,
    num_classes: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[Dataset, Dataset, DatasetInfo]:
    """The ``(train, val, info)`` of a ``timm.data.create_dataset`` name.

    ``val_split``: the validation split's name (default ``validation``), or for a map-style
    source a fraction / count split off the training split (stratified, seeded by
    ``split_seed``). ``options`` (``dataset_kwargs``) go to ``create_dataset`` for map-style
    sources (``class_map``, ``input_key``, ``target_key``, ...); the iterable readers take
    ``input_key``, ``target_key``, ``shuffle_size`` and ``num_samples``. ``num_classes`` sets
    the class count where the source does not say it (WebDataset without ``classes`` in its
    ``_info.json``).
    """
    options = dict(options or {})
    prefix = name.partition("/")[0].lower() + "/"
    named_val = val_split if isinstance(val_split, str) else DEFAULT_VAL_SPLIT if val_split is None else None
    if prefix in ITERABLE_PREFIXES:
        if named_val is None:
            raise ValueError(f"dataset {name} is read as a stream: val_split must name its validation split "
                             f"(e.g. {DEFAULT_VAL_SPLIT}), not a fraction or count to split off")
        return stream_datasets(name, root, train_split=train_split, val_split=named_val, download=download,
                               seed=seed, options=options, num_classes=num_classes)
    return timm_map_datasets(name, root, train_split=train_split,
                             val_split=DEFAULT_VAL_SPLIT if val_split is None else val_split, split_seed=split_seed,
                             download=download, options=options, num_classes=num_classes)


def build_datasets(
    name: str,
    data_dir: str | None = None,
    *,
    download: bool = False,
    val_split: float | int | str | None = None,
    split_seed: int = 0,
    synthetic_size: int = 256,
    synthetic_classes: int = 10,
    synthetic_img_size: int = 32,
    skip_bad_images: bool = False,
    train_split: str = "train",
    seed: int = 0,
    num_classes: int | None = None,
    dataset_kwargs: dict | None = None,
) -> tuple[Dataset, Dataset, DatasetInfo]:
    """The (train, val, info) of data source ``name``: one of :data:`~ssog.data.info.DATASETS`,
    or a ``timm.data.create_dataset`` name (``hfds/``, ``hfids/``, ``wds/``, ``tfds/``,
    ``torch/``: :func:`timm_datasets`, which also takes ``train_split``, ``seed``,
    ``num_classes`` and ``dataset_kwargs``, and a ``val_split`` that names a split).

    ``val_split`` (a fraction or a count) splits the validation set off the training set,
    stratified and seeded by ``split_seed``; ``None`` uses the source's own validation split
    (CIFAR's test set, ImageFolder's ``val`` or ``validation`` folder, 20% of the digits); for an
    ImageFolder a name picks the validation folder.

    ImageFolder files are checked before use (:func:`~ssog.data.images.unreadable_images`): an
    unreadable one is an error naming it, or with ``skip_bad_images`` a warning naming it, and
    it is left out.
    """
    if is_timm_source(name):
        return timm_datasets(name, data_dir, train_split=train_split, val_split=val_split, split_seed=split_seed,
                             download=download, seed=seed, num_classes=num_classes, options=dataset_kwargs)
    named_split = isinstance(val_split, str) and name != "imagefolder"
    timm_only: tuple[tuple[str, object, object], ...] = (
        ("val_split", named_split, False), ("train_split", train_split, "train"),
        ("dataset_kwargs", dataset_kwargs or {}, {}))
    for setting, value, default in timm_only:
        if value != default:
            raise ValueError(f"{setting} {'names a split' if setting == 'val_split' else 'is set'}, which only "
                             f"timm's sources (hfds/, hfids/, wds/, tfds/, torch/) take"
                             f"{' and imagefolder (its validation folder)' if setting == 'val_split' else ''}; "
                             f"dataset {name!r} does not")
    numeric_split = None if isinstance(val_split, str) else val_split  # a name reaches imagefolder only
    if name == "digits":
        return digits_datasets(numeric_split, split_seed)
    if name in ("cifar10", "cifar100"):
        return cifar_datasets(name, data_dir, download, numeric_split, split_seed)
    if name == "imagefolder":
        return imagefolder_datasets(data_dir, val_split, split_seed, skip_bad_images)
    if name == "synthetic":
        return synthetic_datasets(synthetic_size, synthetic_classes, synthetic_img_size, split_seed)
    raise ValueError(f"unknown dataset {name!r}; expected one of {list(DATASETS)} or a timm data source "
                     "(hfds/NAME, hfids/NAME, wds/NAME, tfds/NAME, torch/NAME)")
