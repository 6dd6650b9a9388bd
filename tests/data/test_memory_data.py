"""The in-memory data path (``data_in_memory``, ssog.data.memory): the same evaluation pixels as
the file path, timm's crop drawn per image and resampled on tensors, exact resume, refusals."""
import random

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image
from timm.data.transforms import RandomResizedCropAndInterpolation

from support import crash_after_save, run_history
from ssog.data import TransformedDataset, build_transform, get_augmentation
from ssog.data.builtin import ArrayDataset
from ssog.data.memory import MemoryImages, TensorCrop, memory_datasets, tensor_crop
from ssog.train import train

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def _smooth_images(count: int, side: int) -> np.ndarray:
    """uint8 ``(count, side, side, 3)`` images of smooth gradients (resampling filters agree on them)."""
    y, x = np.mgrid[0:side, 0:side] / (side - 1)
    phases = np.random.default_rng(0).uniform(0, 2 * np.pi, size=(count, 1, 1, 3))
    return (127.5 + 100 * np.sin(2.5 * x[None, :, :, None] + 1.5 * y[None, :, :, None] + phases)).astype(np.uint8)


def test_tensor_crop_draws_timms_box_and_keeps_pixels_it_does_not_resample():
    crop = TensorCrop((16, 16), (0.3, 1.0), (3 / 4, 4 / 3), 0.5, "bicubic")
    for seed in range(20):
        random.seed(seed)
        assert crop.draw(16, 16, seed)[:4] == \
            RandomResizedCropAndInterpolation.get_params(torch.empty(0, 16, 16), (0.3, 1.0), (3 / 4, 4 / 3))
    images = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    whole = TensorCrop((16, 16), (1.0, 1.0), (1.0, 1.0), 0.0, "bicubic")
    assert torch.equal(whole(images, [1, 2, 3]), images.float())
    flipped = TensorCrop((16, 16), (1.0, 1.0), (1.0, 1.0), 1.0, "bilinear")
    assert torch.equal(flipped(images, [1, 2, 3]), images.float().flip(-1))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_tensor_crop_resamples_the_box_as_pil_does(mode):
    """Bilinear within rounding; bicubic within a level (torch's cubic is a = -0.75, PIL's -0.5)."""
    image = _smooth_images(1, 24)[0]
    crop = TensorCrop((24, 24), (0.3, 1.0), (3 / 4, 4 / 3), 0.0, mode)
    pil_mode = TF.InterpolationMode.BILINEAR if mode == "bilinear" else TF.InterpolationMode.BICUBIC
    tensor = torch.from_numpy(image).permute(2, 0, 1)[None]
    for seed in range(10):
        top, left, height, width, _, _ = crop.draw(24, 24, seed)
        reference = np.asarray(TF.resized_crop(Image.fromarray(image), top, left, height, width, [24, 24], pil_mode))
        ours = crop(tensor, [seed])[0].permute(1, 2, 0).numpy()
        assert np.abs(ours - reference).mean() < (0.5 if mode == "bilinear" else 1.0)


@pytest.mark.parametrize("size, crop_pct", [(12, 1.0), (16, 0.875)])
def test_evaluation_images_are_the_file_paths_pixels(size, crop_pct):
    images = np.random.default_rng(1).integers(0, 256, size=(10, 12, 12, 3), dtype=np.uint8)
    dataset = ArrayDataset(images, list(range(10)))
    config = {"input_size": (3, size, size), "crop_pct": crop_pct, "interpolation": "bicubic", "mean": MEAN,
              "std": STD}
    _, val = memory_datasets(dataset, dataset, config, get_augmentation("weak"), seed=0)
    files = TransformedDataset(dataset, build_transform("none", size, MEAN, STD, train=False, crop_pct=crop_pct,
                                                        interpolation="bicubic"))
    for index in range(10):
        assert torch.equal(val[index][0], files[index][0])
        assert val[index][1] == files[index][1]


