"""Data and model construction from a :class:`TrainConfig`, shared by training and evaluation,
and the learning-rate schedule a training run steps."""
from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Sequence

import timm
import torch
from timm.models import get_pretrained_cfg, model_entrypoint
from timm.scheduler import create_scheduler_v2
from torch.utils.data import DataLoader, Dataset, IterableDataset

import ssog.models  # noqa: F401  (registers the ssog models with timm)
from ssog.models._registry import did_you_mean
from ssog.data import (
    DatasetInfo, StopSafeDataLoader, TransformedDataset, build_datasets, build_loader, build_transform,
    evaluation_folder, training_subset,
)
from ssog.data.custom import CUSTOM_DATASET, custom_datasets
from ssog.data.memory import memory_datasets
from ssog.data.data_config import resolve_data_config
from ssog.data.streams import ShardStream, StreamLoader, stream_readers
from ssog.runtime import is_out_of_memory
from ssog.train.config import BUILT_IN_DATA, TIMM_INIT_PREFIX, TrainConfig
from ssog.train.distributed import DistContext, barrier

__all__ = [
    "DataBundle", "GRAD_CHECKPOINTING", "ModelBuildError", "build_data", "build_eval_data", "build_model",
    "build_scheduler",
    "RESERVED_MODEL_KWARGS", "apply_data_config", "model_pretrained_cfg", "run_data_config", "takes_img_size",
]

#: The ``model_kwargs`` entry that turns on the built model's activation checkpointing
#: (``set_grad_checkpointing``, timm's ``--grad-checkpointing``) instead of reaching its constructor.
GRAD_CHECKPOINTING = "grad_checkpointing"
# Set from the data set and the config's own fields, never through model_kwargs.
RESERVED_MODEL_KWARGS = {
    "num_classes": "the data set", "in_chans": "the data set", "img_size": "img_size",
    "drop_path_rate": "drop_path", "pretrained": "init_from", "checkpoint_path": "init_from",
    "cache_dir": "init_from", "pretrained_cfg": "the run's data config",
    "pretrained_cfg_overlay": "the run's data config",
}


class ModelBuildError(ValueError):
    """The run's model cannot be built from its settings (``model``, ``model_kwargs``): a
    setting to fix, never a data source that is missing."""


