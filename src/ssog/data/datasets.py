"""Data sources: the embedded digits, CIFAR-10/100, ImageFolder trees and synthetic images.

Every source returns a train and a validation dataset of ``(PIL image, class index)``
pairs, untransformed (transforms are applied by :class:`ssog.data.loader.TransformedDataset`
so that a train and a validation split can share one underlying dataset), plus a
:class:`DatasetInfo` describing them.
"""
from __future__ import annotations

import math
import os
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
    "training_subset", "image_problem", "unreadable_images", "load_image", "to_rgb", "evaluation_folder",
    "FolderScan", "ImageFiles", "scan_image_folder", "class_difference", "split_folder", "SPLIT_FOLDERS",
    "SOURCE_STATISTICS",
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
            f"val_split (--val-split) must be a fraction in (0, 1) or a sample count in [1, {n - 1}], "
            f"got {val_split!r}"
        )
    counts = np.bincount(np.asarray(targets))
    counts = counts[counts > 0]
    classes = len(counts)
    if counts.min() < 2:
        raise ValueError(f"val_split (--val-split): a stratified split needs at least 2 images of every class, and "
                         f"{int((counts < 2).sum())} of the {classes} classes have only 1")
    # scikit-learn's sizes: ceil(fraction * n) held out; each side needs one image per class.
    held_out = math.ceil(val_split * n) if isinstance(val_split, float) else val_split
    if not classes <= held_out <= n - classes:
        raise ValueError(
            f"val_split {val_split!r} (--val-split) holds out {held_out} of {n} images, and a stratified split of "
            f"{classes} classes needs at least {classes} on each side: give a count in [{classes}, {n - classes}] "
            f"or a fraction in [{math.ceil(1e4 * classes / n) / 1e4:g}, {math.floor(1e4 * (n - classes) / n) / 1e4:g}]"
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
    size, mean, std, _ = SOURCE_STATISTICS["digits"]
    info = DatasetInfo("digits", 10, 1, size, mean, std, hflip=False,
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
    _, mean, std, _ = SOURCE_STATISTICS["synthetic"]
    info = DatasetInfo("synthetic", num_classes, 3, img_size, mean, std,
                       classes=tuple(str(c) for c in range(num_classes)))
    return ArrayDataset(images[:size], targets[:size]), ArrayDataset(images[size:], targets[size:]), info


def _cifar(name: str, root: str | None, download: bool, val_split: float | int | None,
           seed: int) -> tuple[Dataset, Dataset, DatasetInfo]:
    from torchvision.datasets import CIFAR10, CIFAR100

    cls, folder = (CIFAR10, "cifar-10-batches-py") if name == "cifar10" else (CIFAR100, "cifar-100-python")
    if root is None:
        raise ValueError(f"dataset {name!r} needs data_dir (a folder holding {folder}/, or --download)")
    if Path(root).is_file():
        raise NotADirectoryError(f"data folder {root} is a file, not a folder; expected a folder holding {folder}/")
    try:
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
        train, test = _split(train, train.targets, val_split, seed)
    return train, test, info


def _cifar_damage(cls: type, name: str, folder: Path) -> str:
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
    """ImageFolder's loader (an RGB PIL image, :func:`to_rgb`), with the file named when decoding fails."""
    try:
        with open(path, "rb") as handle:
            return to_rgb(Image.open(handle))
    except Exception as error:
        raise ValueError(f"cannot decode image {path} ({type(error).__name__}: {error}); "
                         "remove or replace the file") from error


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB, by what its mode means (PIL's own ``convert("RGB")`` clips
    16-bit and float pixels to 0..255, so a 16-bit PNG turns white and a float TIFF black):

    * 16- and 32-bit integer grey (``I;16``, ``I``): scaled by the largest value of the file's
      format, ``v * 255 / (2**bits - 1)`` (65535 -> 255; signed TIFF: ``2**(bits - 1) - 1``);
      negative values are an error;
    * 32-bit float grey (``F``): values in [0, 1] times 255, values in [0, 255] as they are,
      anything else (negative, above 255, NaN) an error;
    * alpha (``RGBA``, ``LA``, ``PA``, a palette with a transparent colour) is dropped, as
      torchvision's and timm's loaders drop it: pixels keep their stored colour;
    * every other mode (``1``, ``L``, ``P``, ``CMYK``, ``YCbCr``, ...) by PIL's conversion.
    """
    mode = image.mode
    if mode == "I" or mode.startswith("I;16"):
        values = np.asarray(image, dtype=np.float64)
        if values.size and values.min() < 0:
            raise ValueError(f"a {mode} image with negative values ({values.min():g}) has no 8-bit meaning")
        return _grey_rgb(values * (255.0 / _integer_peak(image, values)))
    if mode == "F":
        values = np.asarray(image, dtype=np.float64)
        low, high = (values.min(), values.max()) if values.size else (0.0, 0.0)
        if not (np.isfinite(values).all() and low >= 0 and high <= 255):
            raise ValueError(f"a float image with values in [{low:g}, {high:g}]: expected [0, 1] (scaled by 255) "
                             "or [0, 255]")
        return _grey_rgb(values * 255.0 if high <= 1 else values)
    if mode in ("P", "PA") and (mode == "PA" or "transparency" in image.info):
        image = image.convert("RGBA")  # PIL warns when a palette's transparency goes straight to RGB
    return image.convert("RGB")


def _integer_peak(image: Image.Image, values: np.ndarray) -> int:
    """The largest value of an integer grey image's format: 65535 for ``I;16*`` and PNG, by a
    TIFF's BitsPerSample and SampleFormat (signed: ``2**(bits - 1) - 1``), else 65535 when every
    value fits (PGM, ...) and ``2**32 - 1`` otherwise."""
    if image.mode.startswith("I;16") or image.format == "PNG":
        return 2**16 - 1
    tags = getattr(image, "tag_v2", None)
    bits = tags.get(258) if tags is not None else None  # TIFF BitsPerSample
    if bits:
        bits = int(bits[0] if isinstance(bits, tuple) else bits)
        sample_format = tags.get(339, 1)  # 1 unsigned, 2 signed
        signed = (sample_format[0] if isinstance(sample_format, tuple) else sample_format) == 2
        return 2 ** (bits - 1) - 1 if signed else 2**bits - 1
    return 2**16 - 1 if not values.size or values.max() <= 2**16 - 1 else 2**32 - 1


def _grey_rgb(levels: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(np.rint(levels), 0, 255).astype(np.uint8), "L").convert("RGB")


# Formats PIL reads itself (EPS needs Ghostscript, an outside program, to decode: left out).
def _readable_extensions() -> frozenset[str]:
    Image.init()
    return frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN and fmt != "EPS")


@dataclass
class FolderScan:
    """What :func:`scan_image_folder` found in ``root``: the class folders, the ``(path, class
    index)`` samples, and what it left out: files of types PIL does not read (count per
    extension), hidden entries (names starting with ``.``), and symlinked folders not
    followed because they lead back into a folder already read (a loop, or a second way in)."""

    root: Path
    classes: list[str]
    samples: list[tuple[str, int]]
    unread: dict[str, int] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)
    repeated_folders: list[str] = field(default_factory=list)

    def report(self) -> list[str]:
        """Warning lines (none when nothing was left out)."""
        lines = []
        if self.repeated_folders:
            shown = "; ".join(self.repeated_folders[:3]) + ("; ..." if len(self.repeated_folders) > 3 else "")
            lines.append(f"warning: {self.root}: did not follow {len(self.repeated_folders)} symlinked folder(s) "
                         f"that lead back into folders already read (a loop would repeat and mislabel images): "
                         f"{shown}")
        parts = []
        if self.unread:
            kinds = ", ".join(f"{ext or 'no extension'} x{count}" for ext, count in sorted(self.unread.items()))
            parts.append(f"{sum(self.unread.values())} file(s) of types the image loader does not read ({kinds})")
        if self.hidden:
            shown = ", ".join(self.hidden[:3]) + (", ..." if len(self.hidden) > 3 else "")
            parts.append(f"{len(self.hidden)} hidden entr{'y' if len(self.hidden) == 1 else 'ies'} ({shown})")
        if parts:
            lines.append(f"warning: {self.root}: ignored {' and '.join(parts)}")
        return lines


def scan_image_folder(root: str | Path) -> FolderScan:
    """The images of ``root/<class>/...`` (any depth), as torchvision's ImageFolder finds them,
    but: entries whose name starts with ``.`` (``.ipynb_checkpoints``, ``.DS_Store``) are
    neither classes nor images; every format PIL reads counts as an image (``.gif``, ``.tif``,
    ``.webp``, ...); symlinked files and folders are followed, except a folder whose real path
    was already read (a loop such as ``a/up -> ..``, or a link into another class), which is
    left out and reported. Classes are sorted; so is every folder's content.
    """
    root = Path(root)
    readable = _readable_extensions()
    scan = FolderScan(root, [], [])
    class_dirs = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith("."):
            scan.hidden.append(entry.name)
        elif entry.is_dir():
            class_dirs.append(Path(entry.path))
    scan.classes = [folder.name for folder in class_dirs]
    # Every class folder is read as its own class first, so a link into it from elsewhere is a repeat.
    seen = {os.path.realpath(root): root}
    for folder in class_dirs:
        seen.setdefault(os.path.realpath(folder), folder)

    def walk(folder: Path, target: int) -> None:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            path = Path(entry.path)
            if entry.name.startswith("."):
                scan.hidden.append(str(path.relative_to(root)))
            elif entry.is_dir():
                real = os.path.realpath(path)
                if real in seen:
                    scan.repeated_folders.append(f"{path.relative_to(root)} -> {seen[real]}")
                    continue
                seen[real] = path
                walk(path, target)
            elif entry.is_file():
                extension = path.suffix.lower()
                if extension in readable:
                    scan.samples.append((str(path), target))
                else:
                    scan.unread[extension] = scan.unread.get(extension, 0) + 1
            else:  # a broken symlink
                scan.unread["broken link"] = scan.unread.get("broken link", 0) + 1

    for index, folder in enumerate(class_dirs):
        if seen[os.path.realpath(folder)] == folder:
            walk(folder, index)
    return scan


class ImageFiles(Dataset):
    """``(PIL RGB image, class index)`` of image files, with torchvision ImageFolder's attributes
    (``root``, ``classes``, ``class_to_idx``, ``samples``, ``targets``). Not torchvision's class
    itself: it scans its folder on creation, with the rules :func:`scan_image_folder` replaces."""

    def __init__(self, root: str | Path, classes: Sequence[str], samples: Sequence[tuple[str, int]]):
        self.root = str(root)
        self.classes = list(classes)
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.samples = list(samples)
        self.targets = [target for _, target in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, target = self.samples[index]
        return load_image(path), target


def _image_folder(path: Path, skip_bad_images: bool = False) -> ImageFiles:
    """:class:`ImageFiles` of :func:`scan_image_folder`'s samples, checked by
    :func:`unreadable_images`; every class must keep at least one image."""
    scan = scan_image_folder(path) if path.is_dir() else None
    if scan is None or not scan.classes:
        hidden = f" (only hidden folders: {', '.join(scan.hidden)})" if scan is not None and scan.hidden else ""
        raise ValueError(f"{path} has no class folders{hidden}; expected {IMAGEFOLDER_LAYOUT}")
    for line in scan.report():
        print(line, file=sys.stderr)

    _check_classes_have_images(path, scan.classes, scan.samples, "holds no image PIL reads")
    folder = ImageFiles(path, scan.classes, scan.samples)
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
        folder = ImageFiles(path, folder.classes, [s for s in folder.samples if s[0] not in skipped])
        _check_classes_have_images(path, folder.classes, folder.samples, "has no readable image left after "
                                   "--skip-bad-images left out its unreadable ones")
    return folder


def _check_classes_have_images(path: Path, classes: Sequence[str], samples: Sequence[tuple[str, int]],
                               what: str) -> None:
    """A class without images would train as a class that never occurs: an error naming it."""
    counts = np.bincount([target for _, target in samples], minlength=len(classes))
    empty = [classes[i] for i in np.flatnonzero(counts == 0)]
    if empty:
        raise ValueError(f"class folder(s) {_shown(empty)} of {path} {what}; add images or remove the folder(s); "
                         f"expected {IMAGEFOLDER_LAYOUT}")


def _shown(names: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names``, and how many there are in all when that is more."""
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


#: Names of an ImageFolder's split folders, in the order they are looked for.
SPLIT_FOLDERS = {"train": ("train",), "val": ("val", "validation")}


def split_folder(base: Path, split: str) -> Path | None:
    """The folder of ``split`` (``train`` or ``val``) in ``base``: the first of its
    :data:`SPLIT_FOLDERS` names that exists, else None."""
    return next((base / name for name in SPLIT_FOLDERS[split] if (base / name).is_dir()), None)


def _data_folder(root: str | Path, expected: str) -> Path:
    """``root`` as an existing folder, or an error saying what it is instead."""
    base = Path(root)
    if base.is_file():
        raise NotADirectoryError(f"data folder {base} is a file, not a folder; expected {expected}")
    if not base.is_dir():
        raise FileNotFoundError(f"data folder {base} does not exist; expected {expected}")
    return base


def _imagefolder(root: str | None, val_split: float | int | None, seed: int,
                 skip_bad_images: bool) -> tuple[Dataset, Dataset, DatasetInfo]:
    if root is None:
        raise ValueError(f"dataset 'imagefolder' needs data_dir; expected {IMAGEFOLDER_LAYOUT}")
    base = _data_folder(root, IMAGEFOLDER_LAYOUT)
    train_folder, val_folder = split_folder(base, "train"), split_folder(base, "val")
    if train_folder is None:
        found = sorted(p.name for p in base.iterdir() if p.is_dir())
        raise ValueError(f"{base} has no 'train' folder (found folders: {found}); expected {IMAGEFOLDER_LAYOUT}")
    train = _image_folder(train_folder, skip_bad_images)
    if len(train.classes) < 2:
        raise ValueError(f"{train_folder} has {len(train.classes)} class folder ({', '.join(train.classes)}); "
                         f"classification needs at least 2 classes; expected {IMAGEFOLDER_LAYOUT}")
    if val_split is not None:
        train_set, val_set = _split(train, train.targets, val_split, seed)
    elif val_folder is not None:
        train_set, val_set = train, _image_folder(val_folder, skip_bad_images)
        if val_set.classes != train.classes:
            raise ValueError(f"the class folders of {val_folder} differ from those of {train_folder} "
                             f"({class_difference(train.classes, val_set.classes)}); both splits need the same "
                             "class folders")
    else:
        found = sorted(p.name for p in base.iterdir() if p.is_dir())
        raise ValueError(
            f"{base} has no 'val' folder nor a 'validation' folder (found folders: {found}) and val_split is not set; "
            f"expected {IMAGEFOLDER_LAYOUT}"
        )
    return train_set, val_set, _imagefolder_info(train.classes)


def class_difference(expected: Sequence[str], found: Sequence[str]) -> str:
    """Which classes of ``expected`` are missing from ``found`` and which are extra, up to 5 each."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if not missing and not extra:
        return "the same names in another order"
    return f"missing: {_shown(missing) or 'none'}; extra: {_shown(extra) or 'none'}"


def _imagefolder_info(classes: Sequence[str]) -> DatasetInfo:
    size, mean, std, crop_pct = SOURCE_STATISTICS["imagefolder"]
    return DatasetInfo("imagefolder", len(classes), 3, size, mean, std, crop_pct=crop_pct, classes=tuple(classes))


def evaluation_folder(
    root: str | Path, split: str = "val", skip_bad_images: bool = False
) -> tuple[Dataset, DatasetInfo]:
    """Every image of ``root/<split>`` if that folder exists, else of ``root`` itself, as an
    ImageFolder (``<folder>/<class>/<image>``); no training folder is needed and nothing is split off."""
    base = _data_folder(root, f"DIR/<class>/<image> or DIR/{split}/<class>/<image>")
    folder = split_folder(base, split) or base
    if folder == base and any(split_folder(base, name) for name in SPLIT_FOLDERS):
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
