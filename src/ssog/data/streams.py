"""timm's iterable sources, read as streams: ``wds/`` (WebDataset tar shards) and ``hfids/``
(a streamed Hugging Face dataset) by :class:`ShardStream`, ``tfds/`` (TensorFlow datasets) by
timm's own reader.

:class:`ShardStream` reads shard by shard and resumes at shard level: an epoch deals the
shards, in an order seeded by ``(seed, epoch)``, to the readers (processes x loader workers);
each reader shuffles each shard's samples in a buffer seeded by ``(seed, epoch, shard)``; a
checkpoint records how many shards each reader has finished, and a resumed run skips those and
reads the shard each reader was in again from its start (docs/training.md, "Resuming a
stream"). timm's own iterable readers keep their shuffle state inside the loader's workers, so
a run on them can only restart an epoch: hence this reader of our own, on webdataset's tar
iterator and datasets' shards. ``tfds/`` goes through timm's reader and resumes at the epoch's
start.

Every sample goes through :func:`~ssog.data.samples.checked_sample`, its errors naming the
split, the shard and the sample's key; before training, every listed local shard must exist
and the first samples of each split must decode, and an epoch longer than the shards hold is
a warning.
"""
from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from functools import cached_property
from itertools import count, islice
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from ssog.data.info import DATA_EXTRA, DatasetInfo, shown_names, timm_source_info
from ssog.data.loader import sample_seed, seeded_rngs
from ssog.data.samples import FIRST_SAMPLES, SampleError, checked_sample

__all__ = [
    "SHUFFLE_SIZE", "WdsShards", "HfShards", "ShardStream", "StreamLoader", "stream_datasets", "stream_readers",
]

logger = logging.getLogger(__name__)

#: Samples a reader holds to shuffle one shard (``dataset_kwargs.shuffle_size``).
SHUFFLE_SIZE = 1024
#: Option keys read from ``dataset_kwargs`` by the iterable readers.
_STREAM_OPTIONS = ("input_key", "target_key", "shuffle_size", "num_samples")


