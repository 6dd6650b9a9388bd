"""The built-in sources: the embedded digits, CIFAR-10/100 (torchvision's files)
and synthetic images, each as ``(train, val, info)`` of ``(PIL image, class index)`` pairs.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from ssog.data.info import SOURCE_STATISTICS, DatasetInfo, split_dataset

__all__ = ["ArrayDataset", "digits_datasets", "cifar_datasets", "synthetic_datasets"]


class ArrayDataset(Dataset):
    """In-memory ``uint8`` images ``(N, H, W)`` (grey) or ``(N, H, W, 3)`` (RGB) with labels."""

    def __init__(self, images: np.ndarray, targets: Sequence[int] | np.ndarray):
        if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) != len(targets):
            raise ValueError(
                f"ArrayDataset expects uint8 images (N, H, W[, 3]) and N targets, got "
                f"{images.dtype} {images.shape} and {len(targets)} targets"
            )
        self.images = images
        self.targets = [int(t) for t in targets]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[index]), self.targets[index]


#: The embedded digits: the 1797 8x8 grey images (values 0..16) and their classes 0..9 of the
#: UCI ML hand-written digits test set (CC BY 4.0), as scikit-learn's ``load_digits`` has them.
DIGITS_FILE = Path(__file__).with_name("digits.npz")


def digits_datasets(val_split: float | int | None, seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    """The 1797 embedded 8x8 grey digits (:data:`DIGITS_FILE`), split by ``val_split`` (default
    20%) seeded by ``seed``."""
    with np.load(DIGITS_FILE) as digits:
        images = np.round(digits["images"].astype(np.float64) * (255.0 / 16.0)).astype(np.uint8)
        full = ArrayDataset(images, digits["targets"])
    train, val = split_dataset(full, full.targets, 0.2 if val_split is None else val_split, seed)
    size, mean, std, _ = SOURCE_STATISTICS["digits"]
    info = DatasetInfo("digits", 10, 1, size, mean, std, hflip=False, classes=tuple(str(c) for c in range(10)))
    return train, val, info


def synthetic_datasets(size: int, num_classes: int, img_size: int, seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    """Random RGB images with a class-dependent colour offset, so that a model can learn them:
    ``size`` training images and ``max(size // 4, min(num_classes, size // 2), 1)`` validation
    ones (one per class from ``2 * num_classes`` images up), of classes ``0, 1, ...`` in turn;
    fewer images than classes leave the later classes out: a generated stand-in of a recipe's
    shape, e.g. 4 images of CIFAR-100's 100 classes at 224 px, validated on 2."""
    rng = np.random.default_rng(seed)
    n_val = max(size // 4, min(num_classes, size // 2), 1)
    targets = np.arange(size + n_val) % num_classes
    offsets = rng.uniform(-60, 60, size=(num_classes, 1, 1, 3))
    noise = rng.normal(127.5, 40.0, size=(size + n_val, img_size, img_size, 3))
    images = np.clip(noise + offsets[targets], 0, 255).astype(np.uint8)
    _, mean, std, _ = SOURCE_STATISTICS["synthetic"]
    info = DatasetInfo("synthetic", num_classes, 3, img_size, mean, std,
                       classes=tuple(str(c) for c in range(num_classes)))
    return ArrayDataset(images[:size], targets[:size]), ArrayDataset(images[size:], targets[size:]), info


def cifar_datasets(name: str, root: str | None, download: bool, val_split: float | int | None,
                   seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    """CIFAR-10 or -100 (``name``) from torchvision's files in ``root``: its test set as the
    validation set, or with ``val_split`` a split of its training set seeded by ``seed``."""
    from torchvision.datasets import CIFAR10, CIFAR100

    cls, folder = (CIFAR10, "cifar-10-batches-py") if name == "cifar10" else (CIFAR100, "cifar-100-python")
    if root is None:
        raise ValueError(f"dataset {name!r} needs data_dir (a folder holding {folder}/, or --download)")
    if Path(root).is_file():
        raise NotADirectoryError(f"data folder {root} is a file, not a folder; expected a folder holding {folder}/")
    try:
        with _undone_on_failure(Path(root)) if download else nullcontext():
            train = cls(root, train=True, download=download)
            test = None if val_split is not None else cls(root, train=False, download=download)
    except RuntimeError as error:  # torchvision's "Dataset not found or corrupted"
        if (Path(root) / folder).is_dir():
            raise ValueError(_cifar_damage(cls, name, Path(root) / folder)) from error
        raise FileNotFoundError(
            f"{name} not found in {root}: expected the python version of the data set in "
            f"{Path(root) / folder} (pass --download where a network is available)"
        ) from error
    except OSError as error:  # a download that failed (no network): urllib's errors
        if not download:
            raise
        reason = getattr(error, "reason", None) or error.strerror or error
        raise OSError(f"could not download {name} from {cls.url} ({reason}); where this machine has no network, "
                      f"fetch {cls.filename} elsewhere and extract it into {root}") from error
    size, mean, std, _ = SOURCE_STATISTICS[name]
    info = DatasetInfo(name, len(train.classes), 3, size, mean, std, classes=tuple(train.classes))
    if test is None:
        assert val_split is not None  # the test set is read unless there is a val_split
        train, test = split_dataset(train, train.targets, val_split, seed)
    return train, test, info


@contextmanager
def _undone_on_failure(root: Path) -> Iterator[None]:
    """A download into ``root`` that fails leaves nothing behind: what it created there (a
    partial archive, a half-extracted folder), and ``root`` and its parents where it created
    them, are removed; what was there before is never touched."""
    created = [folder for folder in (root, *root.parents) if not folder.exists()]
    before = set(os.listdir(root)) if root.is_dir() else set()
    try:
        yield
    except BaseException:
        for name in (set(os.listdir(root)) - before) if root.is_dir() else ():
            path = root / name
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        for folder in created:  # the innermost first; rmdir leaves a folder someone filled meanwhile
            with suppress(OSError):
                folder.rmdir()
        raise


def _cifar_damage(cls: type[Any], name: str, folder: Path) -> str:
    """Why torchvision refused a CIFAR folder that exists: its files that are missing or fail
    their MD5 check."""
    from torchvision.datasets.utils import check_integrity

    files = [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]
    missing = [file for file, _ in files if not (folder / file).is_file()]
    corrupt = [file for file, md5 in files if file not in missing and not check_integrity(str(folder / file), md5)]
    found = "; ".join(part for part in (missing and f"missing: {', '.join(missing)}",
                                        corrupt and f"failing their MD5 check: {', '.join(corrupt)}") if part)
    return (f"{name} in {folder} is incomplete or corrupt ({found}); delete {folder} and download it again "
            "(--download)")
