"""The shards of timm's iterable sources that :class:`~ssog.data.streams.ShardStream` reads:
``wds/`` (WebDataset tar shards, listed by ``_info.json`` or a brace pattern) and ``hfids/`` (a
streamed Hugging Face dataset's data files), each reading one shard's samples and decoding one
sample by :func:`~ssog.data.samples.checked_sample`, its errors naming the split, the shard and
the sample. Before training every listed local shard must exist and end as a tar file, and the
shards ``_info.json`` lists must lie inside the data folder.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Mapping

from PIL import Image

from ssog.data.info import shown_names
from ssog.data.samples import SampleError, checked_sample

__all__ = ["WdsShards", "HfShards", "wds_split", "hf_num_samples"]


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


def wds_split(root: str, split: str) -> tuple[list[str], int | None, int | None, dict[str, Any]]:
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


def hf_num_samples(shards: HfShards) -> int:
    """A streamed split's length: its metadata's, else counted from the label column alone."""
    info = shards.dataset.info
    split = (info.splits or {}).get(shards.split)
    if split is not None and split.num_examples:
        return split.num_examples
    return sum(1 for _ in shards.dataset.select_columns([shards.target_key]))
