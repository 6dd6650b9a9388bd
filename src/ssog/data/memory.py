"""A small-image data set decoded once into memory and augmented on tensors, a batch at a time.

For data that fits in memory (CIFAR, Tiny-ImageNet), decoding every image every epoch and
augmenting it with PIL, one image at a time in loader workers, takes a large share of a small
model's CPU (docs/results/training_speed.md). :class:`MemoryImages` keeps the images as one uint8 tensor
``(N, C, H, W)`` and serves whole batches through the loader's ``__getitems__``, so no
worker process is needed:

* evaluation images are stored after the run's evaluation transform (timm's, resize and
  centre crop, in PIL), so they are the very pixels the file path gives, and are only
  normalised per batch;
* training images are stored as decoded and cropped per batch by :class:`TensorCrop`: timm's
  random-resized crop (its own parameter draw) and flip, resampled for the whole batch with
  one ``grid_sample``.

Augmentation randomness is a function of ``(seed, epoch, sample index)`` only, as in
:class:`~ssog.data.loader.TransformedDataset`, so a resumed run sees the same images as an
uninterrupted one.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from timm.data import create_transform
from timm.data.transforms import RandomResizedCropAndInterpolation
from torch.utils.data import Dataset

from ssog.data.loader import StopSafeDataLoader, TransformedDataset, sample_seed
from ssog.data.transforms import Augmentation

__all__ = ["TENSOR_INTERPOLATIONS", "TensorCrop", "MemoryImages", "decode_images", "tensor_crop", "memory_datasets"]

#: Resize filters a batch can be resampled with (``grid_sample``'s modes), and ``random``.
TENSOR_INTERPOLATIONS = ("bicubic", "bilinear", "nearest")


@dataclass(frozen=True)
class TensorCrop:
    """timm's training crop on tensors: a random-resized crop of ``scale`` (area fraction) and
    ``ratio`` (width / height) resampled to ``size`` ``(H, W)`` pixels with ``interpolation``
    (``random``: bilinear or bicubic per image), then a horizontal flip with probability
    ``hflip``."""

    size: tuple[int, int]
    scale: tuple[float, float]
    ratio: tuple[float, float]
    hflip: float
    interpolation: str

    def draw(self, height: int, width: int, seed: int) -> tuple[int, int, int, int, bool, str]:
        """One image's ``(top, left, crop height, crop width, flip, filter)``: what timm's
        transform draws for it under :func:`~ssog.data.loader.seeded_rngs` ``(seed)`` on the file
        path (the box and filter from python's ``random``, the flip from torch's generator).

        timm's ``RandomResizedCropAndInterpolation.get_params`` draws from the global ``random``
        module: it is seeded for this image during the call and restored after it."""
        global_random = random.getstate()
        random.seed(seed)
        try:
            top, left, crop_h, crop_w = RandomResizedCropAndInterpolation.get_params(
                torch.empty(0, height, width), self.scale, self.ratio)
            interpolation = random.choice(("bilinear", "bicubic")) if self.interpolation == "random" \
                else self.interpolation
        finally:
            random.setstate(global_random)
        flip = bool(torch.rand(1, generator=torch.Generator().manual_seed(seed)) < self.hflip)
        return top, left, crop_h, crop_w, flip, interpolation

    def __call__(self, images: torch.Tensor, seeds: Sequence[int]) -> torch.Tensor:
        """``images`` uint8 ``(B, C, H, W)``, one seed per image -> float ``(B, C, *size)`` with
        values in [0, 255], rounded as PIL's uint8 output is."""
        batch, channels, height, width = images.shape
        draws = [self.draw(height, width, seed) for seed in seeds]
        # Normalised coordinates (align_corners=False): -1 and 1 are the image's outer pixel edges.
        theta = torch.tensor([[[(-crop_w if flip else crop_w) / width, 0.0, (2 * left + crop_w) / width - 1],
                               [0.0, crop_h / height, (2 * top + crop_h) / height - 1]]
                              for top, left, crop_h, crop_w, flip, _ in draws])
        out = torch.empty(batch, channels, *self.size)
        source = images.float()
        for mode in {draw[-1] for draw in draws}:
            rows = torch.tensor([i for i, draw in enumerate(draws) if draw[-1] == mode])
            grid = F.affine_grid(theta[rows], [len(rows), channels, *self.size], align_corners=False)
            out[rows] = F.grid_sample(source[rows], grid, mode=mode, padding_mode="border", align_corners=False)
        return out.clamp_(0, 255).round_()


def tensor_crop(aug: Augmentation, size: tuple[int, int], interpolation: str,
                allow_hflip: bool = True) -> TensorCrop | None:
    """The :class:`TensorCrop` of augmentation ``aug`` at ``size`` (None for a level without a
    crop: the evaluation transform), or a ValueError naming what only the file path can do."""
    if aug.scale is None:
        return None
    unsupported = [name for name, value in (("auto_augment", aug.auto_augment), ("re_prob", aug.re_prob),
                                            ("color_jitter", aug.color_jitter)) if value]
    if unsupported:
        raise ValueError(f"data_in_memory augments with crops and flips only, but the run sets "
                         f"{', '.join(unsupported)}; turn data_in_memory off (the file path applies every "
                         "timm transform) or drop them")
    filter_ = aug.train_interpolation or interpolation
    if filter_ not in (*TENSOR_INTERPOLATIONS, "random"):
        raise ValueError(f"data_in_memory resamples with {', '.join(TENSOR_INTERPOLATIONS)} or random, not "
                         f"{filter_!r} (train_interpolation / interpolation); choose one of them or turn "
                         "data_in_memory off")
    ratio = aug.ratio or (3 / 4, 4 / 3)
    return TensorCrop((*size,), (*aug.scale,), (*ratio,), aug.hflip if allow_hflip else 0.0, filter_)


