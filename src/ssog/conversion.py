"""Turn a timm VisionTransformer into an SSoG ViT, keeping every weight that still applies.

:func:`convert` replaces each block's self-attention with an :class:`~ssog.layers.SSoGAttention`
(which takes timm's attention call ``attn(x, attn_mask=None)``). SSoG has a value and an
output projection but no query or key, so it keeps the value slice of ``qkv`` and ``proj``;
the query/key slices (and ``q_norm``/``k_norm``) are dropped. Everything else (patch and
position embedding, class/register/distillation tokens, norms, MLPs, heads) is untouched.
Prefix tokens follow docs/operator.md: patch queries never read them, a prefix query's
output is the mean of the patch values, so a model pooled by its class token trains no
kernel of its last block (:func:`convert` warns, and ``global_pool="avg"`` pools the patches).

:func:`convert_state_dict` does the same to weights on their way into an SSoG model of the
source's layout (``ssog train --init-from`` an MHA checkpoint or timm ViT weights file).
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from .layers import CLASS_TOKEN_POOLING, SSoGAttention, follow_model_grid, kernel_scale_for_grid, named_mixers

__all__ = ["PATCH_POOLS", "convert", "convert_state_dict"]

logger = logging.getLogger(__name__)

#: timm's ``global_pool`` values that :func:`convert` can switch a model to: poolings of the
#: patch tokens that need no new module (``"token"``: the class token's output).
PATCH_POOLS = ("avg", "avgmax", "max")


def convert(
    model: nn.Module, kernel_units: str = "image", global_pool: str | None = None, **ssog_options: Any
) -> nn.Module:
    """Replace every attention of the timm ``VisionTransformer`` ``model`` by SSoG, in place.

    Args:
        model: a timm ``VisionTransformer`` (ViT, DeiT and distilled DeiT, with registers...)
            whose blocks have ``attn.qkv`` and ``attn.proj``.
        kernel_units: ``"image"``: the initial kernel lengths are scaled by the model's token
            grid over 8, as in the ssog models (``kernel_units`` of
            :class:`~ssog.models._base.ViTBase`); ``"tokens"``: as given.
        global_pool: ``None``: keep the model's pooling; one of :data:`PATCH_POOLS`
            (``"avg"``: the mean of the patch tokens, the pooling of the ssog models): pool
            the patches instead of the class token, keeping the head's weights (timm's
            ``reset_classifier`` with the head kept). With class-token pooling only the class
            token's output of the last block reaches the loss, and it reads the mean of the
            patch values, so the last block's kernels get no gradient: a warning says so.
        **ssog_options: :class:`~ssog.layers.SSoGAttention` options (``num_atoms``,
            ``sigma_min``, ``steer``, ``centre_init``, ...).

    Returns:
        ``model``, its attentions now :class:`~ssog.layers.SSoGAttention` with the value slice
        of ``qkv`` and the output projection (and a ``scale_norm``) copied; everything else
        keeps its weights. The token grid comes from each image
        (:func:`~ssog.layers.follow_model_grid`).
    """
    blocks = getattr(model, "blocks", None)
    patch_embed = getattr(model, "patch_embed", None)
    if blocks is None or patch_embed is None or not hasattr(model, "num_prefix_tokens"):
        raise ValueError(f"convert() takes a timm VisionTransformer (blocks, patch_embed), got {type(model).__name__}")
    if getattr(model, "dynamic_img_size", False):
        raise ValueError("convert() needs a fixed token grid: build the timm model with dynamic_img_size=False")
    _refuse_rotary(model, blocks)
    _refuse_other_attention(model, blocks)
    if global_pool is not None:
        _pool_patches(model, global_pool)
    ssog_options = {"kernel_scale": kernel_scale_for_grid(patch_embed.grid_size, kernel_units), **ssog_options}
    vit: Any = model  # checked above: blocks, patch_embed, num_prefix_tokens
    mixers = []
    for index, block in enumerate(blocks):
        mixers.append(_convert_attention(block.attn, vit.num_prefix_tokens, f"blocks.{index}.attn", ssog_options))
        block.attn = mixers[-1]
    follow_model_grid(model)
    if getattr(model, "global_pool", None) == "token":
        fix = ("convert it with global_pool='avg' to pool the patches" if _pools_as_told(model) else
               "its head reads its prefix tokens whatever global_pool says: fine-tune a model that pools patches")
        logger.warning(
            "%s converted to SSoG pools by its class token: %s; %s (docs/models.md, \"Converting a timm ViT\")",
            _model_name(model), CLASS_TOKEN_POOLING, fix,
        )
    return model


def _refuse_rotary(model: nn.Module, blocks: Sequence[Any]) -> None:
    """A ValueError for a model whose attention takes rotary position embeddings (RoPE: timm's
    EVA-02, the RoPE ViTs): their blocks call ``attn(x, rope=...)``, and SSoG, which mixes by
    position with neither query nor key to rotate, has no such input."""
    rotary = getattr(model, "rope", None) is not None or any(
        "rope" in inspect.signature(block.attn.forward).parameters for block in blocks if hasattr(block, "attn"))
    if rotary:
        raise ValueError(
            f"convert() cannot convert {_model_name(model)} ({type(model).__name__}): its attention takes rotary "
            "position embeddings (RoPE), which rotate queries and keys, and SSoG mixes by position with neither, so "
            "its blocks' call attn(x, rope=...) has no SSoG counterpart; convert a ViT with absolute position "
            "embeddings (vit_*, deit_*)")


#: The weights of an attention that SSoG keeps (the value slice of ``qkv``, ``proj``) or drops
#: with the queries and keys they act on (``q_norm``, ``k_norm``); any other has no place in it.
_ATTENTION_WEIGHTS = ("qkv.", "proj.", "q_norm.", "k_norm.")


def _refuse_other_attention(model: nn.Module, blocks: Sequence[Any]) -> None:
    """A ValueError, before anything changes, for a model whose attention is not the plain
    self-attention of each block that SSoG replaces: CaiT's class-attention blocks, blocks of
    parallel branches (no single ``attn``), relative position biases (BEiT, the relative-position
    ViTs), and any attention holding weights SSoG has no place for (a talking-heads mix)."""
    cannot = f"convert() cannot convert {_model_name(model)} ({type(model).__name__})"
    if getattr(model, "blocks_token_only", None) is not None:
        raise ValueError(f"{cannot}: its class-attention blocks (blocks_token_only) let the class token attend to the "
                         "patches by query and key, and SSoG, which mixes patches by position, has neither; convert a "
                         "ViT whose blocks are plain self-attention (vit_*, deit_*)")
    for index, block in enumerate(blocks):
        attn = getattr(block, "attn", None)
        if not isinstance(attn, nn.Module):
            raise ValueError(f"{cannot}: blocks.{index} ({type(block).__name__}) has no single attention attn to "
                             "replace: its attention runs in parallel branches or is fused with its MLP; convert a "
                             "ViT of sequential blocks (vit_*, deit_*)")
        weights = list(attn.state_dict())
        relative = getattr(model, "rel_pos_bias", None) is not None \
            or any("rel_pos" in name for name in inspect.signature(attn.forward).parameters) \
            or any(name.startswith(("relative_position", "rel_pos.")) for name in weights)
        if relative:
            raise ValueError(f"{cannot}: its attention adds relative position biases to the query-key scores, and "
                             "SSoG mixes by position with neither queries nor keys, so they have no place in it; "
                             "convert a ViT with absolute position embeddings (vit_*, deit_*)")
        unplaced = _unplaced_weights(name for name in weights if not name.startswith("norm."))  # norm: kept
        if unplaced:
            raise ValueError(f"{cannot}: blocks.{index}.attn ({type(attn).__name__}) holds {', '.join(unplaced[:5])}, "
                             "which SSoG has no place for (it keeps qkv's value slice and proj)")


def _unplaced_weights(names: Iterable[str]) -> list[str]:
    """The names of an attention's weights (relative to it) that are none of :data:`_ATTENTION_WEIGHTS`."""
    return sorted(name for name in names if not name.startswith(_ATTENTION_WEIGHTS))


