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

The shards themselves (listing, reading, decoding a sample) are :mod:`ssog.data.shards`'s.
Before training the first samples of each split must decode, and an epoch longer than the
shards hold is a warning.
"""
from __future__ import annotations

import logging
import random
from itertools import count, islice
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from ssog.data.info import DATA_EXTRA, DatasetInfo, timm_source_info
from ssog.data.loader import sample_seed, seeded_rngs
from ssog.data.samples import FIRST_SAMPLES
from ssog.data.shards import HfShards, WdsShards, hf_num_samples, wds_split

__all__ = ["SHUFFLE_SIZE", "ShardStream", "StreamLoader", "stream_datasets", "stream_readers"]

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
        urls, num_samples, held, info = wds_split(base, split)
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
        num_samples = hf_num_samples(shards) if "num_samples" not in stream_options else None
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
