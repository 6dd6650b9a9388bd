"""Augmentation levels of the paper's Table 15 (strong / moderate / weak), built from timm.

The paper names the levels but not their contents; ours follow the usual ViT-from-scratch
ladder. ``strong`` is the DeiT recipe (RandAugment m9, mixup 0.8 / cutmix 1.0, random
erasing 0.25), ``moderate`` halves its strength (RandAugment m5, mixup 0.2, erasing 0.1), and
``weak`` keeps only a mild random-resized crop and a flip. ``none`` is the evaluation
transform, for debugging and linear probes on fixed features.

Importing this module makes timm's posterize ops accept the 0 bits their level maps can ask
for (:func:`posterize`), which Pillow >= 13 refuses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import timm.data.auto_augment as timm_auto_augment
from PIL import Image
from timm.data import create_transform

__all__ = [
    "Augmentation", "AUGMENTATIONS", "POSTERIZE_OPS", "build_transform", "get_augmentation", "install_posterize",
    "posterize",
]

#: timm's RandAugment / AutoAugment / AugMix op names (keys of ``NAME_TO_OP``) that posterize.
POSTERIZE_OPS = ("Posterize", "PosterizeIncreasing", "PosterizeOriginal")


def posterize(img: Image.Image, bits_to_keep: int, **kwargs) -> Image.Image:
    """timm's posterize (keep the ``bits_to_keep`` high bits of each channel), where keeping
    0 bits gives a black image of the same mode and size.

    timm's level maps ask for 0 bits: ``PosterizeIncreasing`` at magnitude 10, which
    ``rand-m9-mstd0.5-inc1`` (``strong``) draws for about 2% of its posterize ops, and
    ``Posterize`` below magnitude 2.5 (the ``v0`` AutoAugment policy). Pillow >= 13 refuses
    bits outside 1..8 ("bits must be between or equal to 1 and 8"); older Pillow masked every
    bit away and returned black, as TF's TPU posterize (timm's ``v0`` notes it) and
    torchvision's tensor posterize do. We keep that meaning, for the negative counts a
    ``magnitude_max`` above 10 gives too, rather than raising 0 to 1 bit (the nearest op
    Pillow 13 accepts), so that a recipe augments the same on every Pillow. Other bit counts
    go to timm's own posterize unchanged.
    """
    if bits_to_keep < 1:
        return Image.new(img.mode, img.size)
    return timm_auto_augment.posterize(img, bits_to_keep, **kwargs)


def install_posterize() -> None:
    """Make timm's posterize ops use :func:`posterize` (idempotent; runs on import of this module).

    timm's ``AugmentOp`` looks its function up in ``NAME_TO_OP`` when it is built, so every
    RandAugment / AutoAugment / AugMix transform built afterwards, by ssog or by timm's own
    ``train.py`` (``--device-modules ssog.data.transforms``), gets it.
    """
    for name in POSTERIZE_OPS:
        timm_auto_augment.NAME_TO_OP[name] = posterize


install_posterize()


@dataclass(frozen=True)
class Augmentation:
    """One augmentation level.

    ``scale`` is the random-resized-crop area range (``None``: no crop), ``hflip`` the flip
    probability, ``auto_augment`` a timm RandAugment string, ``re_prob`` the random-erasing
    probability; ``mixup`` / ``cutmix`` are the Beta alphas used by the training engine
    (0 disables them).
    """

    scale: tuple[float, float] | None
    hflip: float
    auto_augment: str | None
    re_prob: float
    mixup: float
    cutmix: float


AUGMENTATIONS: dict[str, Augmentation] = {
    "strong": Augmentation((0.08, 1.0), 0.5, "rand-m9-mstd0.5-inc1", 0.25, 0.8, 1.0),
    "moderate": Augmentation((0.25, 1.0), 0.5, "rand-m5-mstd0.5-inc1", 0.1, 0.2, 0.0),
    "weak": Augmentation((0.6, 1.0), 0.5, None, 0.0, 0.0, 0.0),
    "none": Augmentation(None, 0.0, None, 0.0, 0.0, 0.0),
}


def get_augmentation(level: str) -> Augmentation:
    if level not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation level {level!r}; expected one of {sorted(AUGMENTATIONS)}")
    return AUGMENTATIONS[level]


def build_transform(
    level: str,
    img_size: int | tuple[int, int],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    *,
    train: bool,
    crop_pct: float = 1.0,
    interpolation: str = "bicubic",
    allow_hflip: bool = True,
) -> Callable:
    """The transform from a PIL image to a normalised ``(C, H, W)`` tensor (``img_size`` is
    the side in pixels, or ``(H, W)``).

    ``train=False`` gives the evaluation transform (resize to ``img_size / crop_pct`` with
    ``interpolation``, centre crop), whatever the level. ``allow_hflip=False`` disables flips
    for data where they change the class (digits).
    """
    aug = get_augmentation(level)
    if not train or aug.scale is None:
        return create_transform(img_size, is_training=False, interpolation=interpolation,
                                mean=mean, std=std, crop_pct=crop_pct)
    return create_transform(
        img_size,
        is_training=True,
        scale=aug.scale,
        hflip=aug.hflip if allow_hflip else 0.0,
        color_jitter=0.0,
        auto_augment=aug.auto_augment,
        interpolation=interpolation,
        mean=mean,
        std=std,
        re_prob=aug.re_prob,
        re_mode="pixel",
    )
