"""Data sources: the embedded digits, CIFAR-10/100, ImageFolder trees and synthetic images.

Every source returns a train and a validation dataset of ``(PIL image, class index)``
pairs, untransformed (transforms are applied by :class:`ssog.data.loader.TransformedDataset`
so that a train and a validation split can share one underlying dataset), plus a
:class:`DatasetInfo` describing them.
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, Subset
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

__all__ = [
    "DATASETS", "DatasetInfo", "ArrayDataset", "build_datasets", "dataset_targets", "stratified_split",
    "training_subset", "image_problem", "unreadable_images", "load_image", "evaluation_folder",
]

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

# A JPEG's end-of-image marker is looked for this close to the end of the file (some
# writers append a few bytes after it); entropy-coded data never contains the marker.
_JPEG_TAIL_BYTES = 1024
_CHECK_THREADS = 16

IMAGEFOLDER_LAYOUT = (
    "ImageFolder layout: DIR/train/<class>/<image> and DIR/val/<class>/<image> "
    "(or DIR/validation/..., timm's name; or only DIR/train with val_split set)"
)
#: Names of an ImageFolder tree's validation folder, in the order they are looked for.
VAL_FOLDERS = ("val", "validation")


def _val_folder(base: Path) -> Path | None:
    """``base/val``, else ``base/validation`` (timm's split name), if either is a folder."""
    return next((base / name for name in VAL_FOLDERS if (base / name).is_dir()), None)


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


class ArrayDataset(Dataset):
    """In-memory ``uint8`` images ``(N, H, W)`` (grey) or ``(N, H, W, 3)`` (RGB) with labels."""

    def __init__(self, images: np.ndarray, targets: Sequence[int]):
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


def stratified_split(
    targets: Sequence[int], val_split: float | int, seed: int
) -> tuple[list[int], list[int]]:
    """Seeded stratified split of ``range(len(targets))`` into (train, val) index lists.

    ``val_split`` is a fraction in (0, 1) or a number of validation samples.
    """
    n = len(targets)
    valid = (isinstance(val_split, float) and 0.0 < val_split < 1.0) or (
        isinstance(val_split, int) and not isinstance(val_split, bool) and 0 < val_split < n
    )
    if not valid:
        raise ValueError(
            f"val_split must be a fraction in (0, 1) or a sample count in [1, {n - 1}], got {val_split!r}"
        )
    return _stratified_indices(targets, val_split, seed)


def _stratified_indices(targets: Sequence[int], test_size: float | int, seed: int) -> tuple[list[int], list[int]]:
    """scikit-learn's seeded stratified ``train_test_split`` of ``range(len(targets))``, as sorted
    (kept, held out) index lists; ``test_size`` is a fraction or a count, already checked."""
    kept, held_out = train_test_split(
        np.arange(len(targets)), test_size=test_size, stratify=np.asarray(targets), random_state=seed, shuffle=True
    )
    return sorted(kept.tolist()), sorted(held_out.tolist())


def dataset_targets(dataset: Dataset) -> list[int]:
    """Class index of every sample of ``dataset`` (a source with ``targets``, or a ``Subset``
    of one), read without loading any image."""
    if isinstance(dataset, Subset):
        targets = dataset_targets(dataset.dataset)
        return [targets[i] for i in dataset.indices]
    return list(dataset.targets)


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


def _split(dataset: Dataset, targets: Sequence[int], val_split: float | int, seed: int) -> tuple[Subset, Subset]:
    train_idx, val_idx = stratified_split(targets, val_split, seed)
    return Subset(dataset, train_idx), Subset(dataset, val_idx)


def _digits(val_split: float | int | None, seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    from sklearn.datasets import load_digits

    digits = load_digits()  # bundled with scikit-learn: 1797 images, 8x8, values 0..16
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    full = ArrayDataset(images, digits.target)
    train, val = _split(full, full.targets, 0.2 if val_split is None else val_split, seed)
    info = DatasetInfo("digits", 10, 1, 8, (0.5,), (0.5,), hflip=False,
                       classes=tuple(str(c) for c in digits.target_names))
    return train, val, info


def _synthetic(size: int, num_classes: int, img_size: int, seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    """Random RGB images with a class-dependent colour offset, so that a model can learn them."""
    if size < 2 * num_classes:
        raise ValueError(f"synthetic_size must be at least 2 * num_classes = {2 * num_classes}, got {size}")
    rng = np.random.default_rng(seed)
    n_val = max(num_classes, size // 4)
    targets = np.arange(size + n_val) % num_classes
    offsets = rng.uniform(-60, 60, size=(num_classes, 1, 1, 3))
    noise = rng.normal(127.5, 40.0, size=(size + n_val, img_size, img_size, 3))
    images = np.clip(noise + offsets[targets], 0, 255).astype(np.uint8)
    info = DatasetInfo("synthetic", num_classes, 3, img_size, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25),
                       classes=tuple(str(c) for c in range(num_classes)))
    return ArrayDataset(images[:size], targets[:size]), ArrayDataset(images[size:], targets[size:]), info


def _cifar(name: str, root: str | None, download: bool, val_split: float | int | None,
           seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    from torchvision.datasets import CIFAR10, CIFAR100

    cls, folder = (CIFAR10, "cifar-10-batches-py") if name == "cifar10" else (CIFAR100, "cifar-100-python")
    if root is None:
        raise ValueError(f"dataset {name!r} needs data_dir (a folder holding {folder}/, or --download)")
    try:
        train = cls(root, train=True, download=download)
        test = None if val_split is not None else cls(root, train=False, download=download)
    except RuntimeError as error:  # torchvision's "Dataset not found or corrupted"
        raise FileNotFoundError(
            f"{name} not found in {root}: expected the python version of the data set in "
            f"{Path(root) / folder} (pass --download where a network is available)"
        ) from error
    mean, std = (CIFAR10_MEAN, CIFAR10_STD) if name == "cifar10" else (CIFAR100_MEAN, CIFAR100_STD)
    info = DatasetInfo(name, len(train.classes), 3, 32, mean, std, classes=tuple(train.classes))
    if test is None:
        train, test = _split(train, train.targets, val_split, seed)
    return train, test, info


def image_problem(path: str | Path) -> str | None:
    """Why the image file at ``path`` cannot be used, or ``None`` if it looks whole.

    Cheap, reading headers rather than pixels: PIL must recognise the file and pass its
    ``verify`` (which for PNG walks every chunk, so a cut-off PNG fails), and a JPEG must keep
    its end-of-image marker near the end of the file (a truncated download loses it).
    """
    try:
        with Image.open(path) as image:
            image_format = image.format
            image.verify()
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, struct.error, ...
        return f"{type(error).__name__}: {error}"
    if image_format == "JPEG":
        with open(path, "rb") as handle:
            handle.seek(max(0, Path(path).stat().st_size - _JPEG_TAIL_BYTES))
            if b"\xff\xd9" not in handle.read():
                return "truncated JPEG (no end-of-image marker)"
    return None


def unreadable_images(paths: Sequence[str | Path]) -> list[tuple[str, str]]:
    """``(path, reason)`` of every file of ``paths`` that :func:`image_problem` rejects, in order."""
    with ThreadPoolExecutor(max_workers=_CHECK_THREADS) as pool:  # file reads: threads overlap them
        problems = list(pool.map(image_problem, paths))
    return [(str(path), problem) for path, problem in zip(paths, problems) if problem is not None]


def load_image(path: str) -> Image.Image:
    """ImageFolder's loader (an RGB PIL image), with the file named when decoding fails."""
    try:
        with open(path, "rb") as handle:
            return Image.open(handle).convert("RGB")
    except Exception as error:
        raise ValueError(f"cannot decode image {path} ({type(error).__name__}: {error}); "
                         "remove or replace the file") from error


def _image_folder(path: Path, skip_bad_images: bool = False):
    from torchvision.datasets import ImageFolder

    classes = [p for p in path.iterdir() if p.is_dir()] if path.is_dir() else []
    if not classes:
        raise ValueError(f"{path} has no class folders; expected {IMAGEFOLDER_LAYOUT}")
    try:
        folder = ImageFolder(str(path), loader=load_image)
    except FileNotFoundError as error:  # class folders without any image file
        raise FileNotFoundError(f"{path}: {error}; expected {IMAGEFOLDER_LAYOUT}") from error
    bad = unreadable_images([sample for sample, _ in folder.samples])
    if bad and not skip_bad_images:
        shown = "; ".join(f"{file} ({reason})" for file, reason in bad[:3])
        raise ValueError(f"{len(bad)} unreadable image(s) in {path}: {shown}{'; ...' if len(bad) > 3 else ''}; "
                         "remove them, or pass --skip-bad-images to train without them")
    if bad:
        for file, reason in bad:
            print(f"warning: skipping unreadable image {file} ({reason})", file=sys.stderr)
        print(f"warning: skipped {len(bad)} unreadable image(s) in {path}", file=sys.stderr)
        skipped = {file for file, _ in bad}
        folder.samples = folder.imgs = [s for s in folder.samples if s[0] not in skipped]
        folder.targets = [target for _, target in folder.samples]
    return folder


def _imagefolder(root: str | None, val_split: float | int | None, seed: int,
                 skip_bad_images: bool) -> tuple[Dataset, Dataset, DatasetInfo]:
    if root is None:
        raise ValueError(f"dataset 'imagefolder' needs data_dir; expected {IMAGEFOLDER_LAYOUT}")
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"data folder {base} does not exist; expected {IMAGEFOLDER_LAYOUT}")
    if not (base / "train").is_dir():
        found = sorted(p.name for p in base.iterdir() if p.is_dir())
        raise ValueError(f"{base} has no 'train' folder (found folders: {found}); expected {IMAGEFOLDER_LAYOUT}")
    train = _image_folder(base / "train", skip_bad_images)
    if len(train.classes) < 2:
        raise ValueError(f"{base / 'train'} has {len(train.classes)} class folder ({', '.join(train.classes)}); "
                         f"classification needs at least 2 classes; expected {IMAGEFOLDER_LAYOUT}")
    if val_split is not None:
        train_set, val_set = _split(train, train.targets, val_split, seed)
    elif (val_dir := _val_folder(base)) is not None:
        train_set, val_set = train, _image_folder(val_dir, skip_bad_images)
        if val_set.classes != train.classes:
            raise ValueError(
                f"class folders of {val_dir} ({len(val_set.classes)}) differ from those of "
                f"{base / 'train'} ({len(train.classes)}); both splits need the same class folders"
            )
    else:
        found = sorted(p.name for p in base.iterdir() if p.is_dir())
        raise ValueError(
            f"{base} has no 'val' folder nor a 'validation' folder (found folders: {found}) and val_split is not set; "
            f"expected {IMAGEFOLDER_LAYOUT}"
        )
    return train_set, val_set, _imagefolder_info(train.classes)


def _imagefolder_info(classes: Sequence[str]) -> DatasetInfo:
    return DatasetInfo("imagefolder", len(classes), 3, 224, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD,
                       crop_pct=0.875, classes=tuple(classes))


def evaluation_folder(
    root: str | Path, split: str = "val", skip_bad_images: bool = False
) -> tuple[Dataset, DatasetInfo]:
    """Every image of ``root/<split>`` if that folder exists, else of ``root`` itself, as an
    ImageFolder (``<folder>/<class>/<image>``); no training folder is needed and nothing is split off."""
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(
            f"data folder {base} does not exist; expected DIR/<class>/<image> or DIR/{split}/<class>/<image>"
        )
    named = _val_folder(base) if split == "val" else base / split
    folder = named if named is not None and named.is_dir() else base
    if folder == base and {"train", *VAL_FOLDERS} & {p.name for p in base.iterdir() if p.is_dir()}:
        raise ValueError(
            f"{base} has no '{split}' folder to evaluate (found train/val folders: it is not a folder of classes)"
        )
    dataset = _image_folder(folder, skip_bad_images)
    return dataset, _imagefolder_info(dataset.classes)


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
    """The (train, val, info) of data source ``name``: one of :data:`DATASETS`, or a
    ``timm.data.create_dataset`` name (``hfds/``, ``hfids/``, ``wds/``, ``tfds/``, ``torch/``:
    :func:`ssog.data.timm_sources.timm_datasets`, which also takes ``train_split``, ``seed``,
    ``num_classes`` and ``dataset_kwargs``, and a ``val_split`` that names a split).

    ``val_split`` (a fraction or a count) splits the validation set off the training set,
    stratified and seeded by ``split_seed``; ``None`` uses the source's own validation split
    (CIFAR's test set, ImageFolder's ``val`` folder, 20% of the digits).

    ImageFolder files are checked before use (:func:`unreadable_images`): an unreadable one is
    an error naming it, or with ``skip_bad_images`` a warning naming it, and it is left out.
    """
    from ssog.data.timm_sources import is_timm_source, timm_datasets

    if is_timm_source(name):
        return timm_datasets(name, data_dir, train_split=train_split, val_split=val_split, split_seed=split_seed,
                             download=download, seed=seed, num_classes=num_classes, options=dataset_kwargs)
    timm_only = (("val_split", isinstance(val_split, str), False), ("train_split", train_split, "train"),
                 ("dataset_kwargs", dataset_kwargs or {}, {}))
    for setting, value, default in timm_only:
        if value != default:
            raise ValueError(f"{setting} {'names a split' if setting == 'val_split' else 'is set'}, which only "
                             f"timm's sources (hfds/, hfids/, wds/, tfds/, torch/) take; dataset {name!r} does not")
    if name == "digits":
        return _digits(val_split, split_seed)
    if name in ("cifar10", "cifar100"):
        return _cifar(name, data_dir, download, val_split, split_seed)
    if name == "imagefolder":
        return _imagefolder(data_dir, val_split, split_seed, skip_bad_images)
    if name == "synthetic":
        return _synthetic(synthetic_size, synthetic_classes, synthetic_img_size, split_seed)
    raise ValueError(f"unknown dataset {name!r}; expected one of {list(DATASETS)} or a timm data source "
                     "(hfds/NAME, hfids/NAME, wds/NAME, tfds/NAME, torch/NAME)")
