"""Data sources, augmentation levels, restart-safe samplers, and errors for bad data folders."""
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from support import image_tree
from ssog.data import (
    AUGMENTATIONS, ArrayDataset, EpochSampler, ShardSampler, TransformedDataset, build_datasets,
    build_loader, build_transform, stratified_split,
)


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
    train, val, info = build_datasets("imagefolder", str(image_tree(tmp_path)))
    assert (len(train), len(val), info.num_classes, info.classes) == (6, 6, 2, ("cat", "dog"))


def test_imagefolder_val_split_from_train(tmp_path):
    root = image_tree(tmp_path, splits=("train",), per_class=5)
    train, val, _ = build_datasets("imagefolder", str(root), val_split=4, split_seed=0)
    assert (len(train), len(val)) == (6, 4)
    assert Counter(val.dataset.targets[i] for i in val.indices) == {0: 2, 1: 2}


def test_imagefolder_missing_folder_says_what_is_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*DIR/train/<class>"):
        build_datasets("imagefolder", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="needs data_dir"):
        build_datasets("imagefolder")


def test_imagefolder_wrong_split_names(tmp_path):
    root = image_tree(tmp_path, splits=("training", "validation"))
    with pytest.raises(ValueError, match=r"no 'train' folder \(found folders: \['training', 'validation'\]\)"):
        build_datasets("imagefolder", str(root))


def test_imagefolder_without_val_needs_val_split(tmp_path):
    root = image_tree(tmp_path, splits=("train",))
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
    image_tree(tmp_path, splits=("train",), classes=("cat", "dog"))
    image_tree(tmp_path, splits=("val",), classes=("cat", "cow"))
    with pytest.raises(ValueError, match="differ"):
        build_datasets("imagefolder", str(tmp_path))


def test_a_folder_of_classes_named_train_and_val_is_read_as_classes(tmp_path):
    from ssog.data import evaluation_folder
    from ssog.data.folder import imagefolder_layout

    root = image_tree(tmp_path, splits=("",), classes=("apple", "train", "val"), per_class=4)  # CIFAR-100 has 'train'
    assert imagefolder_layout(root) == "classes"
    train, val, info = build_datasets("imagefolder", str(root), val_split=3, split_seed=0)
    assert info.classes == ("apple", "train", "val") and (len(train), len(val)) == (9, 3)
    whole, info = evaluation_folder(root)
    assert info.classes == ("apple", "train", "val") and len(whole) == 12
    with pytest.raises(ValueError, match=rf"{root} is a folder of classes \(DIR/<class>/<image>, no train/ folder of "
                                         r"class folders\): set val_split to a count or fraction of its images"):
        build_datasets("imagefolder", str(root))


def test_a_train_val_layout_is_told_by_what_its_folders_hold(tmp_path):
    from ssog.data.folder import imagefolder_layout

    root = image_tree(tmp_path / "splits", classes=("apple", "train"))  # a class named train inside each split
    assert imagefolder_layout(root) == "splits"
    assert build_datasets("imagefolder", str(root))[2].classes == ("apple", "train")
    lone = tmp_path / "lone"  # one folder of images alone is a split without class folders, not one class
    (lone / "train").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(lone / "train" / "a.png")
    assert imagefolder_layout(lone) == "splits"


@pytest.mark.parametrize("tree, splits, classes", [
    ((("train", ""), ("val", "cat"), ("val", "dog")), "val", "train"),  # train holds images, val class folders
    ((("train", ""), ("train", "cat"), ("apple", "")), "train", "train, apple"),  # train holds both, apple images
])
def test_an_ambiguous_tree_names_both_readings(tree, splits, classes, tmp_path):
    from ssog.data import evaluation_folder

    for folder, sub in tree:
        image_tree(tmp_path / folder, splits=(sub,), classes=("",), per_class=2)
    message = (rf"{tmp_path} reads two ways: as a train/val layout, {splits} holding class folders, or as a folder of "
               rf"classes, {classes} holding images themselves; move what does not belong out of it")
    with pytest.raises(ValueError, match=message):
        build_datasets("imagefolder", str(tmp_path), val_split=2)
    with pytest.raises(ValueError, match=message):
        evaluation_folder(tmp_path)


def test_cifar_missing_points_to_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-100-python.*--download"):
        build_datasets("cifar100", str(tmp_path))


def test_cifar_damaged_or_not_downloadable_is_named(tmp_path, monkeypatch):
    import urllib.error

    import torchvision.datasets.cifar as tv_cifar

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "batches.meta"):
        (folder / name).write_bytes(b"not the real batch")
    with pytest.raises(ValueError, match=r"cifar10 in \S+cifar-10-batches-py is incomplete or corrupt \(missing: "
                                         r"test_batch; failing their MD5 check: data_batch_1, .*batches.meta\); "
                                         r"delete \S+ and download it again"):
        build_datasets("cifar10", str(tmp_path))

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(tv_cifar, "download_and_extract_archive", offline)
    with pytest.raises(OSError, match=r"could not download cifar10 from https://\S+ \(\[Errno -3\] Temporary failure "
                                      r"in name resolution\); where this machine has no network, fetch "
                                      r"cifar-10-python.tar.gz elsewhere and extract it into"):
        build_datasets("cifar10", str(tmp_path / "elsewhere"), download=True)


