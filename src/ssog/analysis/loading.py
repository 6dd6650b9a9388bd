"""Models and images to analyse: a training checkpoint, a released model (timm's hub layout) or
a randomly initialised model.

Checkpoints and released models are built and loaded by the training package
(:func:`ssog.train.transfer.model_from_checkpoint`);
images come from the data package (the checkpoint's own validation split by default), or
are standard-normal noise shaped for the model (``data="noise"``), which needs no data set.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..models.weights import HUB_PREFIXES
from ..runtime import resolve_device

__all__ = ["AnalysisModel", "data_name", "image_batches", "iter_models", "load_model", "NOISE", "source_folder"]

NOISE = "noise"


@dataclass
class AnalysisModel:
    """A model in eval mode and where it came from.

    ``source`` is the checkpoint path, timm's name of a released model (``local-dir:FOLDER``,
    ``hf-hub:USER/REPO``) or ``"random init (seed S)"``; ``config`` is the checkpoint's
    training config (``None`` for a released or a random model).
    """

    model: nn.Module
    name: str
    source: str
    config: dict[str, Any] | None = None

    def describe(self) -> dict[str, Any]:
        """Plain-value identity of the model for reports."""
        model = self.model
        ssog = getattr(model, "mixer_kwargs", None) or {}
        return {
            "model": self.name,
            "source": self.source,
            "family": getattr(model, "family", None),
            "op": getattr(model, "op", None),
            "steer": list(ssog.get("steer", ())),
        }


def source_folder(source: str) -> str | None:
    """The name of the folder a model's ``source`` (:class:`AnalysisModel`) comes from: the run
    folder of a checkpoint, the folder (or hub repository) of a released model; None for a
    random model."""
    if source.startswith("random init"):
        return None
    for prefix in HUB_PREFIXES:
        if source.startswith(prefix):
            return Path(source[len(prefix):]).name
    return Path(source).parent.name


def load_model(
    model: str | None = None,
    checkpoint: str | Path | None = None,
    *,
    ema: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> AnalysisModel:
    """The model to analyse, in eval mode on ``device``.

    Exactly one of ``model`` (a registered name, randomly initialised with ``seed``) and
    ``checkpoint`` (a checkpoint written by ``ssog train``, or its run folder: the ``best``
    checkpoint; or a released model in timm's hub layout, :func:`~ssog.train.transfer.model_source`)
    must be given. ``ema`` takes the checkpoint's EMA weights.
    """
    from ..models import create_model

    if (model is None) == (checkpoint is None):
        raise ValueError("give exactly one of a model name (random init) or a checkpoint")
    device = resolve_device(device) if isinstance(device, str) else device
    if model is not None:
        if ema:
            raise ValueError("ema applies to checkpoints; a random model has no EMA weights")
        torch.manual_seed(seed)
        net = create_model(model)
        return AnalysisModel(net.eval().to(device), model, f"random init (seed {seed})")

    from ..train.checkpoint import read_checkpoint_info
    from ..train.transfer import model_from_checkpoint, model_source

    assert checkpoint is not None  # exactly one of model and checkpoint is given
    path = model_source(checkpoint)
    net = model_from_checkpoint(path, ema=ema)
    if isinstance(path, str):  # a released model: its architecture's name, no run config
        name = (getattr(net, "pretrained_cfg", None) or {}).get("architecture") or type(net).__name__
        return AnalysisModel(net.eval().to(device), name, path)
    config = read_checkpoint_info(path)["config"]
    return AnalysisModel(net.eval().to(device), config["model"], str(path), config)


def iter_models(
    models: Sequence[str] = (),
    checkpoints: Sequence[str | Path] = (),
    *,
    ema: bool = False,
    seed: int = 0,
    device: str = "auto",
) -> Iterator[AnalysisModel]:
    """Load the checkpoints, then the random models, one at a time (:func:`load_model`)."""
    if not models and not checkpoints:
        raise ValueError("nothing to analyse: give at least one checkpoint or model name")
    if ema and models:
        raise ValueError("ema applies to checkpoints; random models have no EMA weights")
    for checkpoint in checkpoints:
        yield load_model(checkpoint=checkpoint, ema=ema, seed=seed, device=device)
    for name in models:
        yield load_model(name, seed=seed, device=device)


def data_name(loaded: AnalysisModel, data: str | None = None) -> str:
    """The data source used for ``data``: itself, else the checkpoint's data set, else noise."""
    return data or (loaded.config or {}).get("dataset") or NOISE


def image_batches(
    loaded: AnalysisModel,
    data: str | None = None,
    *,
    data_dir: str | None = None,
    num_images: int = 512,
    batch_size: int = 64,
    seed: int = 0,
    val_split: float | int | str | None = None,
    split_seed: int | None = None,
) -> Iterator[Tensor]:
    """Batches ``(B, C, H, W)`` of the first ``num_images`` validation images, at the model's size.

    ``data``: a data source of :data:`ssog.data.DATASETS` (its validation split, evaluation
    transform), ``"noise"`` (standard-normal images, seeded), or ``None``: the checkpoint's
    own data set (with its data folder and validation split), noise for a random or released
    model. ``val_split`` and ``split_seed`` (as ``ssog train`` takes them) say which images are
    the validation split, over the checkpoint's own: those a run held out of the training set.
    A data set with fewer images yields all of them.
    """
    if num_images < 1 or batch_size < 1:
        raise ValueError(f"num_images and batch_size must be >= 1, got {num_images} and {batch_size}")
    model: Any = loaded.model  # a ViT: pos_embed, in_chans, patch_embed
    device = model.pos_embed.device
    in_chans = model.in_chans
    img_size = tuple(model.patch_embed.img_size)
    config = loaded.config or {}
    data = data_name(loaded, data)
    named = [name for name, value in (("data_dir", data_dir), ("val_split", val_split), ("split_seed", split_seed))
             if value is not None]
    if data == NOISE and named:
        raise ValueError(f"{', '.join(named)} say which images of a data set to read, but {loaded.name} is analysed on "
                         "noise: name the data set with --data (data)")
    if data == NOISE:
        generator = torch.Generator().manual_seed(seed)
        for start in range(0, num_images, batch_size):
            size = min(batch_size, num_images - start)
            yield torch.randn(size, in_chans, *img_size, generator=generator).to(device)
        return

    from ..data import DATASETS, TransformedDataset, build_datasets, build_loader, build_transform
    from ..data.data_config import model_data_config

    if data not in DATASETS:
        raise ValueError(f"unknown data {data!r}; expected {NOISE!r} or one of {', '.join(DATASETS)}")
    own = data == config.get("dataset")
    options: dict[str, Any] = {}
    if own:  # the checkpoint's validation split, never its training images
        options = {k: config[k] for k in ("val_split", "split_seed", "synthetic_size", "synthetic_classes")
                   if k in config}
        data_dir = data_dir or config.get("data_dir")
    options.update({key: value for key, value in (("val_split", val_split), ("split_seed", split_seed))
                    if value is not None})
    _, val, info = build_datasets(data, data_dir, synthetic_img_size=img_size[0], **options)
    if info.in_chans != in_chans:
        raise ValueError(
            f"{loaded.name} takes {in_chans}-channel images but data {data!r} has {info.in_chans} channels"
        )
    data_config = model_data_config(model, (in_chans, *img_size))  # the run's, recorded in the model
    transform = build_transform("none", img_size, data_config["mean"], data_config["std"], train=False,
                                crop_pct=data_config["crop_pct"], interpolation=data_config["interpolation"])
    count = min(num_images, len(val))  # type: ignore[arg-type]  # torch's Dataset declares no __len__
    subset = torch.utils.data.Subset(TransformedDataset(val, transform), range(count))
    for images, _ in build_loader(subset, batch_size, train=False):
        yield images.to(device)
