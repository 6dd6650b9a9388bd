"""The augmentation levels run on every image the loaders hand them, on the Pillow installed.

Pillow >= 13 refuses ``ImageOps.posterize`` with 0 bits, which timm's RandAugment asks for
now and then (``strong``: ``PosterizeIncreasing`` at magnitude 10); ssog.data.transforms
installs a posterize that maps 0 bits to black, as older Pillow did. Transforms only, no model.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import timm.data.auto_augment as timm_auto_augment
import torch
from PIL import Image, ImageOps

from ssog.data.images import to_rgb
from ssog.data.transforms import AUGMENTATIONS, POSTERIZE_OPS, build_transform, install_posterize, posterize
from ssog.train import recipe_variants, resolve_config

TABLE15 = "configs/ablations/table15_augmentation.yaml"
# Heights x widths from a single pixel to a photograph, both orientations.
SIZES = [(1, 1), (1, 7), (3, 5), (5, 3), (8, 8), (31, 47), (300, 500), (500, 300)]
# Modes the image files come in; the loaders turn each into RGB (to_rgb).
FILE_MODES = ["1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr", "I;16", "I", "F"]
CIFAR_MEAN, CIFAR_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


def _seed_everything(seed: int) -> None:
    """timm's transforms draw from Python's, NumPy's and torch's generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _file_image(mode: str, height: int, width: int, rng: np.random.Generator) -> Image.Image:
    """A random image in ``mode``, as a decoder could hand it to the loader."""
    rgba = Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8))
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 2**16, (height, width), dtype=np.uint16))
    if mode == "I":
        return Image.fromarray(rng.integers(0, 2**16, (height, width), dtype=np.int32))
    if mode == "F":
        return Image.fromarray(rng.random((height, width), dtype=np.float32))
    return rgba.convert(mode)


@pytest.fixture(scope="module")
def loader_images() -> list[Image.Image]:
    """What the loaders give the transforms: RGB from every file mode and size, black and white."""
    rng = np.random.default_rng(0)
    images = [to_rgb(_file_image(mode, h, w, rng)) for mode in FILE_MODES for h, w in SIZES]
    assert {image.mode for image in images} == {"RGB"}
    images += [Image.new("RGB", (w, h), colour) for h, w in SIZES[:3] for colour in ("black", "white")]
    return images


@pytest.fixture(scope="module")
def grey_images() -> list[Image.Image]:
    """Grey ``L`` images as the digits' ArrayDataset gives them (8x8), and other sizes."""
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)) for h, w in [(8, 8), *SIZES]]


def _check_runs(transform, images: list[Image.Image], shape: tuple[int, int, int]) -> None:
    for image in images:
        out = transform(image)
        assert out.shape == shape and torch.isfinite(out).all(), (image.mode, image.size, out.shape)


def test_posterize_ops_use_ours_and_installing_again_changes_nothing():
    install_posterize()
    install_posterize()
    assert all(timm_auto_augment.NAME_TO_OP[name] is posterize for name in POSTERIZE_OPS)
    assert timm_auto_augment.posterize is not posterize  # timm's own function stays timm's
    assert {name for name in timm_auto_augment.NAME_TO_OP if "osterize" in name} == set(POSTERIZE_OPS)


@pytest.mark.parametrize("name", POSTERIZE_OPS)
def test_posterize_ops_at_every_magnitude(name):
    """0 bits (PosterizeIncreasing at 10, Posterize below 2.5) gives black; other counts are timm's and Pillow's."""
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (5, 3, 3), dtype=np.uint8)),
              Image.fromarray(rng.integers(0, 256, (5, 3), dtype=np.uint8))]
    level_to_bits = timm_auto_augment.LEVEL_TO_ARG[name]
    seen_bits = set()
    for magnitude in np.arange(0, 10.25, 0.25):
        (bits,) = level_to_bits(magnitude, {})
        seen_bits.add(bits)
        op = timm_auto_augment.AugmentOp(name, prob=1.0, magnitude=float(magnitude))
        for image in images:
            out = op(image)
            assert out.mode == image.mode and out.size == image.size
            if bits == 0:
                assert not np.asarray(out).any()
            elif bits < 8:
                assert out.tobytes() == ImageOps.posterize(image, bits).tobytes()
            else:
                assert out.tobytes() == image.tobytes()
    assert (0 in seen_bits) == (name != "PosterizeOriginal")  # the case Pillow 13 refuses is exercised


def test_every_randaugment_op_at_every_magnitude_on_tiny_and_grey_images():
    """Each op timm's RandAugment / AutoAugment / AugMix can draw, on magnitudes 0..10, RGB and grey."""
    rng = np.random.default_rng(0)
    cases = []
    for h, w in [(1, 1), (3, 5), (17, 9)]:
        cases.append((Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)), (124, 116, 104)))
        cases.append((Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)), (128,)))
    _seed_everything(0)
    for name in timm_auto_augment.NAME_TO_OP:
        for magnitude in np.arange(0, 10.5, 0.5):
            for image, fill in cases:
                hparams = {"translate_const": 100, "img_mean": fill}
                op = timm_auto_augment.AugmentOp(name, prob=1.0, magnitude=float(magnitude), hparams=hparams)
                out = op(image)
                assert out.mode == image.mode and out.size == image.size, (name, magnitude, image.mode)


def test_strong_augmentation_survives_a_seeded_stream_that_posterizes_to_zero_bits():
    """3,000 small images through ``strong`` (seed 0 asks for 0 bits 7 times), as issue 28 met it."""
    transform = build_transform("strong", 8, CIFAR_MEAN, CIFAR_STD, train=True)
    (rand_augment,) = [t for t in transform.transforms if isinstance(t, timm_auto_augment.RandAugment)]
    bits_asked = []
    for op in rand_augment.ops:
        if op.name in POSTERIZE_OPS:
            def recording(img, bits, _posterize=op.aug_fn, **kwargs):
                bits_asked.append(bits)
                return _posterize(img, bits, **kwargs)
            op.aug_fn = recording
    _seed_everything(0)
    rng = np.random.default_rng(0)
    for _ in range(3000):
        out = transform(Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)))
        assert out.shape == (3, 8, 8)
    assert bits_asked.count(0) >= 1, bits_asked.count(0)


@pytest.mark.parametrize("level", sorted(AUGMENTATIONS))
def test_every_level_runs_on_every_loader_image(level, loader_images, grey_images):
    """CIFAR-sized RGB from every file mode and size, and the digits' grey with flips off."""
    for train in (True, False):
        _seed_everything(0)
        _check_runs(build_transform(level, 32, CIFAR_MEAN, CIFAR_STD, train=train), loader_images, (3, 32, 32))
        _check_runs(build_transform(level, 8, (0.5,), (0.5,), train=train, allow_hflip=False),
                    grey_images, (1, 8, 8))


def test_table15_variants_run_on_loader_images(loader_images):
    variants = recipe_variants(TABLE15)
    assert {resolve_config(TABLE15, v).augment for v in variants} == {"strong", "moderate", "weak"}
    images = loader_images[::3]  # 224 px: a third of them, every size and every mode still among them
    for variant in variants:
        cfg = resolve_config(TABLE15, variant)
        for train in (True, False):
            _seed_everything(0)
            transform = build_transform(cfg.augment, cfg.img_size, tuple(cfg.mean), tuple(cfg.std), train=train,
                                        crop_pct=cfg.crop_pct)
            _check_runs(transform, images, (3, cfg.img_size, cfg.img_size))