def _model_name(model: nn.Module) -> str:
    """timm's name of ``model`` (its ``pretrained_cfg``'s architecture), else its class name."""
    config = getattr(model, "pretrained_cfg", None) or {}
    return config.get("architecture") or type(model).__name__


def _pool_patches(model: nn.Module, global_pool: str) -> None:
    """Switch ``model`` to the patch pooling ``global_pool``, keeping its head."""
    if global_pool not in PATCH_POOLS:
        raise ValueError(f"convert(global_pool={global_pool!r}): expected None or one of {PATCH_POOLS}")
    if not _pools_as_told(model):
        raise ValueError(
            f"convert(global_pool={global_pool!r}): {_model_name(model)} ({type(model).__name__}) chooses its "
            "pooled tokens itself (a distilled DeiT reads its class and distillation tokens); convert it "
            "without global_pool"
        )
    head = model.head
    model.reset_classifier(model.num_classes, global_pool=global_pool)
    model.head = head


def _pools_as_told(model: nn.Module) -> TypeGuard[VisionTransformer]:
    """Whether ``model``'s head pools as its ``global_pool`` says (timm's ViT's own head; a
    distilled DeiT's reads its class and distillation tokens, whatever the setting)."""
    return isinstance(model, VisionTransformer) and type(model).forward_head is VisionTransformer.forward_head


