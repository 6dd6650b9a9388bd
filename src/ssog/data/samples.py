"""The one path every sample takes, whatever its source (ImageFolder files, WebDataset and
Hugging Face shards, timm's map-style sources, datasets given in Python): :func:`checked_sample`
decodes the image, turns it upright by its EXIF orientation, converts it to the run's channels
(:func:`~ssog.data.images.decode_image`) and checks that its label is a class index in range.
Its errors (:class:`SampleError`) name the sample: its source, its shard or index, its key.

Plus the cheap checks made before a run starts: the first samples of a split
(:func:`check_first_samples`) and every label of a dataset that lists them (:func:`check_labels`).
"""
from __future__ import annotations

import numbers
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ssog.data.images import decode_image

__all__ = ["FIRST_SAMPLES", "SampleError", "checked_sample", "class_index", "check_first_samples", "check_labels"]

#: Samples of each split decoded before training starts.
FIRST_SAMPLES = 8


class SampleError(ValueError):
    """A sample that cannot be used; the message starts with where it is (source, shard or
    index, key) and says what is wrong with it."""


def checked_sample(image: Image.Image | bytes | str | Path, label: Any, *, channels: int, num_classes: int | None,
                   where: str) -> tuple[Image.Image, int]:
    """``(image, class index)`` of one sample: ``image`` (a PIL image, a file's bytes or path)
    decoded upright with ``channels`` (1: grey ``L``, 3: ``RGB``), ``label`` by
    :func:`class_index`; ``where`` names the sample in the errors."""
    try:
        decoded = decode_image(image, channels)
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, struct.error, ...
        raise SampleError(f"{where}: cannot decode its image ({type(error).__name__}: {error}); "
                          "remove or replace it") from error
    return decoded, class_index(label, num_classes, where)


def class_index(label: Any, num_classes: int | None, where: str) -> int:
    """``label`` as a class index in ``[0, num_classes)`` (any index when ``num_classes`` is
    None): an integer, a one-element integer tensor or array, an integral float, or the text of
    an integer (``str`` or ASCII ``bytes``, WebDataset's ``.cls``); else a :class:`SampleError`."""
    value = label
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("ascii", errors="replace")
    if isinstance(value, torch.Tensor) and value.numel() == 1 or isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        index = int(value)
    elif isinstance(value, numbers.Integral):
        index = int(value)
    elif isinstance(value, numbers.Real) and float(value).is_integer():
        index = int(value)  # type: ignore[call-overload]  # typeshed's numbers.Real declares no __int__
    else:
        shown = value if isinstance(value, str) else label
        raise SampleError(f"{where}: label {shown!r} is not a class index (an integer)")
    if num_classes is not None and not 0 <= index < num_classes:
        raise SampleError(f"{where}: label {index} is outside the {num_classes} classes (0..{num_classes - 1})")
    return index


def check_first_samples(dataset: Dataset, count: int = FIRST_SAMPLES) -> None:
    """Read the first ``count`` samples of a map-style ``dataset`` whose items go through
    :func:`checked_sample`: a split that does not decode fails before training, not in it."""
    for index in range(min(count, len(dataset))):  # type: ignore[arg-type]  # torch's Dataset declares no __len__
        dataset[index]


def check_labels(targets: Sequence[Any], num_classes: int, name: str) -> None:
    """Every label a dataset lists (its ``targets``) by :func:`class_index`: the first that
    fails is the error, ``"{name} sample {index}: ..."``, with how many fail."""
    values = np.asarray(targets)
    if values.ndim == 1 and values.dtype.kind in "iu":
        failing = np.flatnonzero((values < 0) | (values >= num_classes)).tolist()
    else:
        failing = [index for index, label in enumerate(targets) if not _is_class_index(label, num_classes)]
    if failing:
        try:
            class_index(targets[failing[0]], num_classes, f"{name} sample {failing[0]}")
        except SampleError as error:
            raise SampleError(f"{error} (of its {len(values)} targets, {len(failing)} are not class indices in "
                              "range)") from None


def _is_class_index(label: Any, num_classes: int) -> bool:
    try:
        class_index(label, num_classes, "")
    except SampleError:
        return False
    return True
