"""Data and model construction from a :class:`TrainConfig`, shared by training and evaluation."""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import timm
import torch
from torch.utils.data import DataLoader

import ssog.models  # noqa: F401  (registers the ssog models with timm)
from ssog.data import (
    DatasetInfo, TransformedDataset, build_datasets, build_loader, build_transform, evaluation_folder,
    training_subset,
)
from ssog.train.config import TIMM_INIT_PREFIX, TrainConfig
from ssog.train.distributed import DistContext, barrier

__all__ = ["DataBundle", "build_data", "build_eval_data", "build_model", "RESERVED_MODEL_KWARGS"]

# Set from the data set and the config's own fields, never through model_kwargs.
RESERVED_MODEL_KWARGS = {
    "num_classes": "the data set", "in_chans": "the data set", "img_size": "img_size",
    "drop_path_rate": "drop_path", "pretrained": "init_from",
}


@dataclass
class DataBundle:
    info: DatasetInfo
    img_size: int
    train_loader: DataLoader
    val_loader: DataLoader


def _datasets(cfg: TrainConfig, ctx: DistContext):
    def make():
        train, val, info = build_datasets(
            cfg.dataset, cfg.data_dir, download=cfg.download, val_split=cfg.val_split,
            split_seed=cfg.split_seed, synthetic_size=cfg.synthetic_size,
            synthetic_classes=cfg.synthetic_classes, synthetic_img_size=cfg.img_size or 32,
            skip_bad_images=cfg.skip_bad_images,
        )
        if cfg.train_subset is not None:
            train = training_subset(train, cfg.train_subset, cfg.split_seed)
        return train, val, info if cfg.crop_pct is None else dataclasses.replace(info, crop_pct=cfg.crop_pct)

    if cfg.download and ctx.distributed:  # one process downloads, the others wait and read
        splits = make() if ctx.is_main else None
        barrier(ctx)
        return splits or make()
    return make()


def _local_batch(cfg: TrainConfig, ctx: DistContext) -> int:
    if cfg.batch_size % ctx.world_size:
        raise ValueError(f"batch_size {cfg.batch_size} must be divisible by the number of processes {ctx.world_size}")
    return cfg.batch_size // ctx.world_size


def _eval_loader(dataset, info: DatasetInfo, img_size: int, batch: int, cfg: TrainConfig,
                 ctx: DistContext) -> DataLoader:
    transform = build_transform("none", img_size, info.mean, info.std, train=False, crop_pct=info.crop_pct)
    return build_loader(TransformedDataset(dataset, transform), batch, train=False, rank=ctx.rank,
                        world_size=ctx.world_size, num_workers=cfg.num_workers,
                        pin_memory=ctx.device.type == "cuda")


def build_data(cfg: TrainConfig, ctx: DistContext) -> DataBundle:
    """Datasets, transforms and loaders for this process (``cfg.batch_size`` is global)."""
    local_batch = _local_batch(cfg, ctx)
    train_base, val_base, info = _datasets(cfg, ctx)
    img_size = cfg.img_size or info.native_size
    train_tf = build_transform(cfg.augment, img_size, info.mean, info.std, train=True,
                               crop_pct=info.crop_pct, allow_hflip=info.hflip)
    train_loader = build_loader(TransformedDataset(train_base, train_tf, seed=cfg.seed), local_batch, train=True,
                                seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size,
                                num_workers=cfg.num_workers, pin_memory=ctx.device.type == "cuda")
    if len(train_loader) == 0:
        raise ValueError(
            f"the training set ({len(train_base)} samples, {len(train_base) // ctx.world_size} per process) "
            f"is smaller than one batch ({local_batch} per process); lower batch_size"
        )
    val_loader = _eval_loader(val_base, info, img_size, local_batch, cfg, ctx)
    return DataBundle(info, img_size, train_loader, val_loader)


def build_eval_data(cfg: TrainConfig, ctx: DistContext, split: str = "val",
                    folder: str | None = None) -> tuple[DataLoader, DatasetInfo]:
    """An evaluation loader (no augmentation) over the ``train`` or ``val`` split at ``cfg.img_size``,
    or over every image of an ImageFolder ``folder`` (``folder/<split>`` if it exists; see
    :func:`~ssog.data.evaluation_folder`)."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if folder is not None:
        dataset, info = evaluation_folder(folder, split, cfg.skip_bad_images)
        if cfg.crop_pct is not None:
            info = dataclasses.replace(info, crop_pct=cfg.crop_pct)
    else:
        train_base, val_base, info = _datasets(cfg, ctx)
        dataset = val_base if split == "val" else train_base
    img_size = cfg.img_size or info.native_size
    return _eval_loader(dataset, info, img_size, _local_batch(cfg, ctx), cfg, ctx), info


def build_model(cfg: TrainConfig, num_classes: int, in_chans: int, img_size: int,
                load_timm_weights: bool = False) -> torch.nn.Module:
    """``timm.create_model(cfg.model, **cfg.model_kwargs)`` sized for the data.

    With ``init_from="timm:NAME"`` the model is timm's ``NAME`` made SSoG by
    :func:`ssog.convert` (``model_kwargs`` are its SSoG options), and with
    ``load_timm_weights`` it starts from NAME's pretrained weights where a hub is reachable
    (random weights, with a warning, where it is not).
    """
    if cfg.init_from and cfg.init_from.startswith(TIMM_INIT_PREFIX):
        return _converted_timm_model(cfg, cfg.init_from[len(TIMM_INIT_PREFIX):], num_classes, in_chans, img_size,
                                     load_timm_weights)
    for key, source in RESERVED_MODEL_KWARGS.items():
        if key in cfg.model_kwargs:
            raise ValueError(f"model_kwargs may not set {key!r}: it comes from {source}")
    if not timm.is_model(cfg.model):
        ours = timm.list_models("ssog_*") + timm.list_models("mha_*")
        raise ValueError(f"unknown model {cfg.model!r}; ssog models: {', '.join(ours) or 'none registered'}")
    try:
        return timm.create_model(cfg.model, num_classes=num_classes, in_chans=in_chans, img_size=img_size,
                                 drop_path_rate=cfg.drop_path, **cfg.model_kwargs)
    except TypeError as error:  # an option the model does not take
        raise ValueError(f"cannot create {cfg.model} with model_kwargs {cfg.model_kwargs}: {error}") from error


def _converted_timm_model(cfg: TrainConfig, name: str, num_classes: int, in_chans: int, img_size: int,
                          pretrained: bool) -> torch.nn.Module:
    from ssog.conversion import convert

    if not timm.is_model(name):
        raise ValueError(f"--init-from timm:{name}: timm has no model {name!r}")
    args = dict(num_classes=num_classes, in_chans=in_chans, img_size=img_size, drop_path_rate=cfg.drop_path)
    try:
        model = timm.create_model(name, pretrained=pretrained, **args)
    except Exception as error:  # no network / no hub access: the hub client's own error types
        if not pretrained:
            raise
        print(f"warning: no pretrained weights for timm:{name} ({type(error).__name__}); "
              "starting from timm's random initialisation", file=sys.stderr)
        model = timm.create_model(name, pretrained=False, **args)
    try:
        return convert(model, **cfg.model_kwargs)
    except TypeError as error:
        raise ValueError(f"cannot convert timm:{name} with SSoG options {cfg.model_kwargs}: {error}") from error
