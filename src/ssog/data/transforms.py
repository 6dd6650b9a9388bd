"""Augmentation levels of the paper's Table 15 (strong / moderate / weak), built from timm.

The paper names the levels but not their contents; ours follow the usual ViT-from-scratch
ladder. ``strong`` is the DeiT recipe (RandAugment m9, mixup 0.8 / cutmix 1.0, random
erasing 0.25), ``moderate`` halves its strength (RandAugment m5, mixup 0.2, erasing 0.1), and
``weak`` keeps only a mild random-resized crop and a flip. ``none`` is the evaluation
transform, for debugging and linear probes on fixed features.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from timm.data import create_transform

__all__ = ["Augmentation", "AUGMENTATIONS", "build_transform", "get_augmentation"]


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
