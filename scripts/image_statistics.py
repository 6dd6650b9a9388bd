"""Per-channel mean and std of an ImageFolder tree's images (pixel values in [0, 1], RGB), the
normalisation a recipe sets as ``mean`` / ``std``.

    python scripts/image_statistics.py DIR [--workers N]

``DIR`` is a folder of class folders (``DIR/<class>/<image>``, e.g. ``tiny-imagenet-200/train``).
Every image is read as training reads it (``ssog.data.samples.checked_sample``: upright by its
EXIF orientation, greyscale converted to RGB) and counts by its pixels.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from ssog.data.folder import scan_image_folder
from ssog.data.samples import checked_sample


def _sums(paths: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-channel sums of pixel values and of their squares, and the pixel count, over ``paths``."""
    total, squares, count = np.zeros(3), np.zeros(3), 0
    for path in paths:
        image, _ = checked_sample(path, 0, channels=3, num_classes=1, where=path)
        pixels = np.asarray(image, dtype=np.float64).reshape(-1, 3) / 255.0
        total += pixels.sum(0)
        squares += (pixels * pixels).sum(0)
        count += len(pixels)
    return total, squares, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder of class folders (DIR/<class>/<image>)")
    parser.add_argument("--workers", type=int, default=2, help="processes reading images (default 2)")
    args = parser.parse_args()
    paths = [path for path, _ in scan_image_folder(args.folder).samples]
    if not paths:
        raise SystemExit(f"{args.folder} holds no images in class folders (DIR/<class>/<image>)")
    with ProcessPoolExecutor(args.workers) as pool:
        parts = list(pool.map(_sums, [paths[i::args.workers] for i in range(args.workers)]))
    total, squares, count = (sum(part[i] for part in parts) for i in range(3))
    mean = total / count
    std = np.sqrt(squares / count - mean * mean)
    print(f"{len(paths)} images, {count} pixels")
    print(f"mean: [{', '.join(f'{v:.4f}' for v in mean)}]")
    print(f"std: [{', '.join(f'{v:.4f}' for v in std)}]")


if __name__ == "__main__":
    main()
