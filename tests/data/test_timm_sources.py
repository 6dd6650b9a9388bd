"""timm's data sources (wds/, hfids/, hfds/, torch/, tfds/), ImageFolder's validation/ folder,
datasets given in Python, and the shard-level resume of streamed sources. All data is written
by the tests (offline)."""
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from support import crash_after_save
from ssog.data import ArrayDataset, build_datasets
from ssog.train import evaluate_checkpoint, load_checkpoint, train
from ssog.train.checkpoint import read_checkpoint_info
from ssog.train.engine import Trainer

wds = pytest.importorskip("webdataset")
datasets = pytest.importorskip("datasets")

CLASSES = 4


def _png(rng, size=8):
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buffer, format="png")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """WebDataset shards: train-0000..0003.tar (16 samples each), validation-0000.tar (16), and
    timm's _info.json naming the splits; sample keys are their global index."""
    root = tmp_path_factory.mktemp("wds")
    rng = np.random.default_rng(0)
    splits = {}
    for split, count, first in (("train", 4, 0), ("validation", 1, 1000)):
        names = []
        for shard in range(count):
            names.append(f"{split}-{shard:04d}.tar")
            with wds.TarWriter(str(root / names[-1])) as writer:
                for i in range(first + 16 * shard, first + 16 * (shard + 1)):
                    writer.write({"__key__": f"{i:06d}", "png": _png(rng), "cls": str(i % CLASSES).encode()})
        splits[split] = {"name": split, "filenames": names, "num_samples": 16 * count, "shard_lengths": [16] * count}
    (root / "_info.json").write_text(json.dumps({"num_classes": CLASSES, "splits": splits}))
    return root


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A local Hugging Face dataset: parquet files (3 train shards of 8 images, 1 validation
    shard of 8) with an Image column and a ClassLabel."""
    root = tmp_path_factory.mktemp("hf")
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["a", "b", "c", "d"])})
    rng = np.random.default_rng(1)
    for split, count in (("train", 3), ("validation", 1)):
        for shard in range(count):
            images = [Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(8)]
            table = datasets.Dataset.from_dict({"image": images, "label": [i % CLASSES for i in range(8)]},
                                               features=features)
            table.to_parquet(str(root / "data" / f"{split}-{shard:05d}-of-{count:05d}.parquet"))
    return root


def _options(tiny_config, output, **overrides):
    return tiny_config(output, epochs=1, batch_size=8, **overrides)


@pytest.mark.parametrize("source", ["wds", "hfids", "hfds"])
def test_timm_sources_train_one_epoch(source, shards, hf_folder, tmp_path, tiny_config):
    data = {"wds": dict(dataset="wds/tiny", data_dir=str(shards)),
            "hfids": dict(dataset=f"hfids/{hf_folder}"),
            "hfds": dict(dataset=f"hfds/{hf_folder}", data_dir=str(tmp_path / "cache"))}[source]
    summary = train(_options(tiny_config, tmp_path / "run", **data))
    samples = {"wds": (64, 16), "hfids": (24, 8), "hfds": (24, 8)}[source]
    assert summary["steps"] == samples[0] // 8 and summary["dataset"] == data["dataset"]
    info = read_checkpoint_info(tmp_path / "run" / "last.safetensors")
    assert info["progress"]["epoch"] == 1
    classes = load_checkpoint(tmp_path / "run" / "best.safetensors", only=("classes",))["classes"]
    assert classes == (["a", "b", "c", "d"] if source != "wds" else ["0", "1", "2", "3"])


def test_map_style_sources_split_off_validation_and_take_validation_folders(hf_folder, tmp_path):
    train_set, val, info = build_datasets(f"hfds/{hf_folder}", str(tmp_path / "cache"), val_split=6)
    assert (len(train_set), len(val), info.classes) == (18, 6, ("a", "b", "c", "d"))
    image, target = val[0]
    assert image.size == (8, 8) and image.mode == "RGB" and 0 <= target < 4
    # an ImageFolder tree with timm's validation/ split name, built-in and through torch/
    rng = np.random.default_rng(0)
    for split in ("train", "validation"):
        for name in ("cat", "dog"):
            (tmp_path / "tree" / split / name).mkdir(parents=True)
            for i in range(3):
                (tmp_path / "tree" / split / name / f"{i}.png").write_bytes(_png(rng))
    for source in ("imagefolder", "torch/image_folder"):
        train_set, val, info = build_datasets(source, str(tmp_path / "tree"))
        assert (len(train_set), len(val), info.classes) == (6, 6, ("cat", "dog")), source


def test_source_errors_name_the_setting(shards, tmp_path):
    with pytest.raises(ValueError, match="no split 'valid' in its _info.json"):
        build_datasets("wds/tiny", str(shards), val_split="valid")
    with pytest.raises(ValueError, match="val_split must name its validation split"):
        build_datasets("wds/tiny", str(shards), val_split=0.2)
    with pytest.raises(ValueError, match="dataset torch/nosuch"):
        build_datasets("torch/nosuch", str(tmp_path))
    with pytest.raises(ValueError, match="val_split names a split, which only timm's sources"):
        build_datasets("digits", val_split="validation")
    with pytest.raises(ValueError, match="unknown dataset 'wds'.*hfds/NAME"):
        build_datasets("wds")


def _samples(stream, count):
    return [(image, target) for image, target, *_ in list(_take(stream, count))]


def _take(stream, count):
    iterator = iter(stream)
    return [next(iterator) for _ in range(count)]


def test_stream_deals_shards_and_resumes_at_a_shard_boundary(shards):
    """A reader skips the shards a checkpoint says it finished and reads the next one from its
    start; two processes share each epoch's shards; epochs reorder the shards."""
    train_set, _, _ = build_datasets("wds/tiny", str(shards))
    stream = train_set.configure(pil_to_tensor, seed=0, rank=0, world_size=1)
    stream.set_epoch(0)
    whole = _take(stream, 64)
    assert [done for *_, done in whole[15:17]] == [1, 1] and whole[14][3] == 0  # shard 1 of 4 ends at sample 16
    stream.set_epoch(0, {0: 1})
    resumed = _take(stream, 48)
    assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(resumed, whole[16:]))
    # epoch 1 reads the shards in another order; two processes split an epoch's shards
    stream.set_epoch(1)
    assert not torch.equal(torch.stack([s[0] for s in _take(stream, 16)]), torch.stack([s[0] for s in whole[:16]]))
    halves = []
    for rank in (0, 1):
        part = build_datasets("wds/tiny", str(shards))[0].configure(pil_to_tensor, 0, rank, 2)
        part.set_epoch(0)
        halves.append({bytes(s[0].numpy()) for s in _take(part, 32)})
    assert not halves[0] & halves[1] and halves[0] | halves[1] == {bytes(s[0].numpy()) for s in whole}


