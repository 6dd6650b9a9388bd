"""Augmentation levels of the paper's Table 15 (strong / moderate / weak), built from timm.

The paper names the levels but not their contents; ours follow the usual ViT-from-scratch
ladder. ``strong`` is the DeiT recipe (RandAugment m9, mixup 0.8 / cutmix 1.0, random
erasing 0.25), ``moderate`` halves its strength (RandAugment m5, mixup 0.2, erasing 0.1), and
``weak`` keeps only a mild random-resized crop and a flip. ``none`` is the evaluation
transform, for debugging and linear probes on fixed features.

A run can change a level's transform with :data:`TRANSFORM_SETTINGS`, timm's
``create_transform`` arguments under timm's train.py names (``auto_augment``, ``re_prob``,
``scale``, ``ratio``, ``hflip``, ``color_jitter``, ``train_interpolation``):
:func:`configure_augmentation`.

Importing this module makes timm's posterize ops accept the 0 bits their level maps can ask
for (:func:`posterize`), which Pillow >= 13 refuses.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import timm.data.auto_augment as timm_auto_augment
from PIL import Image
from timm.data import create_transform

from ssog.data.data_config import INTERPOLATIONS

__all__ = [
    "Augmentation", "AUGMENTATIONS", "POSTERIZE_OPS", "NO_AUTO_AUGMENT", "TIMM_TRAIN_DEFAULT", "TRAIN_INTERPOLATIONS",
    "TRANSFORM_SETTINGS", "build_transform", "configure_augmentation", "get_augmentation", "install_posterize",
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

    ``scale`` is the random-resized-crop area range (``None``: no crop, the evaluation
    transform), ``ratio`` its aspect-ratio range (``None``: timm's 3/4 to 4/3), ``hflip`` the
    flip probability, ``auto_augment`` a timm RandAugment / AutoAugment / AugMix string,
    ``re_prob`` the random-erasing probability, ``color_jitter`` the brightness, contrast and
    saturation jitter (timm leaves it out under ``auto_augment``), ``train_interpolation`` the
    crop's resize filter (``None``: the data config's; ``random``: bilinear or bicubic, drawn
    per image); ``mixup`` / ``cutmix`` are the Beta alphas used by the training engine (0
    disables them).
    """

    scale: tuple[float, float] | None
    hflip: float
    auto_augment: str | None
    re_prob: float
    mixup: float
    cutmix: float
    ratio: tuple[float, float] | None = None
    color_jitter: float = 0.0
    train_interpolation: str | None = None


AUGMENTATIONS: dict[str, Augmentation] = {
    "strong": Augmentation((0.08, 1.0), 0.5, "rand-m9-mstd0.5-inc1", 0.25, 0.8, 1.0),
    "moderate": Augmentation((0.25, 1.0), 0.5, "rand-m5-mstd0.5-inc1", 0.1, 0.2, 0.0),
    "weak": Augmentation((0.6, 1.0), 0.5, None, 0.0, 0.0, 0.0),
    "none": Augmentation(None, 0.0, None, 0.0, 0.0, 0.0),
}


#: timm's train.py's training transform with none of its augmentation flags given: a
#: random-resized crop of 8-100% (aspect 3/4-4/3), flips at 0.5, colour jitter 0.4, a random
#: bilinear or bicubic filter. The ``none`` level with any :data:`TRANSFORM_SETTINGS` starts
#: from it, as ``train.py --aa ...`` does, rather than from the evaluation transform.
TIMM_TRAIN_DEFAULT = Augmentation((0.08, 1.0), 0.5, None, 0.0, 0.0, 0.0, color_jitter=0.4,
                                  train_interpolation="random")

#: The fields of :class:`Augmentation` a run may set over its level's (``None``: the level's),
#: named as timm's train.py names them (``--aa``, ``--reprob``, ... set them on the command line).
TRANSFORM_SETTINGS = ("auto_augment", "re_prob", "scale", "ratio", "hflip", "color_jitter", "train_interpolation")
#: Training resize filters: timm's by name, and ``random`` (bilinear or bicubic per image).
TRAIN_INTERPOLATIONS = (*INTERPOLATIONS, "random")
#: ``auto_augment`` of a run that turns its level's RandAugment off.
NO_AUTO_AUGMENT = "none"


def get_augmentation(level: str) -> Augmentation:
    if level not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation level {level!r}; expected one of {sorted(AUGMENTATIONS)}")
    return AUGMENTATIONS[level]