def _buffered_shuffle(samples: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """``samples`` in an order shuffled within a sliding buffer of ``size`` (webdataset's rule)."""
    buffer: list[Any] = []
    for sample in samples:
        buffer.append(sample)
        if len(buffer) >= size:
            index = rng.randrange(len(buffer))
            buffer[index], buffer[-1] = buffer[-1], buffer[index]
            yield buffer.pop()
    rng.shuffle(buffer)
    yield from buffer


def _fields(sample: Mapping[str, Any]) -> list[str]:
    return sorted(key for key in sample if not key.startswith("__"))


def _is_local(url: str) -> bool:
    """Whether a shard's URL is a path here (not a URL nor a ``pipe:`` command)."""
    return "://" not in url and not url.startswith(("pipe:", "file:"))


@dataclass
class WdsShards:
    """WebDataset tar shards (local paths or webdataset URLs); a sample is ``KEY.jpg|png|webp``
    with its class in ``KEY.cls``, or in a ``KEY.json`` field named by ``target_key``.
    ``source`` names the split in errors; ``num_classes`` bounds the labels."""

    urls: tuple[str, ...]
    input_key: str = "jpg;png;webp;jpeg"
    target_key: str | None = None
    source: str = "WebDataset"
    num_classes: int | None = None

    def __len__(self) -> int:
        return len(self.urls)

    @property
    def local(self) -> bool:
        """Whether every shard is a file here (not a URL nor a ``pipe:`` command)."""
        return all(_is_local(url) for url in self.urls)

    def read(self, shard: int) -> Iterator[dict[str, Any]]:
        from webdataset.tariterators import tarfile_samples

        yield from tarfile_samples([{"url": self.urls[shard]}])

    def decode(self, sample: dict[str, Any]) -> tuple[Image.Image, int]:
        """``(RGB image, class index)`` by :func:`~ssog.data.samples.checked_sample`."""
        where = f"{self.source}, shard {sample.get('__url__')}, sample {sample.get('__key__')}"
        key = next((k for k in self.input_key.split(";") if k in sample), None)
        if key is None:
            raise SampleError(f"{where}: no image ({self.input_key.replace(';', ', ')}); it holds {_fields(sample)}")
        return checked_sample(sample[key], self._label(sample, where), channels=3, num_classes=self.num_classes,
                              where=where)

    def _label(self, sample: dict[str, Any], where: str) -> Any:
        if not self.target_key:
            if "cls" not in sample:
                raise SampleError(f"{where}: no label (no .cls, the class index; or name a .json field with "
                                  f"dataset_kwargs.target_key); it holds {_fields(sample)}")
            return sample["cls"]
        if "json" not in sample:
            raise SampleError(f"{where}: no .json, whose field {self.target_key!r} (dataset_kwargs.target_key) is "
                              f"the label; it holds {_fields(sample)}")
        try:
            fields = json.loads(sample["json"])
        except ValueError as error:
            raise SampleError(f"{where}: its .json is not valid JSON ({error})") from None
        if not isinstance(fields, dict) or self.target_key not in fields:
            found = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
            raise SampleError(f"{where}: its .json has no field {self.target_key!r} (dataset_kwargs.target_key); "
                              f"it has {found}")
        return fields[self.target_key]


@dataclass
class HfShards:
    """The shards (data files) of a streamed Hugging Face dataset split. ``source`` names the
    split in errors; ``num_classes`` bounds the labels."""

    name: str
    root: str | None
    split: str
    input_key: str = "image"
    target_key: str = "label"
    source: str = "Hugging Face dataset"
    num_classes: int | None = None

    @cached_property
    def dataset(self):
        import datasets

        stream = datasets.load_dataset(self.name, split=self.split, streaming=True, cache_dir=self.root)
        return stream.cast_column(self.input_key, datasets.Image(decode=False))  # decoded after the shuffle

    def __len__(self) -> int:
        return self.dataset.num_shards

    @property
    def local(self) -> bool:
        """Whether the dataset is a folder here (not one of the hub)."""
        return Path(self.name).is_dir()

    def __getstate__(self) -> dict[str, Any]:  # to loader workers without the open stream
        return {k: v for k, v in self.__dict__.items() if k != "dataset"}

    def read(self, shard: int) -> Iterator[dict[str, Any]]:
        """The items of shard ``shard``, each with its place (``__shard__``, ``__index__``)."""
        for index, item in enumerate(self.dataset.shard(num_shards=len(self), index=shard)):
            yield {**item, "__shard__": shard, "__index__": index}

    def decode(self, item: dict[str, Any]) -> tuple[Image.Image, int]:
        """``(RGB image, class index)`` by :func:`~ssog.data.samples.checked_sample`."""
        where = f"{self.source}, shard {item.get('__shard__')}, item {item.get('__index__')}"
        missing = [key for key in (self.input_key, self.target_key) if item.get(key) is None]
        if missing:
            raise SampleError(f"{where}: no {' nor '.join(map(repr, missing))} (dataset_kwargs.input_key, "
                              f"target_key); it holds {_fields(item)}")
        image = item[self.input_key]
        encoded = (image.get("bytes") or image.get("path")) if isinstance(image, dict) else image
        if encoded is None:
            raise SampleError(f"{where}: its {self.input_key!r} holds neither image bytes nor a path; it holds "
                              f"{_fields(image)}")
        return checked_sample(encoded, item[self.target_key], channels=3, num_classes=self.num_classes, where=where)


class ShardStream(IterableDataset):
    """``(image tensor, class index)`` samples of sharded data, read shard by shard.

    Training (``train=True``): each epoch orders the shards by a permutation seeded by
    ``(seed, epoch)`` and deals them round-robin to the ``world_size x num_workers`` readers;
    a reader shuffles each shard's samples in a buffer of ``shuffle_size`` seeded by ``(seed,
    epoch, shard)``, transforms each sample under RNGs seeded by the sample, and goes round
    its shards again when they run out (the epoch is cut at ``num_samples // batch`` steps by
    :class:`StreamLoader`). Each sample also carries its reader and how many of the reader's
    shards are finished once it is consumed, the position a checkpoint keeps: a reader told
    by :meth:`set_epoch` that it had finished ``k`` shards starts at its ``k``-th.
    Evaluation (``train=False``): every shard once, in order, split over the readers.
    """

    def __init__(self, shards: WdsShards | HfShards, num_samples: int, *, train: bool,
                 shuffle_size: int = SHUFFLE_SIZE):
        self.shards, self.num_samples, self.train, self.shuffle_size = shards, num_samples, train, shuffle_size
        self.transform: Callable | None = None
        self.seed, self.rank, self.world_size = 0, 0, 1
        self.finished: dict[int, int]  # shards each reader has finished this epoch
        self.epoch, self.finished = 0, {}

    def __len__(self) -> int:
        return self.num_samples

    def configure(self, transform: Callable, seed: int, rank: int, world_size: int) -> "ShardStream":
        self.transform, self.seed, self.rank, self.world_size = transform, seed, rank, world_size
        return self

    def set_epoch(self, epoch: int, finished: Mapping[int, int] | None = None) -> None:
        """Read epoch ``epoch``, each reader skipping the ``finished[reader]`` shards it had done."""
        self.epoch, self.finished = epoch, dict(finished or {})

    def shards_of(self, reader: int, readers: int) -> int:
        """How many shards an epoch deals to ``reader`` of ``readers``."""
        return len(range(reader, len(self.shards), readers))

    def check_first_samples(self, count: int = FIRST_SAMPLES) -> None:
        """Decode the first ``count`` samples of the first shard where the shards are local
        (cheap): a split whose samples do not decode or lack a label fails before training."""
        if self.shards.local and len(self.shards):
            for sample in islice(self.shards.read(0), count):
                self.shards.decode(sample)

    def check_readers(self, readers: int) -> None:
        """A training stream needs a shard for each of its ``readers`` (processes x workers)."""
        if self.train and len(self.shards) < readers:
            raise ValueError(f"{len(self.shards)} shard(s) cannot feed {readers} readers (processes x loader "
                             "workers, num_workers 0 counting as 1); lower num_workers or write more shards")

    def _reader(self) -> tuple[int, int]:
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        return self.rank * workers + worker_id, self.world_size * workers

    def _order(self) -> list[int]:
        if not self.train:
            return list(range(len(self.shards)))
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.shards)).tolist()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        assert self.transform is not None, "configure() the stream first"
        reader, readers = self._reader()
        mine = self._order()[reader::readers]
        if not self.train:
            for shard in mine:
                for sample in self.shards.read(shard):
                    image, target = self.shards.decode(sample)
                    yield self.transform(image), target
            return
        for done in count(self.finished.get(reader, 0)):
            shard = mine[done % len(mine)]
            rng = random.Random(sample_seed(self.seed, self.epoch, shard))
            samples = _buffered_shuffle(self.shards.read(shard), self.shuffle_size, rng)
            previous = next(samples, None)
            for index in count():
                if previous is None:
                    break
                current = next(samples, None)
                image, target = self.shards.decode(previous)
                with seeded_rngs(sample_seed(self.seed, self.epoch, shard * 2**32 + index)):
                    image = self.transform(image)
                yield image, target, reader, done + (current is None)
                previous = current


