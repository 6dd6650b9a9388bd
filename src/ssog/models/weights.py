"""Weights into the families: the model entries of an ssog run checkpoint (the one definition
of that format's prefix, which :mod:`ssog.train.checkpoint` writes: models cannot import
ssog.train, which builds them), timm's ``pretrained_filter_fn`` for them, and position and
patch embeddings resampled to another input or patch size."""
from __future__ import annotations

from typing import Any

from timm.layers import resample_abs_pos_embed, resample_patch_embed
from torch import Tensor, nn

__all__ = ["CHECKPOINT_MODEL_PREFIX", "adapt_embeddings", "checkpoint_filter_fn", "load_run_checkpoint"]

#: Prefix of the model weights in an ssog run checkpoint (``model/blocks.0.attn.v.weight``):
#: the checkpoint's ``"model"`` entry, its tensors' paths joined by ``/``.
CHECKPOINT_MODEL_PREFIX = "model/"


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
