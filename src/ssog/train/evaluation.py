"""Evaluate a checkpoint on any data source, optionally at another image or patch size."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from ssog.train.builders import build_eval_data, build_model
from ssog.train.checkpoint import check_state_dict, checkpoint_path
from ssog.train.config import TrainConfig
from ssog.train.distributed import init_distributed
from ssog.train.engine import torch_settings
from ssog.train.metrics import evaluate
from ssog.train.transfer import load_weights, set_input_size

__all__ = ["evaluate_checkpoint"]


def evaluate_checkpoint(
    checkpoint: str | Path,
    *,
    data: dict[str, Any] | None = None,
    split: str = "val",
    img_size: int | None = None,
    patch_size: int | None = None,
    rescale_kernels: bool = False,
    ema: bool = False,
    batch_size: int | None = None,
    device: str = "auto",
    progress: bool = True,
) -> dict[str, Any]:
    """Metrics (``loss``, ``acc1``, ``acc3``, ``acc5``) of a run's checkpoint.

    ``checkpoint``: a ``.safetensors`` checkpoint or a run folder (its ``best``). The model
    and data come from the checkpoint's config; ``data`` overrides data fields (``dataset``,
    ``data_dir``, ``val_split``, ...). ``img_size`` / ``patch_size`` evaluate at another input
    (the model's position embedding and patch embedding are resampled by timm), and
    ``rescale_kernels`` also scales SSoG's mu and sigma by the grid ratio (Table 13).
    """
    path = checkpoint_path(checkpoint, "best")
    weights, config = load_weights(path, ema=ema)
    if config is None:
        raise ValueError(f"{path} holds weights only; ssog eval needs a checkpoint written by ssog train")
    values = dict(config, **(data or {}))
    values.update(output=None, init_from=None, progress=progress, device=device)
    if batch_size is not None:
        values["batch_size"] = batch_size
    trained_size = values.get("img_size")
    values["img_size"] = img_size or trained_size
    cfg = TrainConfig.from_dict(values)
    ctx = init_distributed(cfg.device)
    loader, info = build_eval_data(cfg, ctx, split)

    # Build at the trained size, load, then move to the new size the way timm resamples.
    trained = TrainConfig.from_dict({**values, "img_size": trained_size})
    model = build_model(trained, info.num_classes, info.in_chans, trained.img_size or info.native_size)
    check_state_dict(model, weights, f"checkpoint {path}")
    model.load_state_dict(weights)
    ratio = 1.0
    if img_size is not None or patch_size is not None:
        ratio = set_input_size(model, img_size, patch_size, rescale_kernels)
    elif rescale_kernels:
        raise ValueError("--rescale-kernels needs --img-size or --patch-size (a new grid to rescale to)")
    model.to(ctx.device)
    bar = (lambda it: tqdm(it, desc="eval", leave=False, dynamic_ncols=True)) if progress else None
    with torch_settings(cfg, ctx):
        metrics = evaluate(model, loader, ctx, cfg.amp, progress=bar)
    grid = tuple(model.patch_embed.grid_size)
    return {
        **metrics, "checkpoint": str(path), "model": cfg.model, "dataset": cfg.dataset, "split": split,
        "samples": len(loader.dataset), "img_size": img_size or cfg.img_size or info.native_size,
        "patch_size": list(model.patch_embed.patch_size), "grid": list(grid), "grid_ratio": ratio,
        "rescaled_kernels": rescale_kernels, "ema": ema,
    }