class StreamLoader:
    """Training batches of an iterable source, ``batches`` per epoch.

    For a :class:`ShardStream` it records each reader's shard position (:meth:`state_dict`),
    from which :meth:`set_epoch` resumes; timm's own iterable datasets (``tfds/``) restart
    the epoch's stream (:attr:`resumes_in_epoch` is False).
    """

    def __init__(self, loader: DataLoader, batches: int, readers: int):
        self.dataset: Any  # a ShardStream, or timm's iterable dataset (its set_epoch)
        self.loader, self.dataset, self.batches, self.readers = loader, loader.dataset, batches, readers
        self.resumes_in_epoch = isinstance(self.dataset, ShardStream)
        self.finished: dict[int, int]
        self.start, self.finished = 0, {}
        self.said_repeats = False

    def __len__(self) -> int:
        return self.batches - self.start

    def set_epoch(self, epoch: int, batch: int = 0) -> None:
        """Start epoch ``epoch`` at batch ``batch``: from the positions of :meth:`load_state_dict`,
        or, for a new epoch (``batch`` 0), every reader at its first shard."""
        if batch == 0:
            self.finished = {}
        self.start = batch
        if self.resumes_in_epoch:
            self.dataset.set_epoch(epoch, self.finished)
        else:
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = iter(self.loader)
        for _ in range(self.batches - self.start):
            images, targets, *position = next(batches)
            if position:
                reader, finished = int(position[0][-1]), int(position[1][-1])
                self.finished[reader] = finished
                self._say_repeats(reader, finished)
            yield images, targets

    def _say_repeats(self, reader: int, finished: int) -> None:
        """Warn once when ``reader`` has finished a shard a second time in the epoch: the epoch
        is longer than the shards hold (a reader short of its share by less than a shard, as
        shards of unequal lengths leave some, is not worth a warning)."""
        shards = self.dataset.shards_of(reader, self.readers)
        if finished > shards and not self.said_repeats:
            self.said_repeats = True
            logger.warning(f"{self.dataset.shards.source}: reader {reader} of {self.readers} has read its {shards} "
                           f"shard(s) and started them again within the epoch: num_samples ({len(self.dataset)}) is "
                           "more than the shards hold, so samples repeat within each epoch; set num_samples "
                           "(dataset_kwargs.num_samples, or the split's num_samples in _info.json) to what they hold")

    def state_dict(self) -> dict[str, Any]:
        return {"readers": self.readers, "finished": dict(self.finished)}

    def load_state_dict(self, state: Mapping[str, Any]) -> bool:
        """Take a checkpoint's positions; False when they cannot be used (another number of
        readers, processes x loader workers, or a source that restarts its epochs)."""
        self.finished = {}
        if not self.resumes_in_epoch or state.get("readers") != self.readers:
            return False
        self.finished = {int(k): int(v) for k, v in state["finished"].items()}
        return True