def configure_augmentation(level: str, **settings: Any) -> Augmentation:
    """The augmentation ``level`` with ``settings`` (:data:`TRANSFORM_SETTINGS`; ``None``: the
    level's value) in place of its own: ``scale`` / ``ratio`` as two numbers (area fractions,
    width / height), probabilities in [0, 1], ``auto_augment="none"`` to turn the level's off.

    The ``none`` level (the evaluation transform, with no crop to change) given any setting
    starts from :data:`TIMM_TRAIN_DEFAULT`, timm's ``train.py`` training transform, as
    ``train.py --aa ...`` alone does. Raises ValueError naming the setting for a value timm
    would refuse or misread.
    """
    aug = get_augmentation(level)
    given = {name: value for name, value in settings.items() if value is not None}
    unknown = sorted(set(given) - set(TRANSFORM_SETTINGS))
    if unknown:
        raise ValueError(f"unknown augmentation settings {unknown}; known: {', '.join(TRANSFORM_SETTINGS)}")
    if not given:
        return aug
    if aug.scale is None:
        aug = TIMM_TRAIN_DEFAULT
    for name in ("scale", "ratio"):
        if name in given:
            given[name] = _range(name, given[name], upper=1.0 if name == "scale" else math.inf)
    for name, upper in (("re_prob", 1.0), ("hflip", 1.0), ("color_jitter", math.inf)):
        value = given.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= upper:
            raise ValueError(f"{name} must be a number from 0 to {upper}, got {value!r}")
    if given.get("train_interpolation", "random") not in TRAIN_INTERPOLATIONS:
        raise ValueError(f"train_interpolation must be one of {', '.join(TRAIN_INTERPOLATIONS)}, got "
                         f"{given['train_interpolation']!r}")
    if "auto_augment" in given:
        given["auto_augment"] = _auto_augment(given["auto_augment"])
    return dataclasses.replace(aug, **given)


def _range(name: str, value: Any, upper: float) -> tuple[float, float]:
    """``value`` as a ``(low, high)`` pair with ``0 < low <= high <= upper``."""
    numbers = value if isinstance(value, (list, tuple)) else [value]
    if (len(numbers) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers)
            or not 0 < numbers[0] <= numbers[1] <= upper):
        bound = f" <= {upper}" if upper < math.inf else ""
        raise ValueError(f"{name} must be two numbers low, high with 0 < low <= high{bound}, got {value!r}")
    return float(numbers[0]), float(numbers[1])


def _auto_augment(spec: Any) -> str | None:
    """A timm auto-augment string checked by building it (``none``: None)."""
    if not isinstance(spec, str):
        raise ValueError(f"auto_augment must be a string such as rand-m9-mstd0.5-inc1, got {spec!r}")
    if spec == NO_AUTO_AUGMENT:
        return None
    name, *sections = spec.split("-")
    if name in ("rand", "augmix"):  # timm skips a section it cannot read; ssog says so
        unread = [section for section in sections if not re.fullmatch(r"[a-z]+\d[\d.]*", section)
                  and not (name == "rand" and len(section) > 1 and section.startswith("t"))]
        if unread:
            raise ValueError(f"auto_augment {spec!r}: {', '.join(map(repr, unread))} is not a section timm reads "
                             "(a key and a number: m9, n2, mstd0.5, inc1, w4)")
    try:
        create_transform(8, is_training=True, auto_augment=spec)
    except (AssertionError, ValueError, KeyError, IndexError) as error:
        raise ValueError(f"auto_augment {spec!r} is not a timm RandAugment (rand-m9-mstd0.5-inc1), AugMix "
                         f"(augmix-m5-w4) or AutoAugment (original, v0, 3a) string ({error or 'unknown'})") from None
    return spec


def build_transform(
    level: str | Augmentation,
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

    ``level``: a level's name, or an :class:`Augmentation` (:func:`configure_augmentation`).
    ``train=False`` gives the evaluation transform (resize to ``img_size / crop_pct`` with
    ``interpolation``, centre crop), whatever the level. ``allow_hflip=False`` disables flips
    for data where they change the class (digits).
    """
    aug = level if isinstance(level, Augmentation) else get_augmentation(level)
    if not train or aug.scale is None:
        return create_transform(img_size, is_training=False, interpolation=interpolation,
                                mean=mean, std=std, crop_pct=crop_pct)
    return create_transform(
        img_size,
        is_training=True,
        scale=aug.scale,
        ratio=aug.ratio,
        hflip=aug.hflip if allow_hflip else 0.0,
        color_jitter=aug.color_jitter,
        auto_augment=aug.auto_augment,
        interpolation=aug.train_interpolation or interpolation,
        mean=mean,
        std=std,
        re_prob=aug.re_prob,
        re_mode="pixel",
    )
