"""Data sources, augmentation levels, restart-safe samplers, and errors for bad data folders."""
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from ssog.data import (
    AUGMENTATIONS, ArrayDataset, EpochSampler, ShardSampler, TransformedDataset, build_datasets,
    build_loader, build_transform, stratified_split,
)


def _image_tree(root, splits=("train", "val"), classes=("cat", "dog"), per_class=3, size=12):
    rng = np.random.default_rng(0)
    for split in splits:
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


# ---------------------------------------------------------------- digits (embedded default)
def test_digits_split_is_seeded_stratified_and_disjoint():
    train, val, info = build_datasets("digits", split_seed=0)
    assert (len(train), len(val)) == (1437, 360)
    assert (info.num_classes, info.in_chans, info.native_size, info.hflip) == (10, 1, 8, False)
    assert set(train.indices).isdisjoint(val.indices)
    val_counts = Counter(val.dataset.targets[i] for i in val.indices)
    assert min(val_counts.values()) >= 35 and max(val_counts.values()) <= 37  # 20% of ~180 per class
    again, _, _ = build_datasets("digits", split_seed=0)
    other, _, _ = build_datasets("digits", split_seed=1)
    assert again.indices == train.indices and other.indices != train.indices
    image, label = train[0]
    assert image.size == (8, 8) and image.mode == "L" and 0 <= label < 10


@pytest.mark.parametrize("bad", [0, 0.0, 1.0, 1797, -3, True, "0.2"])
def test_stratified_split_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="val_split"):
        stratified_split([0, 1] * 10, bad, seed=0)


def test_stratified_split_count_and_fraction():
    targets = [0] * 50 + [1] * 50
    train, val = stratified_split(targets, 10, seed=3)
    assert len(val) == 10 and sum(targets[i] for i in val) == 5 and sorted(train + val) == list(range(100))
    assert len(stratified_split(targets, 0.3, seed=3)[1]) == 30


def test_unknown_dataset_names_choices():
    with pytest.raises(ValueError, match="expected one of"):
        build_datasets("mnist")


def test_array_dataset_checks_its_input():
    with pytest.raises(ValueError, match="uint8"):
        ArrayDataset(np.zeros((2, 4, 4), np.float32), [0, 1])


# ---------------------------------------------------------------- folders and CIFAR: errors
def test_imagefolder_with_train_and_val(tmp_path):
    train, val, info = build_datasets("imagefolder", str(_image_tree(tmp_path)))
    assert (len(train), len(val), info.num_classes, info.classes) == (6, 6, 2, ("cat", "dog"))


def test_imagefolder_val_split_from_train(tmp_path):
    root = _image_tree(tmp_path, splits=("train",), per_class=5)
    train, val, _ = build_datasets("imagefolder", str(root), val_split=4, split_seed=0)
    assert (len(train), len(val)) == (6, 4)
    assert Counter(val.dataset.targets[i] for i in val.indices) == {0: 2, 1: 2}


def test_imagefolder_missing_folder_says_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*DIR/train/<class>"):
        build_datasets("imagefolder", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="needs data_dir"):
        build_datasets("imagefolder")


def test_imagefolder_wrong_split_names(tmp_path):
    root = _image_tree(tmp_path, splits=("training", "validation"))
    with pytest.raises(ValueError, match=r"no 'train' folder \(found folders: \['training', 'validation'\]\)"):
        build_datasets("imagefolder", str(root))


def test_imagefolder_without_val_needs_val_split(tmp_path):
    root = _image_tree(tmp_path, splits=("train",))
    with pytest.raises(ValueError, match="no 'val' folder.*val_split"):
        build_datasets("imagefolder", str(root))


def test_imagefolder_without_class_folders(tmp_path):
    (tmp_path / "train").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "train" / "loose.png")
    with pytest.raises(ValueError, match="no class folders"):
        build_datasets("imagefolder", str(tmp_path), val_split=0.5)


def test_imagefolder_class_folders_without_images(tmp_path):
    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match=r"class folder\(s\) cat of \S+ holds no image PIL reads"):
        build_datasets("imagefolder", str(tmp_path), val_split=0.5)


def test_imagefolder_val_classes_must_match(tmp_path):
    _image_tree(tmp_path, splits=("train",), classes=("cat", "dog"))
    _image_tree(tmp_path, splits=("val",), classes=("cat", "cow"))
    with pytest.raises(ValueError, match="differ"):
        build_datasets("imagefolder", str(tmp_path))


def test_cifar_missing_points_to_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-100-python.*--download"):
        build_datasets("cifar100", str(tmp_path))


# ---------------------------------------------------------------- transforms
@pytest.mark.parametrize("level", sorted(AUGMENTATIONS))
def test_every_level_gives_normalised_tensors(level):
    train, _, info = build_datasets("synthetic", synthetic_size=20, synthetic_img_size=16)
    transform = build_transform(level, 24, info.mean, info.std, train=True)
    image = TransformedDataset(train, transform, seed=0)[(0, 0)][0]
    assert image.shape == (3, 24, 24) and image.dtype == torch.float32


def test_unknown_augmentation_level():
    with pytest.raises(ValueError, match="augmentation level"):
        build_transform("extreme", 32, (0.5,), (0.5,), train=True)


def test_augmentation_depends_only_on_seed_epoch_and_index():
    train, _, info = build_datasets("synthetic", synthetic_size=20)
    transform = build_transform("strong", 32, info.mean, info.std, train=True)
    data = TransformedDataset(train, transform, seed=0)
    first = data[(2, 5)][0]
    torch.manual_seed(123)  # global RNG state must not matter ...
    assert torch.equal(data[(2, 5)][0], first)
    assert not torch.equal(data[(3, 5)][0], first)  # ... the epoch does
    state = torch.get_rng_state()
    data[(4, 5)]
    assert torch.equal(torch.get_rng_state(), state)  # and loading leaves the caller's RNG alone


# ---------------------------------------------------------------- samplers and loaders
def test_ranks_split_each_global_batch():
    data = list(range(23))
    single = EpochSampler(data, 1, 0, seed=7)
    ranks = [EpochSampler(data, 2, r, seed=7) for r in range(2)]
    for sampler in (single, *ranks):
        sampler.set_epoch(3)
    order = [i for _, i in single]
    per_rank = [[i for _, i in s] for s in ranks]
    batch = 4  # global; 2 per rank
    for k in range(len(order) // batch):
        union = set(per_rank[0][2 * k:2 * k + 2]) | set(per_rank[1][2 * k:2 * k + 2])
        assert union == set(order[k * batch:(k + 1) * batch])
    assert all(epoch == 3 for epoch, _ in single)


def test_epoch_sampler_resumes_mid_epoch():
    sampler = EpochSampler(list(range(10)), seed=1)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2, start=4)
    assert list(sampler) == full[4:] and len(sampler) == 6
    sampler.set_epoch(3)
    assert list(sampler) != full


def test_shard_sampler_covers_everything_once():
    shards = [list(ShardSampler(list(range(11)), 3, r)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(11))


def test_loader_batches_do_not_depend_on_workers():
    train, _, info = build_datasets("synthetic", synthetic_size=24)
    data = TransformedDataset(train, build_transform("strong", 32, info.mean, info.std, train=True), seed=0)
    batches = []
    for workers in (0, 2):
        loader = build_loader(data, 8, train=True, seed=0, num_workers=workers)
        loader.sampler.set_epoch(1, start=8)
        batches.append([x for x, _ in loader])
    assert len(batches[0]) == 2
    assert all(torch.equal(a, b) for a, b in zip(*batches))
