"""ImageFolder trees (``DIR/<class>/<image>``): the scan of a folder, its images checked before
use (each read through :func:`~ssog.data.samples.checked_sample`), the train and val folders of
a data folder, and a folder to evaluate.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from ssog.data.images import readable_extensions, unreadable_images
from ssog.data.info import SOURCE_STATISTICS, DatasetInfo, shown_names, split_dataset
from ssog.data.samples import check_first_samples, checked_sample

__all__ = [
    "IMAGEFOLDER_LAYOUT", "SPLIT_FOLDERS", "FolderScan", "scan_image_folder", "ImageFiles", "split_folders",
    "imagefolder_datasets", "imagefolder_layout", "evaluation_folder", "class_difference",
]

logger = logging.getLogger(__name__)

IMAGEFOLDER_LAYOUT = (
    "ImageFolder layout: DIR/train/<class>/<image> and DIR/val/<class>/<image> "
    "(or DIR/validation/..., timm's name; or only DIR/train, or a folder of classes DIR/<class>/<image>, with "
    "val_split set)"
)


@dataclass
class FolderScan:
    """What :func:`scan_image_folder` found in ``root``: the class folders, the ``(path, class
    index)`` samples, and what it left out: image files in ``root`` itself, outside any class
    folder, files of types PIL does not read (count per extension), hidden entries (names
    starting with ``.``), and symlinked folders not followed because they lead back into a
    folder already read (a loop, or a second way in)."""

    root: Path
    classes: list[str]
    samples: list[tuple[str, int]]
    outside_classes: list[str] = field(default_factory=list)
    unread: dict[str, int] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)
    repeated_folders: list[str] = field(default_factory=list)

    def report(self) -> list[str]:
        """Warning messages, one per kind of entry left out (none when nothing was)."""
        lines = []
        if self.outside_classes:
            lines.append(f"{self.root}: ignored {len(self.outside_classes)} image file(s) outside the class folders "
                         f"({shown_names(self.outside_classes, 3)}): an ImageFolder reads DIR/<class>/<image>; "
                         "move them into their class folders")
        if self.repeated_folders:
            shown = "; ".join(self.repeated_folders[:3]) + ("; ..." if len(self.repeated_folders) > 3 else "")
            lines.append(f"{self.root}: did not follow {len(self.repeated_folders)} symlinked folder(s) "
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
            lines.append(f"{self.root}: ignored {' and '.join(parts)}")
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
    readable = readable_extensions()
    scan = FolderScan(root, [], [])
    class_dirs = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith("."):
            scan.hidden.append(entry.name)
        elif entry.is_dir():
            class_dirs.append(Path(entry.path))
        elif Path(entry.name).suffix.lower() in readable:
            scan.outside_classes.append(entry.name)
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
    """``(PIL RGB image, class index)`` of image files, read by
    :func:`~ssog.data.samples.checked_sample` (upright by EXIF orientation, converted by mode,
    an error naming the file), with torchvision ImageFolder's attributes (``root``,
    ``classes``, ``class_to_idx``, ``samples``, ``targets``). Not torchvision's class itself:
    it scans its folder on creation, with the rules :func:`scan_image_folder` replaces."""

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
        return checked_sample(path, target, channels=3, num_classes=len(self.classes),
                              where=f"ImageFolder {self.root}, sample {index}, file {path}")


def _image_folder(path: Path, skip_bad_images: bool = False) -> ImageFiles:
    """:class:`ImageFiles` of :func:`scan_image_folder`'s samples, checked by
    :func:`unreadable_images` and its first ones decoded; every class must keep at least one image."""
    scan = scan_image_folder(path) if path.is_dir() else None
    if scan is None or not scan.classes:
        hidden = f" (only hidden folders: {', '.join(scan.hidden)})" if scan is not None and scan.hidden else ""
        raise ValueError(f"{path} has no class folders{hidden}; expected {IMAGEFOLDER_LAYOUT}")
    for line in scan.report():
        logger.warning(line)

    _check_classes_have_images(path, scan.classes, scan.samples, "holds no image PIL reads")
    folder = ImageFiles(path, scan.classes, scan.samples)
    bad = unreadable_images([sample for sample, _ in folder.samples])
    if bad and not skip_bad_images:
        shown = "; ".join(f"{file} ({reason})" for file, reason in bad[:3])
        raise ValueError(f"{len(bad)} unreadable image(s) in {path}: {shown}{'; ...' if len(bad) > 3 else ''}; "
                         "remove them, or pass --skip-bad-images to train without them")
    if bad:
        for file, reason in bad:
            logger.warning("skipping unreadable image %s (%s)", file, reason)
        logger.warning("skipped %d unreadable image(s) in %s", len(bad), path)
        skipped = {file for file, _ in bad}
        folder = ImageFiles(path, folder.classes, [s for s in folder.samples if s[0] not in skipped])
        _check_classes_have_images(path, folder.classes, folder.samples, "has no readable image left after "
                                   "--skip-bad-images left out its unreadable ones")
    check_first_samples(folder)
    return folder


def _check_classes_have_images(path: Path, classes: Sequence[str], samples: Sequence[tuple[str, int]],
                               what: str) -> None:
    """A class without images would train as a class that never occurs: an error naming it."""
    counts = np.bincount([target for _, target in samples], minlength=len(classes))
    empty = [classes[int(i)] for i in np.flatnonzero(counts == 0)]
    if empty:
        raise ValueError(f"class folder(s) {shown_names(empty)} of {path} {what}; add images or remove the folder(s); "
                         f"expected {IMAGEFOLDER_LAYOUT}")


#: Names of an ImageFolder's split folders, in the order they are looked for.
SPLIT_FOLDERS = {"train": ("train",), "val": ("val", "validation")}


def split_folders(base: Path, split: str) -> list[Path]:
    """The folders of ``split`` (``train`` or ``val``) in ``base``: those of its
    :data:`SPLIT_FOLDERS` names that exist (more than one is for the caller to refuse)."""
    return [base / name for name in SPLIT_FOLDERS[split] if (base / name).is_dir()]


def _holds(folder: Path) -> tuple[bool, bool]:
    """Whether ``folder`` holds image files itself, and whether it holds (non-hidden) folders."""
    readable = readable_extensions()
    images = folders = False
    for entry in os.scandir(folder):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            folders = True
        elif Path(entry.name).suffix.lower() in readable:
            images = True
    return images, folders


def imagefolder_layout(base: Path) -> str:
    """``"splits"`` when ``base`` is a train/val layout (``DIR/train/<class>/<image>``), ``"classes"``
    when it is a folder of classes (``DIR/<class>/<image>``), told by what its folders named
    ``train``, ``val`` or ``validation`` hold, not by their names alone (CIFAR-100 has a class
    ``train``): class folders make a split, images alone a class (of a folder with other
    classes beside it). A ValueError names both readings where the tree allows both: one
    such folder holds images and another class folders, or one holds both while other folders
    of ``base`` hold images themselves."""
    named = [folder for split in SPLIT_FOLDERS for folder in split_folders(base, split)]
    if not named:
        return "classes"
    holds = {folder: _holds(folder) for folder in named}
    as_split = [folder for folder, (images, folders) in holds.items() if folders and not images]
    as_class = [folder for folder, (images, folders) in holds.items() if images and not folders]
    both = [folder for folder, (images, folders) in holds.items() if images and folders]
    others = [Path(entry.path) for entry in sorted(os.scandir(base), key=lambda e: e.name)
              if entry.is_dir() and not entry.name.startswith(".") and Path(entry.path) not in holds]
    if as_class and not as_split and not both:
        return "classes" if others else "splits"  # a folder of one class is none: its split lacks class folders
    if as_class:
        splits, classes = as_split + both, as_class
    elif both and not as_split:
        classes = [folder for folder in others if _holds(folder)[0]][:3]
        if not classes:
            return "splits"  # images beside the class folders of a split, reported when it is read
        splits, classes = both, both + classes
    else:
        return "splits"
    raise ValueError(
        f"{base} reads two ways: as a train/val layout, {', '.join(f.name for f in splits)} holding class folders, "
        f"or as a folder of classes, {', '.join(f.name for f in classes)} holding images themselves; move what does "
        "not belong out of it so that one reading is left")


def _both(folders: Sequence[Path]) -> str:
    return " and ".join(f"a {folder.name!r}" for folder in folders)


def _found_folders(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.is_dir())


def _val_folder(base: Path, train_folder: Path, val_split: float | int | str | None) -> Path | None:
    """The validation folder: the one ``val_split`` names, else the one of ``val``/``validation``
    that exists (both is an error: which one is meant cannot be told); None with a numeric
    ``val_split`` (split off the training folder) or when there is none."""
    if isinstance(val_split, str):
        folder = base / val_split
        if not folder.is_dir():
            raise ValueError(f"val_split {val_split!r} names no folder of {base} (found folders: "
                             f"{_found_folders(base)}); expected {IMAGEFOLDER_LAYOUT}")
        if folder.resolve() == train_folder.resolve():
            raise ValueError(f"val_split {val_split!r} names the training folder {train_folder}; name another")
        return folder
    folders = split_folders(base, "val")
    if val_split is None and len(folders) > 1:
        raise ValueError(f"{base} has both {_both(folders)} folder; name the one to validate on: "
                         f"{' or '.join(f'--val-split {folder.name}' for folder in folders)} (val_split in a "
                         "recipe), or remove the other")
    return folders[0] if folders and val_split is None else None


def _data_folder(root: str | Path, expected: str) -> Path:
    """``root`` as an existing folder, or an error saying what it is instead."""
    base = Path(root)
    if base.is_file():
        raise NotADirectoryError(f"data folder {base} is a file, not a folder; expected {expected}")
    if not base.is_dir():
        raise FileNotFoundError(f"data folder {base} does not exist; expected {expected}")
    return base


def imagefolder_datasets(root: str | None, val_split: float | int | str | None, seed: int,
                         skip_bad_images: bool) -> tuple[Dataset, Dataset, DatasetInfo]:
    """The train and val folders of ``root`` (:data:`IMAGEFOLDER_LAYOUT`), or with a numeric
    ``val_split`` a split of its train folder seeded by ``seed``; a ``val_split`` that is a name
    names the validation folder (``val`` or ``validation`` when both exist). Every image is
    checked first (:func:`~ssog.data.images.unreadable_images`): an unreadable one is an error
    naming it, or with ``skip_bad_images`` a warning naming it, and it is left out."""
    if root is None:
        raise ValueError(f"dataset 'imagefolder' needs data_dir; expected {IMAGEFOLDER_LAYOUT}")
    base = _data_folder(root, IMAGEFOLDER_LAYOUT)
    if imagefolder_layout(base) == "classes":
        if val_split is None or isinstance(val_split, str):
            raise ValueError(f"{base} is a folder of classes (DIR/<class>/<image>, no train/ folder of class folders): "
                             "set val_split to a count or fraction of its images to validate on; expected "
                             f"{IMAGEFOLDER_LAYOUT}")
        train_folder, val_folder = base, None
    else:
        train_folders = split_folders(base, "train")
        if not train_folders:
            raise ValueError(f"{base} has no 'train' folder (found folders: {_found_folders(base)}); "
                             f"expected {IMAGEFOLDER_LAYOUT}")
        train_folder = train_folders[0]
        val_folder = _val_folder(base, train_folder, val_split)
    train = _image_folder(train_folder, skip_bad_images)
    if len(train.classes) < 2:
        raise ValueError(f"{train_folder} has {len(train.classes)} class folder ({', '.join(train.classes)}); "
                         f"classification needs at least 2 classes; expected {IMAGEFOLDER_LAYOUT}")
    train_set: Dataset
    val_set: Dataset
    if val_split is not None and not isinstance(val_split, str) and val_folder is None:
        train_set, val_set = split_dataset(train, train.targets, val_split, seed)
    elif val_folder is not None:
        val_files = _image_folder(val_folder, skip_bad_images)
        if val_files.classes != train.classes:
            raise ValueError(f"the class folders of {val_folder} differ from those of {train_folder} "
                             f"({class_difference(train.classes, val_files.classes)}); both splits need the same "
                             "class folders")
        train_set, val_set = train, val_files
    else:
        raise ValueError(
            f"{base} has no 'val' folder nor a 'validation' folder (found folders: {_found_folders(base)}) and "
            f"val_split is not set; expected {IMAGEFOLDER_LAYOUT}"
        )
    return train_set, val_set, _imagefolder_info(train.classes)


def class_difference(expected: Sequence[str], found: Sequence[str]) -> str:
    """Which classes of ``expected`` are missing from ``found`` and which are extra, up to 5 each."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if not missing and not extra:
        return "the same names in another order"
    return f"missing: {shown_names(missing) or 'none'}; extra: {shown_names(extra) or 'none'}"