def test_training_images_are_the_file_paths_crops_and_flips():
    """The same boxes and flips as timm's PIL transform on the file path (resampled by torch:
    within rounding with the bilinear filter)."""
    dataset = ArrayDataset(_smooth_images(16, 16), list(range(16)))
    config = {"input_size": (3, 16, 16), "crop_pct": 1.0, "interpolation": "bilinear", "mean": MEAN, "std": STD}
    train_set, _ = memory_datasets(dataset, dataset, config, get_augmentation("weak"), seed=5)
    files = TransformedDataset(dataset, build_transform("weak", 16, MEAN, STD, train=True, interpolation="bilinear"),
                               seed=5)
    std = torch.tensor(STD).reshape(3, 1, 1)
    for index in range(16):
        ours, theirs = train_set[(2, index)][0], files[(2, index)][0]
        assert ((ours - theirs) * std * 255).abs().mean() < 0.5, index


def test_training_images_depend_on_seed_epoch_and_index_alone():
    dataset = ArrayDataset(_smooth_images(12, 16), list(range(12)))
    config = {"input_size": (3, 16, 16), "crop_pct": 1.0, "interpolation": "bicubic", "mean": MEAN, "std": STD}
    train_set, _ = memory_datasets(dataset, dataset, config, get_augmentation("weak"), seed=3)
    keys = [(1, index) for index in range(12)]
    whole = train_set.__getitems__(keys)
    reordered = train_set.__getitems__(keys[::-1]) + train_set.__getitems__(keys[:2])
    for (image, target), (again, again_target) in zip(whole, reordered[::-1][2:] + reordered[12:]):
        assert torch.equal(image, again) and target == again_target
    other_epoch = train_set.__getitems__([(2, index) for index in range(12)])
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(whole, other_epoch))
    assert isinstance(train_set, MemoryImages) and whole[0][0].shape == (3, 16, 16)


def test_the_in_memory_path_refuses_what_it_cannot_apply():
    with pytest.raises(ValueError, match="data_in_memory augments with crops and flips only, but the run sets "
                                         "auto_augment, re_prob"):
        tensor_crop(get_augmentation("strong"), (8, 8), "bicubic")
    with pytest.raises(ValueError, match="resamples with bicubic, bilinear, nearest or random, not 'lanczos'"):
        tensor_crop(get_augmentation("weak"), (8, 8), "lanczos")
    mixed = [(Image.new("RGB", (8, 8)), 0), (Image.new("RGB", (8, 8)), 0), (Image.new("RGB", (8, 6)), 1),
             (Image.new("RGB", (8, 6)), 1)]
    config = {"input_size": (3, 8, 8), "crop_pct": 1.0, "interpolation": "bicubic", "mean": MEAN, "std": STD}
    with pytest.raises(ValueError, match=r"needs images of one size, but the training set holds 8x8 \(sample 0\) "
                                         r"and 6x8 \(sample 2\)"):
        memory_datasets(mixed, mixed, config, get_augmentation("weak"), seed=0)


def test_a_run_in_memory_resumes_exactly_and_logs_where_its_cpu_went(tmp_path, monkeypatch, tiny_config):
    options = dict(epochs=2, augment="weak", data_in_memory=True, checkpoint_every=2)
    reference = train(tiny_config(tmp_path / "ref", **options))
    crash_after_save(monkeypatch, 6)  # mid-epoch 2 (4 steps per epoch)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(tmp_path / "run", **options))
    monkeypatch.undo()
    resumed = train(resume=tmp_path / "run")
    for key in ("acc1", "loss", "train_loss", "steps"):
        assert resumed[key] == reference[key], key
    history = run_history(tmp_path / "ref")
    for record in history:
        assert set(record["cpu_s"]) == {"step", "loading", "evaluation"}
        assert record["cpu_s"]["step"] > 0 and min(record["cpu_s"].values()) >= 0
