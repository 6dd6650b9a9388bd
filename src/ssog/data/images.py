"""Image files: decoding upright (EXIF orientation) to 8-bit grey or RGB by what a pixel mode
means (:func:`decode_image`, :func:`to_channels`, :func:`to_rgb`), and cheap checks of a file
before training reads it (:func:`image_problem`).
"""
from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import ExifTags, Image, ImageOps

__all__ = [
    "JPEG_TAIL_BYTES", "GREY_MODES", "image_problem", "unreadable_images", "load_image", "decode_image",
    "to_channels", "to_rgb", "readable_extensions",
]

#: PIL modes of grey images (one channel of levels, with or without alpha).
GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
#: A JPEG's end-of-image marker is looked for this close to the end of the file (some
#: writers append a few bytes after it); entropy-coded data never contains the marker.
JPEG_TAIL_BYTES = 1024
_CHECK_THREADS = 16


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
            handle.seek(max(0, Path(path).stat().st_size - JPEG_TAIL_BYTES))
            if b"\xff\xd9" not in handle.read():
                return "truncated JPEG (no end-of-image marker)"
    return None


def unreadable_images(paths: Sequence[str | Path]) -> list[tuple[str, str]]:
    """``(path, reason)`` of every file of ``paths`` that :func:`image_problem` rejects, in order."""
    with ThreadPoolExecutor(max_workers=_CHECK_THREADS) as pool:  # file reads: threads overlap them
        problems = list(pool.map(image_problem, paths))
    return [(str(path), problem) for path, problem in zip(paths, problems) if problem is not None]


def load_image(path: str | Path) -> Image.Image:
    """The image file at ``path`` as :func:`decode_image` gives it in RGB, with the file named
    when decoding fails."""
    try:
        return decode_image(path)
    except Exception as error:
        raise ValueError(f"cannot decode image {path} ({type(error).__name__}: {error}); "
                         "remove or replace the file") from error


def decode_image(source: Image.Image | bytes | str | Path, channels: int = 3) -> Image.Image:
    """An image (a file's path or bytes, or a PIL image) decoded now, turned upright by its
    EXIF orientation (a camera's portrait JPEG stored sideways; PIL's ``exif_transpose``) and
    converted to ``channels`` (:func:`to_channels`). PIL's errors pass through."""
    if isinstance(source, Image.Image):
        return to_channels(_upright(source), channels)
    with Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source) as image:
        return to_channels(_upright(image), channels)  # a new image, decoded: the file can close


def _upright(image: Image.Image) -> Image.Image:
    """``image`` turned by its EXIF orientation tag (as is when it has none, without a copy)."""
    if image.getexif().get(ExifTags.Base.Orientation, 1) in (0, 1):
        return image
    return ImageOps.exif_transpose(image)


def to_channels(image: Image.Image, channels: int) -> Image.Image:
    """``image`` as a new 8-bit image of ``channels``: 3, RGB by :func:`to_rgb`; 1, grey (``L``):
    grey modes keep their levels (scaled as :func:`to_rgb` scales them, alpha dropped) and
    colour becomes its luma (PIL's ``convert("L")``, ITU-R 601)."""
    if channels == 3:
        return to_rgb(image)
    if channels != 1:
        raise ValueError(f"images are read with 1 (grey) or 3 (RGB) channels, not {channels}")
    return image.convert("L") if image.mode in ("1", "L", "LA", "La") else to_rgb(image).convert("L")


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
    if tags is not None and bits:
        bits = int(bits[0] if isinstance(bits, tuple) else bits)
        sample_format = tags.get(339, 1)  # 1 unsigned, 2 signed
        signed = (sample_format[0] if isinstance(sample_format, tuple) else sample_format) == 2
        return 2 ** (bits - 1) - 1 if signed else 2**bits - 1
    return 2**16 - 1 if not values.size or values.max() <= 2**16 - 1 else 2**32 - 1


def _grey_rgb(levels: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(np.rint(levels), 0, 255).astype(np.uint8), "L").convert("RGB")


def readable_extensions() -> frozenset[str]:
    """File extensions (lower case, with the dot) of the formats PIL reads itself; EPS is left
    out (it needs Ghostscript, an outside program, to decode)."""
    Image.init()
    return frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN and fmt != "EPS")
