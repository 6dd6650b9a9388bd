"""Weights into a model: :func:`load_weights_into`, the one way ssog loads a state dict into a
model (resuming a run, ``--init-from``, and the model of a checkpoint that ``ssog eval``,
``ssog export`` and ``ssog analyze`` read), with its checks; the model entries of an ssog run
checkpoint (the one definition of that format's prefix, which :mod:`ssog.train.checkpoint`
writes: models cannot import ssog.train, which builds them), timm's ``pretrained_filter_fn``
and ``load_state_dict`` pre-hook for them (timm's ``pretrained`` and ``checkpoint_path``),
position and patch embeddings resampled to another input or patch size, and a released model
in timm's hub layout read through timm (:func:`hub_reference`, :func:`load_hub_model`)."""
from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import timm
import torch
from safetensors import SafetensorError
from timm.data import resolve_model_data_config
from timm.layers import resample_abs_pos_embed, resample_patch_embed
from torch import Tensor, nn

__all__ = [
    "CHECKPOINT_MODEL_PREFIX", "HUB_CONFIG", "HUB_PREFIXES", "HUB_WEIGHTS", "adapt_embeddings", "check_finite_weights",
    "check_state_dict", "checkpoint_filter_fn", "hub_reference", "load_hub_model", "load_run_checkpoint",
    "load_weights_into",
]

logger = logging.getLogger(__name__)

#: Prefix of the model weights in an ssog run checkpoint (``model/blocks.0.attn.v.weight``):
#: the checkpoint's ``"model"`` entry, its tensors' paths joined by ``/``.
CHECKPOINT_MODEL_PREFIX = "model/"

#: The prefixes of timm's model names that read a model in timm's hub layout:
#: ``local-dir:FOLDER`` and ``hf-hub:USER/REPO`` (``timm.create_model(name, pretrained=True)``).
HUB_PREFIXES = ("local-dir:", "hf-hub:")
#: The files of timm's hub layout (``timm.models.save_for_hf``): the config (architecture, its
#: arguments, ``pretrained_cfg``) and the weights, in either of timm's formats.
HUB_CONFIG = "config.json"
HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def checkpoint_filter_fn(state_dict: dict[str, Tensor], model: nn.Module | None = None) -> dict[str, Tensor]:
    """The model weights of an ssog run checkpoint (``RUN/best.safetensors``, ``last``) as a
    plain state dict: its ``model/<name>`` entries without the prefix; the other entries
    (optimizer, EMA, RNG states) are dropped. A plain state dict passes unchanged.
    timm's ``pretrained_filter_fn`` (``pretrained_cfg_overlay=dict(file=...)``)."""
    if not any(key.startswith(CHECKPOINT_MODEL_PREFIX) for key in state_dict):
        return state_dict
    return {
        key[len(CHECKPOINT_MODEL_PREFIX):]: value for key, value in state_dict.items()
        if key.startswith(CHECKPOINT_MODEL_PREFIX)
    }


def adapt_embeddings(state_dict: dict[str, Tensor], model: nn.Module) -> list[str]:
    """Resample, in place, a state dict's position embedding (bicubic) and patch embedding
    (PI-resize) to ``model``'s token grid and patch size, as timm's ViT ``checkpoint_filter_fn``
    does for pretrained weights (timm's ``resample_abs_pos_embed`` / ``resample_patch_embed``);
    works for timm's ViTs too. The checkpoint's grid is taken as square. Returns what changed."""
    notes = []
    target = model.state_dict()
    pos = state_dict.get("pos_embed")
    if pos is not None and "pos_embed" in target and pos.shape != target["pos_embed"].shape:
        patch_embed: Any = model.patch_embed  # timm's PatchEmbed, of ours or of a timm ViT
        prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
        state_dict["pos_embed"] = resample_abs_pos_embed(pos, new_size=list(patch_embed.grid_size),
                                                         num_prefix_tokens=prefix)
        notes.append(f"position embedding resampled {tuple(pos.shape)} -> {tuple(state_dict['pos_embed'].shape)}")
    key = "patch_embed.proj.weight"
    weight = state_dict.get(key)
    if weight is not None and key in target and weight.shape[-2:] != target[key].shape[-2:]:
        state_dict[key] = resample_patch_embed(weight, list(target[key].shape[-2:]))
        notes.append(f"patch embedding resized {tuple(weight.shape[-2:])} -> {tuple(target[key].shape[-2:])}")
    return notes


def load_run_checkpoint(module: nn.Module, state_dict: dict[str, Tensor], prefix: str, *args: Any) -> None:
    """``load_state_dict`` pre-hook: read a whole run checkpoint as its model weights, and
    weights of another input or patch size at this model's (:func:`adapt_embeddings`), so
    ``timm.create_model(..., img_size=48, checkpoint_path=<32 px weights>)`` loads."""
    if prefix != "":
        return
    if any(key.startswith(CHECKPOINT_MODEL_PREFIX) for key in state_dict):
        weights = checkpoint_filter_fn(dict(state_dict))
        state_dict.clear()
        state_dict.update(weights)
    adapt_embeddings(state_dict, module)


