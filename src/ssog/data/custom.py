"""Datasets a user passes in Python (``ssog.train.train(cfg, train_dataset=..., val_dataset=...)``),
read through :func:`~ssog.data.samples.checked_sample` as every source is."""
from __future__ import annotations

from typing import Any

from PIL import Image
from torch.utils.data import Dataset, IterableDataset

from ssog.data.images import GREY_MODES
from ssog.data.info import DatasetInfo, dataset_targets
from ssog.data.samples import FIRST_SAMPLES, check_labels, checked_sample

__all__ = ["CUSTOM_DATASET", "CheckedDataset", "custom_datasets"]

#: ``dataset`` of a run trained on datasets passed in Python.
CUSTOM_DATASET = "custom"


class CheckedDataset(Dataset):
    """``dataset``'s ``(PIL image, label)`` pairs read by :func:`~ssog.data.samples.checked_sample`:
    upright by EXIF orientation, ``channels`` 1 (grey) or 3 (RGB), the label a class index
    below ``num_classes``; errors say ``"{name} sample {index}: ..."``."""

    def __init__(self, dataset: Dataset, channels: int, num_classes: int, name: str):
        self.dataset, self.channels, self.num_classes, self.name = dataset, channels, num_classes, name

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        image, label = self.dataset[index][:2]
        return checked_sample(image, label, channels=self.channels, num_classes=self.num_classes,
                              where=f"{self.name} sample {index}")


def _classes(dataset: Dataset, num_classes: int | None, which: str) -> list[str]:
    if num_classes is not None:
        return [str(c) for c in range(num_classes)]
    base = getattr(dataset, "dataset", dataset)  # a Subset names the classes of its source
    classes = getattr(dataset, "classes", None) or getattr(base, "classes", None)
    if classes:
        return [str(c) for c in classes]
    try:
        targets = dataset_targets(dataset)
    except AttributeError:
        raise ValueError(f"{which} has neither classes nor targets: set num_classes in the config") from None
    return [str(c) for c in range(max(targets) + 1)]


def _first_items(dataset: Dataset, which: str) -> list[tuple[Any, Any]]:
    """The first :data:`~ssog.data.samples.FIRST_SAMPLES` ``(image, label)`` of ``dataset``,
    checked to be PIL images (untransformed) with labels."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise ValueError(f"{which} must be a map-style Dataset (len and indexing); got {type(dataset).__name__}")
    if len(dataset) == 0:  # type: ignore[arg-type]  # torch's Dataset declares no __len__
        raise ValueError(f"{which} is empty")
    items = [dataset[index][:2] for index in range(min(FIRST_SAMPLES, len(dataset)))]  # type: ignore[arg-type]
    for image, _ in items:
        if not isinstance(image, Image.Image):
            raise ValueError(f"{which} yields {type(image).__name__} images; give it without its transform "
                             "(PIL images): the run's augmentation and data config transform them")
    return items


def custom_datasets(train: Dataset, val: Dataset,
                    num_classes: int | None = None) -> tuple[CheckedDataset, CheckedDataset, DatasetInfo]:
    """``(train, val, info)`` of two map-style datasets of ``(PIL image, class index)`` pairs.

    They are used as the built-in sources are: the run's augmentation and data config
    (input size, mean/std, crop) transform them, so they must come without a transform of
    their own. Classes come from ``num_classes``, else the training set's ``classes``, else
    its ``targets`` (the largest index + 1). The run reads grey images (1 channel) when the
    first samples of both are all grey, else RGB (3), grey ones converted; every sample is
    read by :func:`~ssog.data.samples.checked_sample`. Before training: the first samples of
    each are read, and every label of one that lists them (``targets``) is checked.
    """
    first = {"train_dataset": _first_items(train, "train_dataset"), "val_dataset": _first_items(val, "val_dataset")}
    classes = _classes(train, num_classes, "train_dataset")
    grey = all(image.mode in GREY_MODES for items in first.values() for image, _ in items)
    channels = 1 if grey else 3
    checked = {}
    for which, dataset in (("train_dataset", train), ("val_dataset", val)):
        try:
            targets = dataset_targets(dataset)
        except (AttributeError, TypeError):  # it does not list its labels: each is checked when read
            targets = None
        if targets is not None:
            check_labels(targets, len(classes), which)
        for index, (image, label) in enumerate(first[which]):
            checked_sample(image, label, channels=channels, num_classes=len(classes), where=f"{which} sample {index}")
        checked[which] = CheckedDataset(dataset, channels, len(classes), which)
    image = first["train_dataset"][0][0]
    info = DatasetInfo(CUSTOM_DATASET, len(classes), channels, max(image.size), (0.5,), (0.5,),
                       classes=tuple(classes))
    return checked["train_dataset"], checked["val_dataset"], info
