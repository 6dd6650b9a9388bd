"""Moving weights between settings: warm starts, linear probes, other input and patch sizes; the
model a ``--checkpoint`` names (a run's checkpoint, or a released model in timm's hub layout)."""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from timm.models import load_state_dict as timm_load_state_dict

from ssog.conversion import convert_state_dict
from ssog.layers import ssog_mixers
from ssog.models.weights import (
    HUB_CONFIG, HUB_PREFIXES, HUB_WEIGHTS, adapt_embeddings, hub_reference, load_hub_model, load_weights_into,
)
from ssog.train.checkpoint import FORMAT, MODEL_KEY, checkpoint_path, load_checkpoint
from ssog.train.config import TIMM_INIT_PREFIX

__all__ = [
    "load_weights", "init_from_checkpoint", "freeze_backbone", "classifier_prefixes",
    "set_input_size", "model_from_checkpoint", "model_source", "move_to_input_size", "source_files",
]

logger = logging.getLogger(__name__)

# Parameters a model may have that a checkpoint of the same architecture without them
# lacks: steering projections and gates, added when a fixed-SSoG checkpoint warm-starts a
# steered model (the paper's "warm" start, Table 8).
STEERING_MARKERS = ("steer",)


def _is_ssog_checkpoint(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return (handle.metadata() or {}).get("ssog_format") == FORMAT
    except Exception:
        return False


def load_weights(path: str | Path, ema: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """``(state_dict, training config or None)`` from an ssog checkpoint or a plain weight file.

    Plain files (safetensors, or torch files holding a state dict) go through timm's loader.
    ``ema=True`` takes an ssog checkpoint's EMA weights (a ``best.safetensors`` chosen by the
    EMA holds them as its model weights).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    if _is_ssog_checkpoint(path):
        state = load_checkpoint(path, only=(MODEL_KEY, "ema", "config", "weights"))
        ema_weights = state[MODEL_KEY] if state.get("weights") == "ema" else state.get("ema")
        weights, config = ema_weights if ema else state[MODEL_KEY], state.get("config")
        if weights is None:
            raise ValueError(f"checkpoint {path} has no EMA weights (the run had ema_decay unset)")
    elif ema:
        raise ValueError(f"{path} is a plain weight file: it has no separate EMA weights")
    else:
        try:
            weights, config = timm_load_state_dict(str(path)), None
        except Exception as error:
            raise ValueError(f"cannot read weights from {path}: {error}") from error
    return weights, config


def classifier_prefixes(model: torch.nn.Module) -> tuple[str, ...]:
    """State-dict prefixes of the classification head (``("head.",)`` for timm's ViT)."""
    timm_model: Any = model  # timm's models have get_classifier
    head = timm_model.get_classifier()
    names = tuple(f"{name}." for name, module in model.named_modules() if module is head and name)
    if not names:
        raise ValueError(f"cannot locate the classifier of {type(model).__name__} for a new head")
    return names


def init_from_checkpoint(model: torch.nn.Module, path: str | Path, keep_head: bool = False) -> None:
    """Load a checkpoint's backbone into ``model``, keeping ``model``'s freshly initialised head
    (or, with ``keep_head``, loading the checkpoint's head too: same classes).

    ``path``: a checkpoint or weights file, or a run folder (its ``best``). Position and patch
    embeddings are resampled when sizes differ. Steering parameters the checkpoint lacks keep
    their initialisation (fixed SSoG -> steered warm start, with the gates closed so the
    model starts as the fixed one). Attention weights (an MHA run, timm ViT weights) where
    ``model`` has SSoG mixers are converted as :func:`ssog.convert` converts a model (the value
    slice of ``qkv`` and ``proj``; kernels at their initialisation), so ``model`` must have
    the source's layout (class token, pooling). Any other difference is an error. What was
    resampled, converted or left at its initialisation is logged (info).
    """
    path = checkpoint_path(path, "best")
    state, _ = load_weights(path)
    heads = () if keep_head else classifier_prefixes(model)
    state = {k: v for k, v in state.items() if not k.startswith(heads)}
    state, kernels = convert_state_dict(state, model)
    _check_class_token(model, state, path)
    for note in adapt_embeddings(state, model):
        logger.info(note)
    target = model.state_dict()
    new = tuple(k for k in target if k not in state and any(m in k for m in STEERING_MARKERS))
    load_weights_into(model, state, f"--init-from {path}", allow_missing=heads + new + kernels)
    notes = ["head loaded" if keep_head else f"new head {', '.join(h.rstrip('.') for h in heads)}"]
    if kernels:
        notes.append(f"attention converted to SSoG ({len(kernels)} kernel tensors at their initialisation)")
    steering = [k for k in new if k not in kernels]
    if steering:
        notes.append(f"{len(steering)} steering tensors left at their initialisation")
    logger.info(f"initialised from {path}: {'; '.join(notes)}")


def _check_class_token(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """A checkpoint's class token must meet one in ``model``: their token layouts differ otherwise."""
    has_token, wants_token = "cls_token" in state, "cls_token" in model.state_dict()
    if has_token != wants_token:
        raise ValueError(
            f"--init-from {path}: the checkpoint's model {'has a' if has_token else 'has no'} class token and this "
            f"one {'has none' if has_token else 'has one'}; build the model with the checkpoint's layout "
            f"(model_kwargs class_token: {str(has_token).lower()}, global_pool: {'token' if has_token else 'avg'})"
        )


def freeze_backbone(model: torch.nn.Module) -> int:
    """Freeze every parameter except the classifier's (linear probe); returns the trainable count."""
    heads = classifier_prefixes(model)
    trainable = 0
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith(heads))
        trainable += param.numel() if param.requires_grad else 0
    return trainable


def set_input_size(model: torch.nn.Module, img_size: int | None = None, patch_size: int | None = None,
                   rescale_kernels: bool = False) -> float:
    """Evaluate ``model`` at another image and/or patch size (paper Table 13).

    timm's ``set_input_size`` PI-resizes the patch embedding and resamples the position
    embedding bicubically. With ``rescale_kernels`` every SSoG mixer's mu and sigma (token
    units) are multiplied by the grid ratio new/old, so each Gaussian covers the same image
    area. Returns that ratio.
    """
    if not hasattr(model, "set_input_size"):
        raise ValueError(f"{type(model).__name__} has no set_input_size: cannot change its input size")
    if rescale_kernels and not ssog_mixers(model):
        raise ValueError("--rescale-kernels applies to SSoG models; this model has no SSoG mixer")
    timm_model: Any = model  # has set_input_size (checked above) and timm's patch_embed
    old_grid = timm_model.patch_embed.grid_size
    # The ssog families rescale their kernels themselves (and check the grid ratio);
    # timm's own models take no such argument.
    timm_model.set_input_size(img_size=None if img_size is None else (img_size, img_size),
                         patch_size=None if patch_size is None else (patch_size, patch_size),
                         **({"rescale_kernels": True} if rescale_kernels else {}))
    return timm_model.patch_embed.grid_size[0] / old_grid[0]


def move_to_input_size(model: torch.nn.Module, img_size: int | None = None, patch_size: int | None = None,
                       rescale_kernels: bool | None = None) -> tuple[float, bool]:
    """Move ``model`` to another image and/or patch size as ``ssog eval`` and ``ssog export`` do
    (:func:`set_input_size`): SSoG kernels rescaled by the grid ratio unless ``rescale_kernels``
    is False (None, the default: rescaled for a model with SSoG mixers, so each Gaussian keeps
    covering the image area it was trained on). Returns ``(grid ratio, whether rescaled)``;
    ``(1.0, False)`` with neither size given."""
    new_grid = img_size is not None or patch_size is not None
    if rescale_kernels and not new_grid:
        raise ValueError("--rescale-kernels needs --img-size or --patch-size (a new grid to rescale to)")
    if not new_grid:
        return 1.0, False
    if rescale_kernels is None:
        rescale_kernels = bool(ssog_mixers(model))
    return set_input_size(model, img_size, patch_size, rescale_kernels), rescale_kernels


def model_source(checkpoint: str | Path) -> Path | str:
    """What a ``--checkpoint`` of ``ssog eval``, ``ssog analyze`` or ``ssog export`` names: timm's
    name of a released model (``local-dir:FOLDER`` for a folder in timm's hub layout, or
    ``local-dir:``/``hf-hub:`` as given; :func:`~ssog.models.weights.hub_reference`), else the
    run checkpoint file (a run folder: its ``best``). A folder that is neither is a
    FileNotFoundError of one line saying what each needs."""
    reference = hub_reference(checkpoint)
    if reference is not None:
        return reference
    folder = Path(checkpoint)
    if folder.is_dir() and not any((folder / f"{name}.safetensors").is_file() for name in ("best", "last")):
        found = [name for name in (HUB_CONFIG, *HUB_WEIGHTS) if (folder / name).is_file()]
        if found or not any(folder.glob("*.safetensors")):
            held = f"it holds {' and '.join(found)} only" if found else "it holds neither"
            raise FileNotFoundError(
                f"{folder} is neither a run folder of ssog train (best.safetensors or last.safetensors) nor a "
                f"released model in timm's hub layout ({HUB_CONFIG} and {HUB_WEIGHTS[0]}, as ssog export "
                f"--format hf writes them): {held}")
    return checkpoint_path(checkpoint, "best")


def source_files(source: Path | str) -> list[Path]:
    """The files the model of ``source`` (:func:`model_source`) is read from, which a command
    that writes a file must never replace: the checkpoint, or a released folder's files (none
    here for ``hf-hub:``)."""
    if isinstance(source, Path):
        return [source]
    prefix = HUB_PREFIXES[0]  # local-dir:
    if not source.startswith(prefix):
        return []
    folder = Path(source[len(prefix):])
    return [folder / name for name in (HUB_CONFIG, *HUB_WEIGHTS) if (folder / name).exists()]


def model_from_checkpoint(path: str | Path, ema: bool = False) -> torch.nn.Module:
    """The trained model of an ssog checkpoint (a run folder: its ``best``) or of a released
    model (:func:`model_source`), on the CPU.

    A run's model is built from the run's config, with the classes, channels and input size
    read off the weights (no data needed), and loaded strictly; ``ema`` takes the EMA weights.
    Its ``pretrained_cfg`` holds the run's data config and class names (what timm's
    ``resolve_data_config(model=...)``, ``save_for_hf`` and the ONNX export read). A released
    model is built by timm from its ``config.json`` (:func:`~ssog.models.weights.load_hub_model`),
    whose ``pretrained_cfg`` holds the same.
    """
    source = model_source(path)
    if isinstance(source, str):
        if ema:
            raise ValueError(f"{path} is a released model (timm's hub layout): it holds one set of weights and no "
                             "separate EMA weights; leave out --ema")
        return load_hub_model(source)
    from ssog.train.builders import apply_data_config, build_model, run_data_config
    from ssog.train.config import TrainConfig, upgrade_checkpoint_config

    path = source
    weights, config = load_weights(path, ema=ema)
    if config is None:
        if hub_reference(path.parent) is not None:
            raise ValueError(f"{path} holds weights only; give its folder {path.parent}, a released model in timm's "
                             "hub layout, whose config.json says how to build the model")
        raise ValueError(f"{path} holds weights only; building its model needs a checkpoint written by ssog train "
                         f"or a released model in timm's hub layout (a folder with {HUB_CONFIG} and "
                         f"{HUB_WEIGHTS[0]})")
    cfg = TrainConfig.from_dict(upgrade_checkpoint_config(
        {**config, "output": None, "init_from": _architecture_init(config.get("init_from"))}))
    stored = load_checkpoint(path, only=("data_config", "classes"))
    classes = stored.get("classes") or ()
    proj = weights.get("patch_embed.proj.weight")  # (D, C, p, p)
    if proj is not None:
        tokens = weights["pos_embed"].shape[1] - (1 if "cls_token" in weights else 0)
        grid = math.isqrt(tokens)
        if grid * grid != tokens:
            raise ValueError(f"{path}: a position embedding of {tokens} patch tokens is not a square grid")
        head = weights.get("head.weight")
        in_chans = proj.shape[1]
        model = build_model(cfg, 0 if head is None else head.shape[0], in_chans, grid * proj.shape[-1])
    else:  # a model without a patch embedding (a CNN): any input size, the channels of its first convolution
        in_chans = next(tensor for tensor in weights.values() if tensor.ndim == 4).shape[1]
        model = build_model(cfg, len(classes), in_chans, cfg.img_size or 224)
    load_weights_into(model, weights, f"checkpoint {path}")
    # The data config the run trained with (older checkpoints: resolved from their config).
    apply_data_config(model, stored.get("data_config") or run_data_config(cfg, in_chans), classes)
    return model


def _architecture_init(init_from: str | None) -> str | None:
    """What of a run's ``init_from`` rebuilding its model needs: a ``timm:NAME`` start is the
    architecture (a converted timm model); a checkpoint start only gave initial weights."""
    return init_from if init_from and init_from.startswith(TIMM_INIT_PREFIX) else None