@pytest.mark.parametrize("workers, finished", [(0, {0: 1}), (2, {0: 1, 1: 0})])
def test_killed_stream_run_resumes_at_its_shard_position(workers, finished, shards, tmp_path, monkeypatch,
                                                         tiny_config):
    """A stream run stopped after 3 steps keeps each reader's position in its checkpoint (one
    reader: 2 batches of 8 finished its first shard of 16; two loader workers, taking batches in
    turn: the first has, the second has not); the resume skips those shards and ends the epoch."""
    options = dict(dataset="wds/tiny", data_dir=str(shards), checkpoint_every=3, num_workers=workers)
    crash_after_save(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        train(_options(tiny_config, tmp_path / "run", **options))
    monkeypatch.undo()
    progress = read_checkpoint_info(tmp_path / "run" / "last.safetensors")["progress"]
    assert progress["step_in_epoch"] == 3 and progress["stream"] == {"readers": max(1, workers), "finished": finished}
    summary = train(resume=tmp_path / "run")
    assert summary["steps"] == 8 and summary["epochs"] == 1


def test_tfds_goes_through_timms_reader_and_restarts_its_epoch(shards, tmp_path, monkeypatch, tiny_config, ssog_log):
    """tfds/ is read by timm's own iterable reader (TensorFlow is not needed to test that path:
    timm's WebDataset reader stands in for it): it trains, and a resume inside an epoch says
    that the epoch's remaining steps read the stream from its start."""
    import timm.data

    real = timm.data.create_dataset

    def stand_in(name, root=None, split="train", download=False, **kwargs):
        return real("wds/tiny", root=str(shards), split=split, batch_size=8, **kwargs)

    monkeypatch.setattr(timm.data, "create_dataset", stand_in)
    save_last = crash_after_save(monkeypatch, 2)
    cfg = _options(tiny_config, tmp_path / "run", dataset="tfds/tiny", num_classes=CLASSES, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.setattr(Trainer, "save_last", save_last)
    summary = train(resume=tmp_path / "run")
    assert summary["steps"] == 8
    assert "cannot continue inside epoch 1" in ssog_log.text


def test_python_datasets_train_and_resume_only_with_them(tmp_path, tiny_config):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (48, 8, 8, 3), dtype=np.uint8)
    train_set, val_set = ArrayDataset(images[:32], np.arange(32) % 4), ArrayDataset(images[32:], np.arange(16) % 4)
    cfg = tiny_config(tmp_path / "run", epochs=1, dataset="digits")
    summary = train(cfg, train_dataset=train_set, val_dataset=val_set)
    assert summary["dataset"] == "custom" and summary["steps"] == 2
    with pytest.raises(ValueError, match="pass them again"):
        train(resume=tmp_path / "run", resume_changes={"epochs": 2})
    assert train(resume=tmp_path / "run", resume_changes={"epochs": 2}, train_dataset=train_set,
                 val_dataset=val_set)["steps"] == 4
    with pytest.raises(ValueError, match="trained on datasets given in Python; name a data source"):
        evaluate_checkpoint(tmp_path / "run", progress=False)
    assert evaluate_checkpoint(tmp_path / "run", data={"dataset": "synthetic"}, progress=False)["samples"] == 16
    with pytest.raises(ValueError, match="give it without its transform"):
        train(tiny_config(tmp_path / "b"), train_dataset=[(torch.zeros(3, 8, 8), 0)] * 16, val_dataset=val_set)
    with pytest.raises(ValueError, match="give both train_dataset and val_dataset"):
        train(tiny_config(tmp_path / "c"), train_dataset=train_set)


def test_16_bit_images_of_every_source_are_scaled_not_clipped(tmp_path):
    """timm's sources convert images by mode as the built-in ones do (ssog.data.images.to_rgb):
    a 16-bit grey PNG of level 25700 is 100 in 8 bits, not the 255 of PIL's convert("RGB")."""
    grey16 = Image.fromarray(np.full((8, 8), 25700, dtype=np.uint16))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    (tmp_path / "hf" / "data").mkdir(parents=True)
    for split in ("train", "validation"):
        table = datasets.Dataset.from_dict({"image": [grey16] * 4, "label": [0, 1] * 2}, features=features)
        table.to_parquet(str(tmp_path / "hf" / "data" / f"{split}-00000-of-00001.parquet"))
        buffer = io.BytesIO()
        grey16.save(buffer, format="png")
        with wds.TarWriter(str(tmp_path / f"{split}.tar")) as writer:
            for i in range(4):
                writer.write({"__key__": f"{i:06d}", "png": buffer.getvalue(), "cls": str(i % 2).encode()})
    hfds = build_datasets(f"hfds/{tmp_path / 'hf'}", str(tmp_path / "cache"))[0]
    hfids = build_datasets(f"hfids/{tmp_path / 'hf'}")[0]
    shards = build_datasets("wds/grey", str(tmp_path), train_split="train.tar|4", val_split="validation.tar|4",
                            num_classes=2)[0]
    images = [hfds[0][0]] + [stream.shards.decode(next(stream.shards.read(0)))[0] for stream in (hfids, shards)]
    for image in images:
        assert image.mode == "RGB" and np.asarray(image).max() == np.asarray(image).min() == 100
    # decoded here rather than in timm's reader: an image that does not decode is named
    (tmp_path / "bad" / "data").mkdir(parents=True)
    truncated = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(truncated, "png")
    table = datasets.Dataset.from_dict({"image": [{"bytes": truncated.getvalue()[:1000], "path": None}] * 2,
                                       "label": [0, 1]}, features=features)
    for split in ("train", "validation"):
        table.to_parquet(str(tmp_path / "bad" / "data" / f"{split}-00000-of-00001.parquet"))
    with pytest.raises(ValueError, match=r"dataset hfds/.*bad split 'train', sample 0: cannot decode its image "
                                         r"\(OSError: image file is truncated\)"):
        build_datasets(f"hfds/{tmp_path / 'bad'}", str(tmp_path / "cache"), num_classes=2)
