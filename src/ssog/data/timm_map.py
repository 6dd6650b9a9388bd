"""timm's map-style sources: ``hfds/`` (a Hugging Face dataset) and ``torch/`` (a torchvision
data set), read through ``timm.data.create_dataset``. They index like the built-in sources, so
they keep the exact-resume sampling of :mod:`ssog.data.loader`.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Mapping, Sequence

from PIL import Image
from torch.utils.data import Dataset

from ssog.data.info import DATA_EXTRA, DatasetInfo, split_dataset, timm_source_info
from ssog.data.samples import check_first_samples, checked_sample

__all__ = ["TimmMapDataset", "timm_map_datasets"]


class TimmMapDataset(Dataset):
    """A map-style dataset built by ``timm.data.create_dataset`` as ``(PIL RGB image, class
    index)`` pairs, each read by :func:`~ssog.data.samples.checked_sample` (upright, converted
    by mode, the label a class index in range), with ``classes`` and ``targets`` (read without
    decoding images where the source allows); ``source`` names it in a sample's errors."""

    def __init__(self, dataset: Dataset, classes: Sequence[str], source: str = "the dataset"):
        self.dataset, self.classes, self.source = dataset, tuple(classes), source

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        image, target = self.dataset[index][:2]  # decoded here, not in timm's reader (see _create_map)
        return checked_sample(image, target, channels=3, num_classes=len(self.classes) or None,
                              where=f"{self.source}, sample {index}")

    @cached_property
    def targets(self) -> list[int]:
        if hasattr(self.dataset, "targets"):  # torchvision
            return [int(t) for t in self.dataset.targets]
        reader = getattr(self.dataset, "reader", None)
        if reader is not None and hasattr(reader, "iter_targets"):  # timm's hfds reader: the label column
            return [int(t) for t in reader.iter_targets()]
        return [int(self.dataset[i][1]) for i in range(len(self.dataset))]  # type: ignore[arg-type]


def _map_classes(dataset: Dataset, name: str) -> list[str]:
    classes = getattr(dataset, "classes", None)
    reader = getattr(dataset, "reader", None)
    if classes is None and reader is not None:
        mapping = reader.class_to_idx  # {name: index}
        classes = sorted(mapping, key=mapping.get)
    if not classes:
        raise ValueError(f"dataset {name}: the source does not name its classes; map them with "
                         "dataset_kwargs.class_map (a file of class names, one a line)")
    return [str(c) for c in classes]


def _create_map(name: str, root: str | None, split: str, download: bool, options: Mapping[str, Any]) -> Dataset:
    from timm.data import create_dataset

    # timm's readers would convert images with PIL's convert("RGB"), which clips 16-bit and float
    # pixels; TimmMapDataset converts them by mode (checked_sample), as the other sources do.
    options = {"input_img_mode": None, **options}
    try:
        return create_dataset(name, root=root, split=split, download=download, **options)
    except AssertionError as error:  # timm asserts on unknown torchvision names
        raise ValueError(f"dataset {name}: {error or 'timm.data.create_dataset does not know it'}") from None
    except ImportError as error:
        raise ValueError(f"dataset {name} needs the {error.name} package: {DATA_EXTRA}") from None
    except (FileNotFoundError, RuntimeError) as error:  # torchvision's "Dataset not found" and friends
        raise ValueError(f"dataset {name} split {split!r} (data_dir {root}): {error}") from None


def timm_map_datasets(
    name: str,
    root: str | None,
    *,
    train_split: str,
    val_split: str | float | int,
    split_seed: int,
    download: bool,
    options: Mapping[str, Any],
    num_classes: int | None,
) -> tuple[Dataset, Dataset, DatasetInfo]:
    """The ``(train, val, info)`` of a map-style source: ``val_split`` names the validation
    split, or is a fraction / count split off the training split (stratified, seeded by
    ``split_seed``); ``options`` go to ``create_dataset`` as they are; ``num_classes`` sets the
    class count where the source does not name its classes."""
    train = _create_map(name, root, train_split, download, options)
    try:
        classes = _map_classes(train, name)
    except ValueError:
        if num_classes is None:
            raise
        classes = []
    if num_classes is not None and len(classes) != num_classes:
        classes = [str(c) for c in range(num_classes)]
    train = TimmMapDataset(train, classes, f"dataset {name} split {train_split!r}")
    val: Dataset
    if not isinstance(val_split, str):
        train, val = split_dataset(train, train.targets, val_split, split_seed)
    else:
        val = TimmMapDataset(_create_map(name, root, val_split, download, options), classes,
                             f"dataset {name} split {val_split!r}")
    for split in (train, val):
        check_first_samples(split)
    image = (train.dataset if hasattr(train, "indices") else train)[0][0]
    return train, val, timm_source_info(name, classes, len(image.getbands()), max(image.size))