def _imagefolder_info(classes: Sequence[str]) -> DatasetInfo:
    size, mean, std, crop_pct = SOURCE_STATISTICS["imagefolder"]
    return DatasetInfo("imagefolder", len(classes), 3, size, mean, std, crop_pct=crop_pct, classes=tuple(classes))


def evaluation_folder(
    root: str | Path, split: str = "val", skip_bad_images: bool = False
) -> tuple[Dataset, DatasetInfo]:
    """Every image of ``root/<split>`` when ``root`` is a train/val layout, else of ``root``
    itself, a folder of classes (:func:`imagefolder_layout`), as an ImageFolder
    (``<folder>/<class>/<image>``); no training folder is needed and nothing is split off."""
    base = _data_folder(root, f"DIR/<class>/<image> or DIR/{split}/<class>/<image>")
    folder = base
    if imagefolder_layout(base) == "splits":
        folders = split_folders(base, split)
        if len(folders) > 1:
            raise ValueError(f"{base} has both {_both(folders)} folder; give the one to evaluate as the folder: "
                             f"{' or '.join(f'--data-dir {folder}' for folder in folders)}")
        if not folders:
            raise ValueError(f"{base} has no '{split}' folder to evaluate (its train/val folders hold class folders: "
                             "it is not a folder of classes)")
        folder = folders[0]
    dataset = _image_folder(folder, skip_bad_images)
    return dataset, _imagefolder_info(dataset.classes)