def convert_state_dict(
    state: Mapping[str, Tensor], model: nn.Module
) -> tuple[dict[str, Tensor], tuple[str, ...]]:
    """Weights of a ViT with attention, converted for ``model``, the same ViT with SSoG mixers.

    Every SSoG mixer ``NAME`` of ``model`` whose weights ``state`` holds as an attention's
    (``NAME.qkv.*``, ``NAME.proj.*``: timm's ViTs and the ``mha_*`` models) gets the value
    slice of ``qkv`` and ``proj``, as :func:`convert` gives them; the query and key slices (and
    ``q_norm``/``k_norm``) are dropped. Everything else is returned as it is.

    Returns:
        The converted weights, and the keys of ``model`` that the converted mixers take from
        no weight (kernel and steering parameters: they keep ``model``'s initialisation).
    """
    state = dict(state)
    target = model.state_dict()
    initialised: list[str] = []
    for name, mixer in named_mixers(model, SSoGAttention):
        assert isinstance(mixer, SSoGAttention)
        prefix = f"{name}."
        if f"{prefix}qkv.weight" not in state:
            continue
        attention = {k[len(prefix):]: state.pop(k) for k in list(state) if k.startswith(prefix)}
        unknown = _unplaced_weights(attention)
        if unknown:
            raise ValueError(f"{name}: attention weights {unknown} have no place in an SSoG mixer")
        state.update({prefix + k: v for k, v in _ssog_projections(attention, mixer.dim, name).items()})
        initialised += [k for k in target if k.startswith(prefix) and k not in state]
    return state, tuple(initialised)


def _ssog_projections(attention: Mapping[str, Tensor], dim: int, name: str) -> dict[str, Tensor]:
    """SSoG's ``v.*`` and ``proj.*`` from one attention's ``qkv.*`` and ``proj.*`` weights.

    ``qkv.weight (3D, D)`` stacks query, key and value (timm's order), so the value
    projection is rows ``2D:3D`` (and of ``qkv.bias (3D,)``, if any). ``proj.weight (D, D)``
    is kept, with its bias or zeros (SSoG's output projection always has one).
    """
    qkv, proj = attention["qkv.weight"], attention.get("proj.weight")
    if proj is None or tuple(qkv.shape) != (3 * dim, dim) or tuple(proj.shape) != (dim, dim):
        raise ValueError(
            f"{name}: qkv {tuple(qkv.shape)} and proj {None if proj is None else tuple(proj.shape)} are not the "
            f"plain width-preserving attention of width {dim} that SSoG replaces"
        )
    out = {"v.weight": qkv[2 * dim:], "proj.weight": proj}
    if "qkv.bias" in attention:
        out["v.bias"] = attention["qkv.bias"][2 * dim:]
    out["proj.bias"] = attention.get("proj.bias", proj.new_zeros(dim))
    return out


def _convert_attention(
    attn: nn.Module, num_prefix_tokens: int, name: str, options: dict[str, Any]
) -> SSoGAttention:
    qkv, proj = getattr(attn, "qkv", None), getattr(attn, "proj", None)
    if not isinstance(qkv, nn.Linear) or not isinstance(proj, nn.Linear):
        raise ValueError(f"{name} ({type(attn).__name__}) has no fused qkv and proj Linear layers to convert")
    if getattr(attn, "gate", None) is not None:
        raise ValueError(f"{name} gates its attention output by the query tokens, which SSoG cannot keep")
    dim = proj.in_features
    weights = {f"{layer}.{k}": v for layer in ("qkv", "proj") for k, v in getattr(attn, layer).state_dict().items()}
    projections = _ssog_projections(weights, dim, name)
    timm_attn: Any = attn  # timm's Attention: num_heads, proj_drop
    mixer = SSoGAttention(
        dim, timm_attn.num_heads, num_prefix_tokens=num_prefix_tokens, qkv_bias=qkv.bias is not None,
        proj_drop=getattr(timm_attn.proj_drop, "p", 0.0), device=qkv.weight.device, dtype=qkv.weight.dtype,
        **options,
    )
    mixer.load_state_dict(projections, strict=False)  # the kernel parameters keep their initialisation
    mixer.norm = getattr(attn, "norm", mixer.norm)  # timm's scale_norm: the mixed tokens' norm before proj
    return mixer