def load_weights_into(model: nn.Module, weights: dict[str, Tensor], source: str,
                      allow_missing: tuple[str, ...] = ()) -> None:
    """Load ``weights`` into ``model`` after checking them: finite (:func:`check_finite_weights`)
    and exactly ``model``'s keys and shapes (:func:`check_state_dict`), keys starting with one
    of ``allow_missing`` excepted (those keep ``model``'s values). ``source`` names the weights
    in the one-line ValueError."""
    check_finite_weights(weights, source)
    check_state_dict(model, weights, source, allow_missing)
    model.load_state_dict(weights, strict=not allow_missing)


def check_finite_weights(weights: dict[str, Tensor], source: str) -> None:
    """Raise ValueError naming the first floating-point tensor of ``weights`` with a NaN or inf."""
    for name, tensor in weights.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"{source} holds non-finite weights ({bad} NaN/inf values in {name}): the run "
                             "that wrote it diverged; use an earlier checkpoint")


def check_state_dict(model: nn.Module, state_dict: dict[str, Tensor], source: str,
                     allow_missing: tuple[str, ...] = ()) -> None:
    """Raise ValueError unless ``state_dict`` has exactly ``model``'s keys and shapes.

    Keys starting with one of ``allow_missing`` may be absent from ``state_dict``.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict and not k.startswith(allow_missing)]
    unexpected = [k for k in state_dict if k not in expected]
    shapes = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items() if k in state_dict and state_dict[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        parts = []
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)):
            if items:
                shown = ", ".join(items[:5]) + (f", ... ({len(items)} in all)" if len(items) > 5 else "")
                parts.append(f"{label}: {shown}")
        raise ValueError(f"{source} does not match the model ({'; '.join(parts)})")


def hub_reference(source: str | Path) -> str | None:
    """timm's name of the released model ``source`` names: ``source`` itself when it starts with
    one of :data:`HUB_PREFIXES`, ``local-dir:FOLDER`` for a folder holding :data:`HUB_CONFIG`
    and one of :data:`HUB_WEIGHTS` (what ``ssog export --format hf`` writes); None otherwise."""
    if str(source).startswith(HUB_PREFIXES):
        return str(source)
    folder = Path(source)
    if (folder / HUB_CONFIG).is_file() and any((folder / name).is_file() for name in HUB_WEIGHTS):
        return f"local-dir:{folder}"
    return None


def load_hub_model(reference: str) -> nn.Module:
    """The model of a released folder, on the CPU: ``timm.create_model(reference,
    pretrained=True)`` (``reference``: ``local-dir:FOLDER`` or ``hf-hub:USER/REPO``, see
    :func:`hub_reference`), which builds the architecture its ``config.json`` names with its
    arguments and ``pretrained_cfg`` (data config, class names) and loads the weights strictly;
    then the weights are checked finite (:func:`check_finite_weights`) and the data config made
    whole (:func:`_complete_data_config`). A folder or repository timm cannot build a model
    from (a truncated weights file among them) is a ValueError of one line naming it."""
    try:
        model = timm.create_model(reference, pretrained=True)
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, EOFError, pickle.UnpicklingError,
            SafetensorError) as error:
        reason = " ".join(str(error).split())  # timm's strict loading lists the keys over several lines
        raise ValueError(f"cannot build the released model {reference} through timm: {type(error).__name__}: "
                         f"{reason[:500]}") from error
    check_finite_weights(dict(model.state_dict()), f"the released model {reference}")
    _complete_data_config(model, reference)
    return model


#: The data config's entries of a ``pretrained_cfg``: what evaluating a released model reads.
_DATA_CONFIG_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


def _complete_data_config(model: nn.Module, reference: str) -> None:
    """Make ``model.pretrained_cfg``'s data config whole and true to the model, warning of each change.

    An entry the released ``config.json`` leaves out or sets to null (timm drops those) takes
    timm's default, as ``timm.data.resolve_data_config`` gives it; an ``input_size`` other than
    the size the model was built at (``patch_embed.img_size``, which its position embedding
    fits) becomes the model's: images of another size would be read at a grid the report
    does not name."""
    pretrained = dict(getattr(model, "pretrained_cfg", None) or {})
    resolved = resolve_model_data_config(model)
    patch_embed = getattr(model, "patch_embed", None)
    built = getattr(patch_embed, "img_size", None)
    if built is not None:
        size = (resolved["input_size"][0], *built)
        if pretrained.get("input_size") is not None and tuple(pretrained["input_size"]) != size:
            logger.warning("the released model %s was built for %s images, the size its weights fit, but its "
                           "config.json's pretrained_cfg input_size is %s; its data is read at the model's size",
                           reference, "x".join(map(str, size[1:])), list(pretrained["input_size"]))
            pretrained["input_size"] = size
        resolved["input_size"] = size
    for key in _DATA_CONFIG_KEYS:
        if pretrained.get(key) is None:
            if key != "input_size" or built is None:
                logger.warning("the released model %s gives no %s in its config.json's pretrained_cfg; timm's "
                               "default %s is used", reference, key, resolved[key])
            pretrained[key] = resolved[key]
    model.pretrained_cfg = model.default_cfg = pretrained  # type: ignore[assignment]  # torch: tensors, modules
