"""Every data source checks every sample the same way (ssog.data.samples): an image that does
not decode, a missing label, a label that is not a class index or is out of range is an error
naming the source, the shard or index and the key; cheap checks run before training; images
are turned upright by their EXIF orientation and converted to the run's channels. All data is
written by the tests."""
import io
import json
import logging
import re
from itertools import islice

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.functional import pil_to_tensor

from support import image_tree
from ssog.data import build_datasets, evaluation_folder
from ssog.data.custom import custom_datasets
from ssog.data.samples import SampleError, class_index
from ssog.data.shards import HfShards
from ssog.data.streams import StreamLoader
from ssog.train import train

wds = pytest.importorskip("webdataset")

CLASSES = 4


def _encoded(seed: int, fmt: str = "png", size: tuple[int, int] = (8, 8), mode: str = "RGB", **save) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0]), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, format=fmt, **save)
    return buffer.getvalue()


def _rotated_jpeg() -> bytes:
    """A 12x6 JPEG whose EXIF orientation (6: rotate 90 degrees clockwise) makes it 6x12."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return _encoded(0, "jpeg", size=(12, 6), exif=exif)


def _good(index: int) -> dict:
    return {"__key__": f"{index:06d}", "png": _encoded(index), "cls": str(index % CLASSES).encode()}


def _webdataset(root, train: list[list[dict]], *, num_samples: int | None = None, lengths: bool = True,
                listed: int | None = None):
    """``root/train-NNNN.tar`` (one per list of samples), ``root/validation-0000.tar`` (8 good
    samples) and an ``_info.json`` naming them (``listed`` shards for train, more than written
    when asked; ``shard_lengths`` when ``lengths``)."""
    root.mkdir(parents=True)
    splits = {}
    for split, shards in (("train", train), ("validation", [[_good(1000 + i) for i in range(8)]])):
        names = [f"{split}-{i:04d}.tar" for i in range(len(shards) if split == "validation" or listed is None
                                                       else listed)]
        for name, samples in zip(names, shards):
            with wds.TarWriter(str(root / name)) as writer:
                for sample in samples:
                    writer.write(sample)
        held = sum(len(samples) for samples in shards)
        splits[split] = {"filenames": names, "num_samples": held if split == "validation" else num_samples or held}
        if lengths:
            splits[split]["shard_lengths"] = [len(samples) for samples in shards]
    (root / "_info.json").write_text(json.dumps({"num_classes": CLASSES, "splits": splits}))
    return root


BAD_SAMPLES = {
    "no label": ({"png": _encoded(0)}, r"no label \(no \.cls"),
    "label out of range": ({"png": _encoded(0), "cls": b"9"}, r"label 9 is outside the 4 classes \(0\.\.3\)"),
    "label not a number": ({"png": _encoded(0), "cls": b"cat"}, r"label 'cat' is not a class index"),
    "corrupt image": ({"png": b"not an image", "cls": b"1"}, r"cannot decode its image \(UnidentifiedImageError"),
}


@pytest.mark.parametrize("kind", BAD_SAMPLES)
def test_a_bad_webdataset_sample_is_named_before_training_or_where_a_reader_meets_it(kind, tmp_path):
    fields, problem = BAD_SAMPLES[kind]
    for position, where in ((2, "first"), (12, "deep")):  # among the samples checked up front, or past them
        samples = [_good(i) for i in range(16)]
        samples[position] = {"__key__": f"{position:06d}", **fields}
        root = _webdataset(tmp_path / where, [samples])
        named = rf"dataset wds/x split 'train', shard \S+train-0000\.tar, sample {position:06d}: {problem}"
        if where == "first":
            with pytest.raises(ValueError, match=named):
                build_datasets("wds/x", str(root))
        else:
            stream = build_datasets("wds/x", str(root))[0].configure(pil_to_tensor, 0, 0, 1)
            stream.set_epoch(0)
            with pytest.raises(ValueError, match=named):
                list(islice(stream, 16))


def test_a_streamed_hugging_face_image_with_neither_bytes_nor_a_path_is_named():
    shards = HfShards("x", None, "train", source="dataset hfids/x split 'train'")
    item = {"image": {"bytes": None, "path": None}, "label": 1, "__shard__": 0, "__index__": 3}
    with pytest.raises(SampleError, match=r"^dataset hfids/x split 'train', shard 0, item 3: its 'image' holds "
                                          r"neither image bytes nor a path; it holds \['bytes', 'path'\]$"):
        shards.decode(item)


def test_a_broken_info_json_and_a_missing_shard_are_named_before_training(tmp_path):
    root = _webdataset(tmp_path / "a", [[_good(i) for i in range(8)]] * 3, listed=4)
    with pytest.raises(ValueError, match=r"1 of the 4 shards of split 'train' are missing: \S+train-0003\.tar"):
        build_datasets("wds/x", str(root))
    (root / "_info.json").write_text('{"splits": {"train": ')
    with pytest.raises(ValueError, match=r"\S+_info\.json is not valid JSON \(Expecting value: line 1"):
        build_datasets("wds/x", str(root))


@pytest.mark.parametrize("listed", ["/etc/passwd", "../outside.tar", "sub/../../outside.tar", "pipe:cat /etc/passwd",
                                    "https://example.com/a.tar", "link.tar"])
def test_info_json_lists_only_shards_inside_the_data_folder(listed, tmp_path):
    root = _webdataset(tmp_path / "data", [[_good(i) for i in range(8)]])
    with wds.TarWriter(str(tmp_path / "outside.tar")) as writer:
        writer.write(_good(0))
    (root / "link.tar").symlink_to(tmp_path / "outside.tar")
    info = json.loads((root / "_info.json").read_text())
    info["splits"]["train"]["filenames"].append(listed)
    (root / "_info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=rf"lists the shard '{re.escape(listed)}', which is not inside {root}"):
        build_datasets("wds/x", str(root))
    # the same shard named by the user, in the split's pattern, is read
    train = build_datasets("wds/x", str(root), train_split=f"{tmp_path / 'outside.tar'}|1")[0]
    assert train.shards.urls == (str(tmp_path / "outside.tar"),)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_truncated_shard_is_named_before_training(split, tmp_path):
    import tarfile

    root = _webdataset(tmp_path / "data", [[_good(i) for i in range(16)]])
    shard = root / f"{split}-0000.tar"
    with tarfile.open(shard) as archive:
        boundary = archive.getmembers()[8].offset  # where the fifth sample starts: a valid, shorter tar
    for end in (boundary, boundary + 100):  # cut at a sample's end, and inside one
        shard.write_bytes(shard.read_bytes()[:end])
        with pytest.raises(ValueError, match=rf"1 of the 1 shards of split '{split}' are truncated \(no "
                                             rf"end-of-archive blocks\): \S+{split}-0000\.tar; write them again"):
            build_datasets("wds/x", str(root))


def test_one_class_and_zero_samples_are_named(tmp_path):
    root = _webdataset(tmp_path / "data", [[_good(i) for i in range(8)]])
    info = json.loads((root / "_info.json").read_text())
    with pytest.raises(ValueError, match=r"it names 1 class \('cat'\); a classifier needs at least 2"):
        (root / "_info.json").write_text(json.dumps({**info, "classes": ["cat"]}))
        build_datasets("wds/x", str(root))
    info["splits"]["train"]["num_samples"] = 0
    (root / "_info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"split 'train': num_samples is 0 \(_info.json or "
                                         r"dataset_kwargs.num_samples\); a split needs a whole number >= 1 of samples"):
        build_datasets("wds/x", str(root))


def test_an_epoch_longer_than_the_shards_warns(tmp_path, caplog):
    """num_samples beyond what the shards hold repeats samples within an epoch: said before
    training where _info.json gives the shard lengths, else when a reader starts its shards
    again."""
    shards = [[_good(16 * s + i) for i in range(16)] for s in range(2)]
    _webdataset(tmp_path / "known", shards, num_samples=100)
    with caplog.at_level(logging.WARNING, logger="ssog"):
        build_datasets("wds/x", str(tmp_path / "known"))
    assert any("hold 32 samples (_info.json shard_lengths) but num_samples is 100" in record.getMessage()
               for record in caplog.records)
    caplog.clear()
    _webdataset(tmp_path / "unknown", shards, num_samples=100, lengths=False)
    stream = build_datasets("wds/x", str(tmp_path / "unknown"))[0].configure(pil_to_tensor, 0, 0, 1)
    loader = StreamLoader(DataLoader(stream, batch_size=8), batches=100 // 8, readers=1)
    loader.set_epoch(0)
    with caplog.at_level(logging.WARNING, logger="ssog"):
        assert len(list(loader)) == 12
    warnings = [record.getMessage() for record in caplog.records if "again" in record.getMessage()]
    assert len(warnings) == 1 and "num_samples (100)" in warnings[0]


class Images(Dataset):
    """``(PIL image, label)`` pairs of a list, without ``targets`` unless given."""

    def __init__(self, images, labels, targets: bool = False):
        self.images, self.labels = images, labels
        if targets:
            self.targets = list(labels)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.images[index], self.labels[index]


def _mixed(count: int, first: str = "RGB") -> list[Image.Image]:
    """8x8 images alternating ``first`` and the other of grey (L) and colour (RGB)."""
    other = "L" if first == "RGB" else "RGB"
    return [Image.open(io.BytesIO(_encoded(i, mode=first if i % 2 == 0 else other))) for i in range(count)]


def test_python_datasets_of_grey_and_colour_images_train_in_colour(tmp_path, tiny_config):
    train_set = Images(_mixed(32), [i % 4 for i in range(32)], targets=True)
    val_set = Images(_mixed(16), [i % 4 for i in range(16)])
    summary = train(tiny_config(tmp_path / "run", epochs=1), train_dataset=train_set, val_dataset=val_set)
    assert summary["steps"] == 2
    grey_first = Images(_mixed(8, first="L"), [i % 4 for i in range(8)], targets=True)
    _, val, info = custom_datasets(grey_first, grey_first)
    assert info.in_chans == 3 and {val[i][0].mode for i in range(8)} == {"RGB"}
    grey = Images([image.convert("L") for image in _mixed(8)], [i % 4 for i in range(8)], targets=True)
    _, val, info = custom_datasets(grey, grey)
    assert info.in_chans == 1 and {val[i][0].mode for i in range(8)} == {"L"}


def test_python_dataset_labels_out_of_range_are_named_by_sample(tmp_path, tiny_config):
    images, labels = _mixed(32), [i % 4 for i in range(32)]
    wrong = list(labels)
    wrong[5] = 7
    # a validation set that lists its targets: before training, nothing written
    with pytest.raises(ValueError, match=r"val_dataset sample 5: label 7 is outside the 4 classes \(0\.\.3\)"):
        train(tiny_config(tmp_path / "a"), train_dataset=Images(images, labels, targets=True),
              val_dataset=Images(images, wrong, targets=True))
    assert not (tmp_path / "a").exists()
    # one that does not: where the sample is read
    wrong[5], wrong[20] = 1, 9
    with pytest.raises(ValueError, match=r"train_dataset sample 20: label 9 is outside the 4 classes"):
        train(tiny_config(tmp_path / "b", epochs=1, num_classes=4), train_dataset=Images(images, wrong),
              val_dataset=Images(images, labels))


def test_image_files_outside_the_class_folders_are_reported(tmp_path, caplog):
    image_tree(tmp_path)
    for name in ("stray.png", "other.png"):
        (tmp_path / "train" / name).write_bytes(_encoded(0))
    (tmp_path / "train" / "README.txt").write_text("notes")
    with caplog.at_level(logging.WARNING, logger="ssog"):
        train_set, _, _ = build_datasets("imagefolder", str(tmp_path))
    assert len(train_set) == 6
    assert [record.getMessage() for record in caplog.records] == [
        f"{tmp_path / 'train'}: ignored 2 image file(s) outside the class folders (other.png, stray.png): "
        "an ImageFolder reads DIR/<class>/<image>; move them into their class folders"
    ]


def test_both_val_and_validation_folders_must_be_chosen_between(tmp_path):
    image_tree(tmp_path, splits=("train", "val", "validation"))
    (tmp_path / "validation" / "cat" / "0.png").unlink()
    with pytest.raises(ValueError, match=r"has both a 'val' and a 'validation' folder.*--val-split val or "
                                         r"--val-split validation"):
        build_datasets("imagefolder", str(tmp_path))
    assert len(build_datasets("imagefolder", str(tmp_path), val_split="validation")[1]) == 5
    assert len(build_datasets("imagefolder", str(tmp_path), val_split="val")[1]) == 6
    with pytest.raises(ValueError, match=r"val_split 'test' names no folder of \S+ \(found folders: "
                                         r"\['train', 'val', 'validation'\]\)"):
        build_datasets("imagefolder", str(tmp_path), val_split="test")
    with pytest.raises(ValueError, match=r"has both a 'val' and a 'validation' folder.*--data-dir \S+validation"):
        evaluation_folder(tmp_path)


def test_exif_orientation_is_applied_in_every_source(tmp_path):
    image_tree(tmp_path / "tree", splits=("train",))
    (tmp_path / "tree" / "train" / "cat" / "turned.jpg").write_bytes(_rotated_jpeg())
    folder = build_datasets("imagefolder", str(tmp_path / "tree"), val_split=2)[0].dataset
    index = next(i for i, (path, _) in enumerate(folder.samples) if path.endswith("turned.jpg"))
    assert folder[index][0].size == (6, 12)
    root = _webdataset(tmp_path / "wds", [[{"__key__": "turned", "jpg": _rotated_jpeg(), "cls": b"0"}]])
    stream = build_datasets("wds/x", str(root))[0]
    assert stream.shards.decode(next(stream.shards.read(0)))[0].size == (6, 12)
    turned = Image.open(io.BytesIO(_rotated_jpeg()))
    given = custom_datasets(Images([turned] * 4, [0, 1] * 2, targets=True), Images([turned] * 2, [0, 1]))[0]
    assert given[0][0].size == (6, 12)


@pytest.mark.parametrize("label, index", [(3, 3), (np.int64(2), 2), (torch.tensor(1), 1), (np.array([0]), 0),
                                          (b"3", 3), (" 2\n", 2), (1.0, 1)])
def test_labels_that_are_class_indices(label, index):
    assert class_index(label, 4, "here") == index


@pytest.mark.parametrize("label, problem", [(2.5, "label 2.5 is not a class index"), (None, "label None is not"),
                                            ("cat", "label 'cat' is not"), (-1, "label -1 is outside the 4 classes"),
                                            (torch.tensor([0, 1]), "label tensor([0, 1]) is not a class index")])
def test_labels_that_are_not(label, problem):
    with pytest.raises(ValueError, match=f"^here: {re.escape(problem)}"):
        class_index(label, 4, "here")