_SHARDS_SYNTAX = "NAME-{0000..0099}.tar|SAMPLES"


def _wds_info(root: str) -> tuple[dict[str, Any], Path | None]:
    """``root/_info.json`` (or ``info.json``) read, and its path; ``{}`` and None without one."""
    for candidate in ("_info.json", "info.json"):
        path = Path(root) / candidate
        if path.is_file():
            try:
                info = json.loads(path.read_text())
            except ValueError as error:
                raise ValueError(f"WebDataset {root}: {path} is not valid JSON ({error}); fix it, or give the "
                                 f"shards as {_SHARDS_SYNTAX}") from None
            if not isinstance(info, dict):
                raise ValueError(f"WebDataset {root}: {path} holds a {type(info).__name__}, not timm's object "
                                 '{"splits": {NAME: {"filenames": [...], "num_samples": N}}}')
            return info, path
    return {}, None


def _split_urls(root: str, split: str) -> tuple[list[str], int | None, int | None, dict[str, Any]]:
    """timm's WebDataset split syntax: a name in ``root/_info.json`` (``splits: {name: {filenames,
    num_samples, shard_lengths}}``), or shard names in brace notation with ``|count``
    (``train-{0000..0146}.tar|1281167``). Returns the shards' URLs, ``num_samples``, the samples
    the shards hold (the sum of ``shard_lengths``; None when not given) and ``_info.json``.
    A local shard that does not exist is an error."""
    from webdataset.shardlists import expand_urls

    info, path = _wds_info(root)
    held = None
    if ".tar" in split or ".." in split:
        pattern, _, samples = split.partition("|")
        names, num_samples, listing = expand_urls(pattern), int(samples) if samples else None, "the split's pattern"
    else:
        splits = info.get("splits") or {}
        if split not in splits:
            raise ValueError(f"WebDataset {root}: no split {split!r} in its _info.json (splits: {sorted(splits)}); "
                             f"name a split there, or give shards as {_SHARDS_SYNTAX}")
        entry = splits[split]
        if not isinstance(entry, dict) or not isinstance(entry.get("filenames"), list):
            raise ValueError(f"WebDataset {root}: split {split!r} of {path} has no list of 'filenames'")
        names, num_samples, listing = list(entry["filenames"]), entry.get("num_samples"), str(path)
        assert path is not None  # the splits came from its _info.json
        _check_listed_shards(names, root, split, path)
        lengths = entry.get("shard_lengths")
        held = sum(lengths) if isinstance(lengths, list) and len(lengths) == len(names) else None
    urls = [name if "://" in name or name.startswith(("/", "pipe:")) else str(Path(root) / name) for name in names]
    missing = [url for url in urls if _is_local(url) and not Path(url).is_file()]
    if missing:
        raise ValueError(f"WebDataset {root}: {len(missing)} of the {len(urls)} shards of split {split!r} are "
                         f"missing: {shown_names(missing, 3)} (listed by {listing})")
    truncated = [url for url in urls if _is_local(url) and url.endswith(".tar") and not _ends_as_a_tar(Path(url))]
    if truncated:
        raise ValueError(f"WebDataset {root}: {len(truncated)} of the {len(urls)} shards of split {split!r} are "
                         f"truncated (no end-of-archive blocks): {shown_names(truncated, 3)}; write them again")
    return urls, num_samples, held, info