@pytest.mark.parametrize("val_split, message", [
    (0.05, r"holds out 2 of 40 images, and a stratified split of 4 classes needs at least 4 on each side: give a "
           r"count in \[4, 36\] or a fraction in \[0.1, 0.9\]"),
    (38, r"holds out 38 of 40 images"),
])
def test_stratified_split_names_the_sizes_it_needs(val_split, message):
    with pytest.raises(ValueError, match=rf"val_split {val_split} \(--val-split\) {message}"):
        stratified_split([0, 1, 2, 3] * 10, val_split, seed=0)
    with pytest.raises(ValueError, match="at least 2 images of every class, and 1 of the 3 classes have only 1: "
                                         "class 2$"):
        stratified_split([0, 0, 1, 1, 2], 2, seed=0)


def test_a_class_of_one_image_is_named(tmp_path):
    image_tree(tmp_path, splits=("train",), classes=("cat", "dog"), per_class=3)
    image_tree(tmp_path, splits=("train",), classes=("owl",), per_class=1)
    with pytest.raises(ValueError, match="1 of the 3 classes have only 1: owl$"):
        build_datasets("imagefolder", str(tmp_path), val_split=2)


# ---------------------------------------------------------------- image modes: what the user sees
def _saved(tmp_path, image: Image.Image, name: str) -> str:
    path = tmp_path / name
    image.save(path)
    return str(path)


def test_sixteen_bit_and_float_images_are_scaled_not_clipped(tmp_path):
    from ssog.data.images import load_image

    ramp = np.linspace(0, 1, 64).reshape(8, 8)
    png16 = _saved(tmp_path, Image.fromarray(np.round(ramp * 65535).astype(np.uint16)), "a.png")
    float01 = _saved(tmp_path, Image.fromarray(ramp.astype(np.float32)), "b.tif")
    float255 = _saved(tmp_path, Image.fromarray((ramp * 255).astype(np.float32)), "c.tif")
    int32 = _saved(tmp_path, Image.fromarray(np.round(ramp * (2**31 - 1)).astype(np.int32)), "d.tif")
    assert Image.open(png16).mode == "I;16" and Image.open(float01).mode == "F"
    expected = np.round(ramp * 255)
    for path in (png16, float01, float255, int32):  # int32: a signed TIFF, by its largest value 2**31 - 1
        pixels = np.asarray(load_image(path), dtype=np.float64)
        assert pixels.shape == (8, 8, 3) and np.abs(pixels[..., 0] - expected).max() <= 1, path
    negative = _saved(tmp_path, Image.fromarray((ramp - 0.5).astype(np.float32)), "e.tif")
    with pytest.raises(ValueError, match=r"cannot decode image \S+e.tif .*float image with values in \[-0.5, 0.5\]"):
        load_image(negative)


def test_alpha_and_palette_images_keep_their_colours(tmp_path, recwarn):
    from ssog.data.images import load_image

    rgb = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    alpha = np.full((8, 8, 1), 7, dtype=np.uint8)  # nearly transparent: dropped, not composited
    rgba = _saved(tmp_path, Image.fromarray(np.concatenate([rgb, alpha], -1), "RGBA"), "rgba.png")
    assert np.array_equal(np.asarray(load_image(rgba)), rgb)
    grey = Image.fromarray(rgb[..., 0]).convert("LA")
    assert np.array_equal(np.asarray(load_image(_saved(tmp_path, grey, "la.png")))[..., 1], rgb[..., 0])
    palette = Image.fromarray(rgb).quantize(16)
    palette.info["transparency"] = 0
    path = _saved(tmp_path, palette, "p.png")
    assert np.array_equal(np.asarray(load_image(path)), np.asarray(palette.convert("RGB")))
    cmyk = Image.fromarray(rgb).convert("CMYK")
    assert np.array_equal(np.asarray(load_image(_saved(tmp_path, cmyk, "c.jpg"))).shape, (8, 8, 3))
    assert not [w for w in recwarn if "Palette" in str(w.message)]