def _as_uint8_chw(image) -> torch.Tensor:
    """A PIL image, or timm's uint8 ``(C, H, W)`` tensor (its transforms with ``use_prefetcher``),
    as a uint8 ``(C, H, W)`` tensor."""
    pixels = image if isinstance(image, torch.Tensor) else torch.from_numpy(np.array(image))
    if pixels.dtype != torch.uint8:
        raise ValueError(f"data_in_memory stores 8-bit images, got pixels of type {pixels.dtype}")
    if pixels.ndim == 2:
        return pixels.unsqueeze(0)
    return pixels if isinstance(image, torch.Tensor) else pixels.permute(2, 0, 1).contiguous()


def _as_arrays(batch: list[tuple[torch.Tensor, int]]) -> list[tuple[np.ndarray, int]]:
    """A loader worker's batch with numpy images: pickled whole, where tensors would each pass
    a file descriptor to the training process (and run out of them)."""
    return [(image.numpy(), target) for image, target in batch]


def decode_images(dataset: Dataset, transform: Callable | None = None, num_workers: int = 0,
                  where: str = "data set") -> tuple[torch.Tensor, torch.Tensor]:
    """Every image of ``dataset`` (PIL images and class indices) after ``transform`` (None:
    as decoded), as uint8 ``(N, C, H, W)`` and int64 targets ``(N,)``; decoded by
    ``num_workers`` loader processes. Images of different sizes are a ValueError naming two."""
    items = TransformedDataset(dataset, lambda image: _as_uint8_chw(transform(image) if transform else image))
    loader = StopSafeDataLoader(items, batch_size=256, num_workers=num_workers, collate_fn=_as_arrays)
    images: list[torch.Tensor] = []
    targets: list[int] = []
    for batch in loader:
        images.extend(torch.from_numpy(image) for image, _ in batch)
        targets.extend(target for _, target in batch)
    shapes: dict[tuple[int, ...], int] = {}  # each size's first sample
    for index, image in enumerate(images):
        shapes.setdefault(tuple(image.shape), index)
    if len(shapes) > 1:
        (first, i), (second, j) = list(shapes.items())[:2]
        raise ValueError(f"data_in_memory needs images of one size, but the {where} holds {first[1]}x{first[2]} "
                         f"(sample {i}) and {second[1]}x{second[2]} (sample {j}) images; turn data_in_memory off")
    return torch.stack(images), torch.tensor(targets, dtype=torch.int64)


class MemoryImages(Dataset):
    """Decoded images ``images`` (uint8 ``(N, C, H, W)``) and ``targets`` served normalised by
    ``mean`` / ``std`` (per channel, pixel values in [0, 1]).

    Indexed like :class:`~ssog.data.loader.TransformedDataset`: by ``index``, or by ``(epoch,
    index)`` for training, where ``crop`` (a :class:`TensorCrop`) augments each image under
    the seed :func:`~ssog.data.loader.sample_seed` ``(seed, epoch, index)`` gives. A loader
    fetches a whole batch through :meth:`__getitems__`.
    """

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, mean: Sequence[float], std: Sequence[float],
                 crop: TensorCrop | None = None, seed: int = 0):
        self.images, self.targets = images, targets
        channels = images.shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32).expand(channels).reshape(1, channels, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).expand(channels).reshape(1, channels, 1, 1)
        self.crop, self.seed = crop, seed

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[int | tuple[int, int]]) -> list[tuple[torch.Tensor, int]]:
        pairs = [key if isinstance(key, tuple) else (0, key) for key in keys]
        indices = torch.tensor([index for _, index in pairs])
        images = self.images[indices]
        if self.crop is not None:
            pixels = self.crop(images, [sample_seed(self.seed, epoch, index) for epoch, index in pairs])
        else:
            pixels = images.to(torch.float32)
        batch = pixels.div_(255).sub_(self.mean).div_(self.std)  # torchvision's ToTensor and Normalize
        targets = self.targets[indices].tolist()
        return list(zip(batch.unbind(0), targets))


def memory_datasets(train: Dataset, val: Dataset, data_config: dict, aug: Augmentation, *, seed: int,
                    allow_hflip: bool = True, num_workers: int = 0) -> tuple[MemoryImages, MemoryImages]:
    """``train`` and ``val`` (map-style sources of PIL images) decoded into :class:`MemoryImages`:
    the training images as decoded, cropped per batch by ``aug``'s :func:`tensor_crop`; the
    validation images through timm's evaluation transform of ``data_config`` (``input_size``,
    ``crop_pct``, ``interpolation``, ``mean``, ``std``)."""
    size = tuple(data_config["input_size"][1:])
    crop = tensor_crop(aug, size, data_config["interpolation"], allow_hflip)
    eval_pixels = create_transform(size, is_training=False, interpolation=data_config["interpolation"],
                                   crop_pct=data_config["crop_pct"], use_prefetcher=True)  # PIL -> uint8 (C, H, W)
    train_images, train_targets = decode_images(train, None if crop else eval_pixels, num_workers, "training set")
    val_images, val_targets = decode_images(val, eval_pixels, num_workers, "validation set")
    mean, std = data_config["mean"], data_config["std"]
    return (MemoryImages(train_images, train_targets, mean, std, crop, seed),
            MemoryImages(val_images, val_targets, mean, std))