def _ends_as_a_tar(path: Path) -> bool:
    """Whether the tar file ``path`` ends with its end-of-archive marker (two zero 512-byte
    blocks, which every tar writer appends): a shard cut off at a member's end reads as a
    shorter, valid one, and its lost samples would go unnoticed."""
    size = path.stat().st_size
    if size < 1024 or size % 512:
        return False
    with open(path, "rb") as shard:
        shard.seek(size - 1024)
        return not any(shard.read(1024))


def _check_listed_shards(names: list[Any], root: str, split: str, path: Path) -> None:
    """Raise ValueError unless every shard ``_info.json`` (``path``) lists for ``split`` is a file
    name inside the data folder ``root``: a file there is data, and never makes ssog read a file
    elsewhere, a URL or a ``pipe:`` command (those the user names in the split's pattern only)."""
    folder = Path(root).resolve()
    for name in names:
        inside = isinstance(name, str) and _is_local(name) and not Path(name).is_absolute()
        if inside:
            try:
                (folder / name).resolve().relative_to(folder)
            except ValueError:
                inside = False
        if not inside:
            raise ValueError(f"WebDataset {root}: split {split!r} of {path} lists the shard {name!r}, which is not "
                             f"inside {root}; shards listed in _info.json must be files of the data folder (give "
                             f"others as the split's pattern, {_SHARDS_SYNTAX})")


def _stream(name: str, root: str | None, split: str, train: bool, options: Mapping[str, Any],
            num_classes: int | None) -> tuple[ShardStream, list[str]]:
    prefix, _, source = name.partition("/")
    stream_options = {k: options[k] for k in _STREAM_OPTIONS if options.get(k) is not None}
    keys = {k: stream_options[k] for k in ("input_key", "target_key") if k in stream_options}
    shards: WdsShards | HfShards
    if prefix.lower() == "wds":
        try:
            import webdataset  # noqa: F401
        except ImportError:
            raise ValueError(f"dataset {name} needs the webdataset package: {DATA_EXTRA}") from None
        base = root or source
        if not base:
            raise ValueError(f"dataset {name}: give the shards' folder as data_dir")
        urls, num_samples, held, info = _split_urls(base, split)
        shards = WdsShards(tuple(urls), **keys, source=f"dataset {name} split {split!r}")
        classes = info.get("classes") or [str(c) for c in range(num_classes or info.get("num_classes") or 0)]
    else:
        try:
            import datasets  # noqa: F401
        except ImportError:
            raise ValueError(f"dataset {name} needs the datasets package: {DATA_EXTRA}") from None
        shards, held = HfShards(source, root, split, **keys, source=f"dataset {name} split {split!r}"), None
        try:
            features = shards.dataset.features
        except ValueError as error:  # datasets' unknown split
            raise ValueError(f"dataset {name}: {error}") from None
        label = features.get(shards.target_key) if features else None
        classes = list(getattr(label, "names", None) or [str(c) for c in range(num_classes or 0)])
        num_samples = _hf_num_samples(shards) if "num_samples" not in stream_options else None
    num_samples = stream_options.get("num_samples", num_samples)
    if num_samples is None:
        raise ValueError(f"dataset {name} split {split!r}: the number of samples is unknown; set "
                         "dataset_kwargs.num_samples (the schedule needs the steps per epoch)")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"dataset {name} split {split!r}: num_samples is {num_samples!r} (_info.json or "
                         "dataset_kwargs.num_samples); a split needs a whole number >= 1 of samples")
    if train and held is not None and int(num_samples) > held:
        logger.warning(f"dataset {name} split {split!r}: its shards hold {held} samples (_info.json shard_lengths) "
                       f"but num_samples is {num_samples}: each epoch repeats samples to make up the difference; "
                       f"set num_samples (dataset_kwargs.num_samples, or in _info.json) to {held} or fewer")
    if num_classes is not None:
        classes = classes if len(classes) == num_classes else [str(c) for c in range(num_classes)]
    stream = ShardStream(shards, int(num_samples), train=train,
                         shuffle_size=int(stream_options.get("shuffle_size", SHUFFLE_SIZE)))
    return stream, classes