@dataclass
class DataBundle:
    """A run's data: the source's ``info``, the resolved ``data_config`` (timm's keys:
    ``input_size``, ``mean``, ``std``, ``crop_pct``, ``interpolation``, ``crop_mode``), the
    training loader (a :class:`~torch.utils.data.DataLoader` over an
    :class:`~ssog.data.EpochSampler`, or a :class:`~ssog.data.streams.StreamLoader` for an
    iterable source) and the validation loader. The training loader yields micro-batches of
    ``micro_batch`` images, ``grad_accum_steps`` of them per optimizer step; ``local_batch``
    is this process's images per optimizer step."""

    info: DatasetInfo
    data_config: dict[str, Any]
    train_loader: DataLoader | StreamLoader
    val_loader: DataLoader
    local_batch: int
    grad_accum_steps: int = 1

    @property
    def micro_batch(self) -> int:
        return self.local_batch // self.grad_accum_steps

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (a last partial step's micro-batches are dropped)."""
        batches = self.stream.batches if self.stream is not None else len(self.train_loader)
        return batches // self.grad_accum_steps

    @property
    def img_size(self) -> int | tuple[int, int]:
        """The input size in pixels: the side, or ``(H, W)`` when not square."""
        return _side(self.data_config)

    @property
    def stream(self) -> StreamLoader | None:
        """The training loader when the source is iterable."""
        return self.train_loader if isinstance(self.train_loader, StreamLoader) else None

    def start_epoch(self, epoch: int, step: int = 0) -> None:
        """Position the training loader at step ``step`` of epoch ``epoch`` (0-based)."""
        if isinstance(self.train_loader, StreamLoader):
            self.train_loader.set_epoch(epoch, step * self.grad_accum_steps)
        else:
            sampler: Any = self.train_loader.sampler  # build_loader's EpochSampler
            sampler.set_epoch(epoch, start=step * self.local_batch)


def _side(data_config: dict[str, Any]) -> int | tuple[int, int]:
    height, width = data_config["input_size"][1:]
    return height if height == width else (height, width)


def model_pretrained_cfg(cfg: TrainConfig) -> dict[str, Any]:
    """The ``pretrained_cfg`` of the run's model (of timm's NAME for ``init_from: timm:NAME``);
    empty for a name timm does not know (building the model then says so)."""
    init_from = cfg.init_from or ""
    name = init_from[len(TIMM_INIT_PREFIX):] if init_from.startswith(TIMM_INIT_PREFIX) else cfg.model
    try:
        pretrained = get_pretrained_cfg(name)
    except RuntimeError as error:  # a tag the architecture does not have
        raise ValueError(f"model {name!r}: {error}") from None
    return pretrained.to_dict() if pretrained is not None else {}


def run_data_config(cfg: TrainConfig, in_chans: int) -> dict[str, Any]:
    """The run's data config: ``img_size``, ``mean``, ``std``, ``crop_pct``, ``interpolation``
    where the config sets them, the rest from the model's ``pretrained_cfg`` (timm's
    ``resolve_data_config``), for data of ``in_chans`` channels."""
    return resolve_data_config(model_pretrained_cfg(cfg), in_chans, img_size=cfg.img_size, mean=cfg.mean,
                               std=cfg.std, crop_pct=cfg.crop_pct, interpolation=cfg.interpolation)


def _datasets(cfg: TrainConfig, ctx: DistContext):
    if cfg.dataset == CUSTOM_DATASET:
        raise ValueError(f"dataset {CUSTOM_DATASET!r}: the run trained on datasets given in Python; name a data "
                         "source (--dataset, --data-dir) to evaluate it, or pass the datasets again to train()")

    if cfg.data_hint and cfg.data_dir is None and cfg.dataset not in BUILT_IN_DATA:
        raise ValueError(f"dataset {cfg.dataset} needs --data-dir (data_dir): {cfg.data_hint}")

    def make():
        train, val, info = build_datasets(
            cfg.dataset, cfg.data_dir, download=cfg.download, val_split=cfg.val_split,
            split_seed=cfg.split_seed, synthetic_size=cfg.synthetic_size,
            synthetic_classes=cfg.synthetic_classes, synthetic_img_size=run_data_config(cfg, 3)["input_size"][-1],
            skip_bad_images=cfg.skip_bad_images, train_split=cfg.train_split, seed=cfg.seed,
            num_classes=cfg.num_classes, dataset_kwargs=cfg.dataset_kwargs,
        )
        if cfg.train_subset is not None:
            if isinstance(train, IterableDataset):
                raise ValueError(f"train_subset needs a map-style source; dataset {cfg.dataset} is read as a stream")
            train = training_subset(train, cfg.train_subset, cfg.split_seed)
        return train, val, info

    if cfg.download and ctx.distributed:  # one process downloads, the others wait and read
        splits = make() if ctx.is_main else None
        barrier(ctx)
        return splits or make()
    return make()


def _local_batch(cfg: TrainConfig, ctx: DistContext) -> int:
    """This process's images per optimizer step (checked to split into ``grad_accum_steps``)."""
    if cfg.batch_size % (ctx.world_size * cfg.grad_accum_steps):
        raise ValueError(f"batch_size {cfg.batch_size} must be divisible by the number of processes {ctx.world_size} "
                         f"x grad_accum_steps {cfg.grad_accum_steps}")
    return cfg.batch_size // ctx.world_size


def _transform(cfg: TrainConfig, data_config: dict[str, Any], info: DatasetInfo, train: bool):
    """The run's training (its augmentation level with the config's transform settings) or
    evaluation transform; the level's flips are off for data they relabel, an ``hflip`` set in
    the config is kept."""
    return build_transform(cfg.augmentation(), data_config["input_size"][1:], data_config["mean"], data_config["std"],
                           train=train, crop_pct=data_config["crop_pct"], interpolation=data_config["interpolation"],
                           allow_hflip=info.hflip or cfg.hflip is not None)


def _eval_loader(dataset, info: DatasetInfo, data_config: dict[str, Any], batch: int, cfg: TrainConfig,
                 ctx: DistContext) -> DataLoader:
    transform = _transform(cfg, data_config, info, train=False)
    pin_memory = ctx.device.type == "cuda"
    if isinstance(dataset, IterableDataset):  # each reader its shards, once
        _set_stream_transform(dataset, transform, cfg, ctx)
        return StopSafeDataLoader(dataset, batch_size=batch, num_workers=cfg.num_workers, pin_memory=pin_memory)
    return build_loader(TransformedDataset(dataset, transform), batch, train=False, rank=ctx.rank,
                        world_size=ctx.world_size, num_workers=cfg.num_workers, pin_memory=pin_memory)


def _set_stream_transform(dataset: IterableDataset, transform, cfg: TrainConfig, ctx: DistContext) -> None:
    if isinstance(dataset, ShardStream):
        dataset.configure(transform, cfg.seed, ctx.rank, ctx.world_size)
    else:  # timm's IterableImageDataset (tfds/), which splits itself over processes
        timm_stream: Any = dataset
        timm_stream.transform = transform
        timm_stream.set_loader_cfg(num_workers=cfg.num_workers)


def _stream_loader(dataset: IterableDataset, transform, micro_batch: int, cfg: TrainConfig,
                   ctx: DistContext) -> StreamLoader:
    readers = stream_readers(ctx.world_size, cfg.num_workers)
    if isinstance(dataset, ShardStream):
        dataset.check_readers(readers)
    _set_stream_transform(dataset, transform, cfg, ctx)
    samples = len(dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__
    steps = samples // cfg.batch_size
    if steps == 0:
        raise ValueError(f"the training stream ({samples} samples) is smaller than one batch "
                         f"({cfg.batch_size}); lower batch_size")
    loader = StopSafeDataLoader(dataset, batch_size=micro_batch, num_workers=cfg.num_workers,
                                pin_memory=ctx.device.type == "cuda", generator=torch.Generator().manual_seed(cfg.seed))
    return StreamLoader(loader, steps * cfg.grad_accum_steps, readers)


def build_data(cfg: TrainConfig, ctx: DistContext,
               datasets: tuple[Dataset, Dataset] | None = None) -> DataBundle:
    """Datasets, transforms and loaders for this process (``cfg.batch_size`` is global).

    ``datasets``: ``(train, val)`` given in Python (:func:`ssog.data.custom.custom_datasets`)
    instead of ``cfg.dataset``.
    """
    local_batch = _local_batch(cfg, ctx)
    if datasets is not None:
        train_base, val_base, info = custom_datasets(*datasets, num_classes=cfg.num_classes)
    else:
        train_base, val_base, info = _datasets(cfg, ctx)
    if cfg.num_classes is not None and cfg.num_classes != info.num_classes:
        raise ValueError(f"num_classes is {cfg.num_classes} but dataset {cfg.dataset} has {info.num_classes} "
                         "classes; leave num_classes unset")
    data_config = run_data_config(cfg, info.in_chans)
    micro_batch = local_batch // cfg.grad_accum_steps
    if cfg.data_in_memory:
        return _memory_data(cfg, ctx, train_base, val_base, info, data_config, local_batch)
    train_tf = _transform(cfg, data_config, info, train=True)
    train_loader: DataLoader | StreamLoader
    if isinstance(train_base, IterableDataset):
        train_loader = _stream_loader(train_base, train_tf, micro_batch, cfg, ctx)
    else:
        train_loader = build_loader(TransformedDataset(train_base, train_tf, seed=cfg.seed), micro_batch, train=True,
                                    seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size,
                                    num_workers=cfg.num_workers, pin_memory=ctx.device.type == "cuda")
        _check_one_step(train_loader, cfg, ctx, local_batch)
    val_loader = _eval_loader(val_base, info, data_config, micro_batch, cfg, ctx)
    return DataBundle(info, data_config, train_loader, val_loader, local_batch, cfg.grad_accum_steps)


def _check_one_step(train_loader: DataLoader, cfg: TrainConfig, ctx: DistContext, local_batch: int) -> None:
    if len(train_loader) < cfg.grad_accum_steps:
        samples = len(train_loader.dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__
        raise ValueError(f"the training set ({samples} samples, {samples // ctx.world_size} per process) is smaller "
                         f"than one batch ({local_batch} per process); lower batch_size")


def _memory_data(cfg: TrainConfig, ctx: DistContext, train_base: Dataset, val_base: Dataset, info: DatasetInfo,
                 data_config: dict[str, Any], local_batch: int) -> DataBundle:
    """:func:`build_data` with ``data_in_memory``: both splits decoded once (by ``num_workers``
    processes), batches augmented and served by the training process itself."""
    if isinstance(train_base, IterableDataset) or isinstance(val_base, IterableDataset):
        raise ValueError(f"data_in_memory needs a map-style source; dataset {cfg.dataset} is read as a stream")
    train, val = memory_datasets(train_base, val_base, data_config, cfg.augmentation(), seed=cfg.seed,
                                 allow_hflip=info.hflip or cfg.hflip is not None, num_workers=cfg.num_workers)
    micro_batch = local_batch // cfg.grad_accum_steps
    train_loader = build_loader(train, micro_batch, train=True, seed=cfg.seed, rank=ctx.rank,
                                world_size=ctx.world_size, pin_memory=ctx.device.type == "cuda")
    _check_one_step(train_loader, cfg, ctx, local_batch)
    val_loader = build_loader(val, micro_batch, train=False, rank=ctx.rank, world_size=ctx.world_size,
                              pin_memory=ctx.device.type == "cuda")
    return DataBundle(info, data_config, train_loader, val_loader, local_batch, cfg.grad_accum_steps)


def build_eval_data(cfg: TrainConfig, ctx: DistContext, split: str = "val",
                    folder: str | None = None) -> tuple[DataLoader, DatasetInfo, dict[str, Any]]:
    """An evaluation loader (no augmentation) over the ``train`` or ``val`` split with the run's
    data config, or over every image of an ImageFolder ``folder`` (``folder/<split>`` if it
    exists; see :func:`~ssog.data.evaluation_folder`); with the data's info and that config."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if folder is not None:
        dataset, info = evaluation_folder(folder, split, cfg.skip_bad_images)
    else:
        train_base, val_base, info = _datasets(cfg, ctx)
        dataset = val_base if split == "val" else train_base
        if isinstance(dataset, ShardStream) and dataset.train:
            raise ValueError(f"dataset {cfg.dataset} is read as a stream: evaluate its validation split")
    data_config = run_data_config(cfg, info.in_chans)
    batch = _local_batch(cfg, ctx) // cfg.grad_accum_steps
    return _eval_loader(dataset, info, data_config, batch, cfg, ctx), info, data_config


def apply_data_config(model: torch.nn.Module, data_config: dict[str, Any],
                      classes: Sequence[str] = ()) -> None:
    """Record a run's data config (and class names) in ``model.pretrained_cfg``, where timm's
    ``resolve_data_config(model=...)``, ``save_for_hf`` and the ONNX export read it."""
    pretrained = dict(getattr(model, "pretrained_cfg", None) or {})
    pretrained.update(data_config, num_classes=getattr(model, "num_classes", len(classes)))
    if classes and len(classes) == pretrained["num_classes"]:
        pretrained["label_names"] = list(classes)
    model.pretrained_cfg = model.default_cfg = pretrained  # type: ignore[assignment]  # torch: tensors, modules


def build_model(cfg: TrainConfig, num_classes: int, in_chans: int, img_size: int | tuple[int, int],
                load_timm_weights: bool = False) -> torch.nn.Module:
    """``timm.create_model(cfg.model, **cfg.model_kwargs)`` sized for the data.

    With ``init_from="timm:NAME"`` the model is timm's ``NAME`` made SSoG by
    :func:`ssog.convert` (``model_kwargs`` are its SSoG options), and with
    ``load_timm_weights`` it starts from NAME's pretrained weights (a ValueError naming
    ``init_from`` when they cannot be loaded). ``model_kwargs.grad_checkpointing: true`` is
    no constructor option: it calls the built model's ``set_grad_checkpointing()``, as timm's
    train.py does for ``--grad-checkpointing``; ``channels_last`` puts its 4-d weights in
    channels-last memory format.
    """
    kwargs = dict(cfg.model_kwargs)
    grad_checkpointing = kwargs.pop(GRAD_CHECKPOINTING, False)
    if not isinstance(grad_checkpointing, bool):
        raise ModelBuildError(f"model_kwargs {GRAD_CHECKPOINTING} must be true or false, got {grad_checkpointing!r}")
    if cfg.init_from and cfg.init_from.startswith(TIMM_INIT_PREFIX):
        model = _converted_timm_model(cfg, cfg.init_from[len(TIMM_INIT_PREFIX):], kwargs, num_classes, in_chans,
                                      img_size, load_timm_weights)
    else:
        model = _timm_model(cfg, kwargs, num_classes, in_chans, img_size)
    if grad_checkpointing:
        _enable_grad_checkpointing(model, cfg.model)
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


def _timm_model(cfg: TrainConfig, kwargs: dict[str, Any], num_classes: int, in_chans: int,
                img_size: int | tuple[int, int]) -> torch.nn.Module:
    """``timm.create_model(cfg.model, **kwargs)`` for the data."""
    for key, source in RESERVED_MODEL_KWARGS.items():
        if key in kwargs:
            raise ModelBuildError(f"model_kwargs may not set {key!r}: it comes from {source}")
    if not timm.is_model(cfg.model):
        raise ModelBuildError(f"unknown model {cfg.model!r} (--model); {did_you_mean(cfg.model, timm.list_models())}")
    args: dict[str, Any] = dict(num_classes=num_classes, in_chans=in_chans, drop_path_rate=cfg.drop_path)
    if takes_img_size(cfg.model):  # a model without a fixed input size (a CNN) does not: the transforms size the images
        args["img_size"] = img_size
    try:
        return timm.create_model(cfg.model, **args, **kwargs)
    except (TypeError, ValueError, ArithmeticError, RuntimeError) as error:
        # an option the model does not take, or a value it refuses or cannot build with (a size of 0
        # divides by zero, a negative one makes torch refuse the tensor); running out of memory is not
        if is_out_of_memory(error):
            raise
        reason = str(error) if isinstance(error, (TypeError, ValueError)) else f"{type(error).__name__}: {error}"
        raise ModelBuildError(f"cannot create {cfg.model} with model_kwargs {kwargs}: {reason}") from error


def _enable_grad_checkpointing(model: torch.nn.Module, name: str) -> None:
    """``model.set_grad_checkpointing(True)``, or a ValueError when the model has none."""
    timm_model: Any = model  # timm's models have set_grad_checkpointing; an AttributeError where not
    try:
        timm_model.set_grad_checkpointing(True)
    except (AttributeError, AssertionError, NotImplementedError) as error:
        raise ValueError(f"model {name} does not support gradient checkpointing (model_kwargs "
                         f"{GRAD_CHECKPOINTING}, --grad-checkpointing): {type(error).__name__}: {error}") from None


def takes_img_size(name: str) -> bool:
    """Whether timm's model ``name`` takes ``img_size``: its class's constructor has that
    argument, itself or, through ``**kwargs``, a base class's (as the ssog families pass theirs
    to ``ViTBase``). The class is the return annotation of timm's entrypoint for ``name``; an
    entrypoint that names no class of its own (annotated ``nn.Module``) is given ``img_size``."""
    entrypoint = model_entrypoint(name)
    try:
        cls = typing.get_type_hints(entrypoint).get("return")
    except (NameError, TypeError):  # an annotation that does not resolve here
        cls = None
    if not isinstance(cls, type) or cls is torch.nn.Module:
        return True
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(vars(klass)["__init__"]).parameters
        if "img_size" in parameters:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return False
    return False


def _converted_timm_model(cfg: TrainConfig, name: str, kwargs: dict[str, Any], num_classes: int, in_chans: int,
                          img_size: int | tuple[int, int], pretrained: bool) -> torch.nn.Module:
    from ssog.conversion import convert

    if not timm.is_model(name):
        raise ValueError(f"--init-from timm:{name}: timm has no model {name!r}")
    args: dict[str, Any] = dict(num_classes=num_classes, in_chans=in_chans, img_size=img_size,
                                drop_path_rate=cfg.drop_path)
    try:
        model = timm.create_model(name, pretrained=pretrained, **args)
    except Exception as error:  # no network / no hub access: the hub client's own error types
        if not pretrained:
            raise
        raise ValueError(f"init_from timm:{name}: cannot load timm's pretrained weights of {name} "
                         f"({type(error).__name__}: {error}); make them reachable (network, or timm's cache "
                         "in HF_HOME), or start from a checkpoint file with init_from") from error
    try:
        return convert(model, **kwargs)
    except TypeError as error:
        raise ValueError(f"cannot convert timm:{name} with SSoG options {kwargs}: {error}") from error


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, steps_per_epoch: int) -> tuple[Any, int]:
    """timm's ``create_scheduler_v2`` for ``cfg.sched`` and its options, stepped every optimizer
    step (plateau, which watches validation metrics, every epoch); with the number of epochs the
    schedule runs (``epochs`` + ``cooldown_epochs``, or more with warmup_prefix / cycles)."""
    per_epoch = cfg.sched == "plateau"
    # unset, timm's own default: timm before 1.0.31 multiplies decay_epochs unchecked
    decay: dict[str, Any] = {} if cfg.decay_epochs is None else {"decay_epochs": cfg.decay_epochs}
    try:
        return create_scheduler_v2(
            optimizer, sched=cfg.sched, num_epochs=cfg.epochs, **decay,
            # timm annotates milestones and warmup as whole epochs; with updates_per_epoch it takes fractions
            decay_milestones=cfg.decay_milestones,  # type: ignore[arg-type]
            decay_rate=cfg.decay_rate, patience_epochs=cfg.patience_epochs, cooldown_epochs=cfg.cooldown_epochs,
            warmup_epochs=cfg.warmup_epochs,  # type: ignore[arg-type]
            warmup_lr=cfg.warmup_lr,
            min_lr=cfg.min_lr, step_on_epochs=per_epoch, updates_per_epoch=steps_per_epoch, **cfg.sched_kwargs,
        )
    except TypeError as error:  # an option create_scheduler_v2 does not take
        raise ValueError(f"sched_kwargs {cfg.sched_kwargs}: {error}") from None
