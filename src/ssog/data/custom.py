"""Datasets a user passes in Python (``ssog.train.train(cfg, train_dataset=..., val_dataset=...)``)."""
from __future__ import annotations

from PIL import Image
from torch.utils.data import Dataset, IterableDataset

from ssog.data.info import DatasetInfo, dataset_targets

__all__ = ["CUSTOM_DATASET", "custom_datasets"]

#: ``dataset`` of a run trained on datasets passed in Python.
CUSTOM_DATASET = "custom"


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


def custom_datasets(train: Dataset, val: Dataset,
                    num_classes: int | None = None) -> tuple[Dataset, Dataset, DatasetInfo]:
    """``(train, val, info)`` of two map-style datasets of ``(PIL image, class index)`` pairs.

    They are used as the built-in sources are: the run's augmentation and data config
    (input size, mean/std, crop) transform them, so they must come without a transform of
    their own. Classes come from ``num_classes``, else the training set's ``classes``, else
    its ``targets`` (the largest index + 1).
    """
    for which, dataset in (("train_dataset", train), ("val_dataset", val)):
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise ValueError(f"{which} must be a map-style Dataset (len and indexing); got {type(dataset).__name__}")
        if len(dataset) == 0:
            raise ValueError(f"{which} is empty")
        image, target = dataset[0][:2]
        if not isinstance(image, Image.Image):
            raise ValueError(f"{which} yields {type(image).__name__} images; give it without its transform "
                             "(PIL images): the run's augmentation and data config transform them")
        try:
            int(target)
        except (TypeError, ValueError):
            raise ValueError(f"{which} yields targets of type {type(target).__name__}; "
                             "expected class indices") from None
    classes = _classes(train, num_classes, "train_dataset")
    image = train[0][0]
    info = DatasetInfo(CUSTOM_DATASET, len(classes), len(image.getbands()), max(image.size), (0.5,), (0.5,),
                       classes=tuple(classes))
    return train, val, info