# ---------------------------------------------------------------- what an ImageFolder holds
def test_hidden_entries_symlink_loops_and_unread_files(tmp_path, caplog):
    import os

    image_tree(tmp_path, splits=("train",), classes=("cat", "dog"), per_class=2)
    train = tmp_path / "train"
    (train / ".ipynb_checkpoints").mkdir()  # not a class
    Image.new("RGB", (12, 12)).save(train / ".ipynb_checkpoints" / "x.png")
    (train / "cat" / ".DS_Store").write_bytes(b"finder")
    Image.new("RGB", (12, 12)).save(train / "cat" / "anim.gif")  # read: PIL reads GIF
    (train / "dog" / "notes.txt").write_text("not an image")
    (train / "dog" / "raw.xyz").write_text("not an image")
    os.symlink("..", train / "cat" / "up")  # a loop: would repeat every class inside cat
    os.symlink("../dog", train / "cat" / "dogs")  # another class's folder: would mislabel it
    (tmp_path / "extra").mkdir()
    Image.new("RGB", (12, 12)).save(tmp_path / "extra" / "more.png")
    os.symlink(tmp_path / "extra", train / "dog" / "extra")  # a folder linked on purpose: followed
    os.symlink(tmp_path / "missing.png", train / "dog" / "gone.png")

    dataset, _, info = build_datasets("imagefolder", str(tmp_path), val_split=2)
    folder = dataset.dataset
    assert folder.classes == ["cat", "dog"] and info.num_classes == 2
    names = sorted((os.path.relpath(path, train), target) for path, target in folder.samples)
    assert names == [("cat/0.png", 0), ("cat/1.png", 0), ("cat/anim.gif", 0),
                     ("dog/0.png", 1), ("dog/1.png", 1), ("dog/extra/more.png", 1)]
    assert [record.getMessage() for record in caplog.records if record.levelname == "WARNING"] == [
        f"{train}: did not follow 2 symlinked folder(s) that lead back into folders already read (a loop "
        f"would repeat and mislabel images): cat/dogs -> {train / 'dog'}; cat/up -> {train}",
        f"{train}: ignored 3 file(s) of types the image loader does not read (.txt x1, .xyz x1, "
        f"broken link x1) and 2 hidden entries (.ipynb_checkpoints, cat/.DS_Store)",
    ]


def test_a_class_left_empty_by_skip_bad_images_is_an_error(tmp_path):
    image_tree(tmp_path, splits=("train",), classes=("cat", "dog"), per_class=2)
    for image in (tmp_path / "train" / "dog").iterdir():
        image.write_bytes(b"\x89PNG\r\n\x1a\n cut")
    with pytest.raises(ValueError, match=r"class folder\(s\) dog of \S+train has no readable image left after "
                                         r"--skip-bad-images left out its unreadable ones"):
        build_datasets("imagefolder", str(tmp_path), val_split=2, skip_bad_images=True)


def test_differing_class_folders_are_named(tmp_path):
    image_tree(tmp_path, splits=("train",), classes=("cat", "dog", "owl"))
    image_tree(tmp_path, splits=("val",), classes=("cat", "cow", "dog"))
    with pytest.raises(ValueError, match=r"the class folders of \S+val differ from those of \S+train \(missing: owl; "
                                         r"extra: cow\)"):
        build_datasets("imagefolder", str(tmp_path))


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


def test_a_failed_download_leaves_nothing_behind(tmp_path, monkeypatch):
    from urllib.error import URLError

    from torchvision.datasets import CIFAR100

    def half_download(self):
        (Path(self.root) / "cifar-100-python.tar.gz").write_bytes(b"partial")
        raise URLError("no network")

    monkeypatch.setattr(CIFAR100, "download", half_download)
    root = tmp_path / "data" / "cifar100"
    with pytest.raises(OSError, match="could not download cifar100"):
        build_datasets("cifar100", str(root), download=True)
    assert list(tmp_path.iterdir()) == []  # neither the archive nor the folders the run made
    # a folder that was there keeps what it held
    root.mkdir(parents=True)
    (root / "mine.txt").write_text("the user's")
    with pytest.raises(OSError, match="could not download cifar100"):
        build_datasets("cifar100", str(root), download=True)
    assert [p.name for p in root.iterdir()] == ["mine.txt"]


def test_the_stratified_split_is_scikit_learns():
    """Runs split as they did when scikit-learn drew the split: the same sets for every kind of
    target list, fraction and count, and seed."""
    model_selection = pytest.importorskip("sklearn.model_selection")
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(200):
        classes = int(rng.integers(2, 12))
        n = int(rng.integers(2 * classes, 300))
        extra = rng.integers(0, classes, n - 2 * classes)
        targets = rng.permutation(np.concatenate([np.arange(classes), np.arange(classes), extra]))
        targets = targets * int(rng.integers(1, 4))  # labels need not be 0..k-1
        seed = int(rng.integers(0, 2**32 - 1))
        size = float(rng.uniform(0.05, 0.9)) if trial % 2 else int(rng.integers(classes, n - classes + 1))
        held_out = int(np.ceil(size * n)) if isinstance(size, float) else size
        if not classes <= held_out <= n - classes:
            continue
        kept, held = model_selection.train_test_split(np.arange(n), test_size=size, stratify=targets,
                                                      random_state=seed, shuffle=True)
        assert stratified_split(targets.tolist(), size, seed) == (sorted(kept.tolist()), sorted(held.tolist()))
        checked += 1
    assert checked > 150


def test_the_embedded_digits_are_scikit_learns():
    datasets = pytest.importorskip("sklearn.datasets")
    from ssog.data.builtin import digits_datasets

    digits = datasets.load_digits()
    train, val, info = digits_datasets(None, seed=0)
    assert np.array_equal(train.dataset.images, np.round(digits.images * (255.0 / 16.0)).astype(np.uint8))
    assert train.dataset.targets == digits.target.tolist() and info.classes == tuple("0123456789")
    assert (len(train), len(val)) == (1437, 360)