def _hf_num_samples(shards: HfShards) -> int:
    """A streamed split's length: its metadata's, else counted from the label column alone."""
    info = shards.dataset.info
    split = (info.splits or {}).get(shards.split)
    if split is not None and split.num_examples:
        return split.num_examples
    return sum(1 for _ in shards.dataset.select_columns([shards.target_key]))


def _timm_iterable(name: str, root: str | None, split: str, train: bool, download: bool, seed: int,
                   options: Mapping[str, Any]) -> Dataset:
    """``tfds/``: timm's own reader (TensorFlow datasets), which resumes at the epoch's start."""
    from timm.data import create_dataset

    try:
        return create_dataset(name, root=root, split=split, is_training=train, download=download, seed=seed,
                              **options)
    except ImportError as error:
        raise ValueError(f"dataset {name} needs the {error.name} package (pip install tensorflow "
                         "tensorflow-datasets)") from None


def stream_datasets(
    name: str,
    root: str | None,
    *,
    train_split: str,
    val_split: str,
    download: bool,
    seed: int,
    options: Mapping[str, Any],
    num_classes: int | None,
) -> tuple[Dataset, Dataset, DatasetInfo]:
    """The ``(train, val, info)`` of an iterable source, ``val_split`` naming its validation
    split. ``options`` (``dataset_kwargs``): the :class:`ShardStream` readers take ``input_key``,
    ``target_key``, ``shuffle_size`` and ``num_samples``, timm's ``tfds/`` reader all of them;
    ``num_classes`` sets the class count where the source does not say it (WebDataset without
    ``classes`` in its ``_info.json``, ``tfds/``)."""
    if name.lower().startswith("tfds/"):
        train = _timm_iterable(name, root, train_split, True, download, seed, options)
        val = _timm_iterable(name, root, val_split, False, download, seed, options)
        classes = [str(c) for c in range(num_classes or 0)]
    else:
        train, classes = _stream(name, root, train_split, True, options, num_classes)
        val, _ = _stream(name, root, val_split, False, options, num_classes)
    if len(classes) == 1:
        raise ValueError(f"dataset {name}: it names 1 class ({classes[0]!r}); a classifier needs at least 2")
    if len(classes) < 2:
        raise ValueError(f"dataset {name}: cannot tell the number of classes; set num_classes")
    for stream in (train, val):
        if isinstance(stream, ShardStream):
            stream.shards.num_classes = len(classes)
            stream.check_first_samples()
    return train, val, timm_source_info(name, classes, 3, 0)


def stream_readers(world_size: int, num_workers: int) -> int:
    """How many readers share a stream: processes x loader workers (0 workers: the process)."""
    return world_size * max(1, num_workers)
