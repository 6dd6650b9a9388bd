"""Turn a timm VisionTransformer into an SSoG ViT, keeping every weight that still applies.

:func:`convert` replaces each block's self-attention with :class:`ConvertedAttention` (an
:class:`~ssog.layers.SSoGAttention` called as timm's blocks call attention). SSoG has a
value and an output projection but no query or key, so it keeps the value slice of ``qkv``
and ``proj``; the query/key slices (and ``q_norm``/``k_norm``) are dropped. Everything else
(patch and position embedding, class/register/distillation tokens, norms, MLPs, heads) is
untouched. Prefix tokens follow docs/operator.md: patch queries never read them, a prefix
query's output is the mean of the patch values.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .layers import SSoGAttention

__all__ = ["ConvertedAttention", "convert"]


class ConvertedAttention(SSoGAttention):
    """``SSoGAttention`` with timm's attention call ``attn(x, attn_mask=None)``.

    The token grid is not an argument there: :func:`convert` sets :attr:`grid_size` from
    each input image before the blocks run (a forward pre-hook on ``patch_embed``).
    """

    grid_size: tuple[int, int] | None = None

    def forward(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("SSoG mixes by position and takes no attention mask")
        grid = grid_size if grid_size is not None else self.grid_size
        if grid is None:
            raise ValueError("the token grid is unknown: run the converted model, or pass grid_size=(Hg, Wg)")
        return super().forward(x, grid)


def convert(model: nn.Module, **ssog_options: Any) -> nn.Module:
    """Replace every attention of the timm ``VisionTransformer`` ``model`` by SSoG, in place.

    Args:
        model: a timm ``VisionTransformer`` (ViT, DeiT and distilled DeiT, with registers...)
            whose blocks have ``attn.qkv`` and ``attn.proj``.
        **ssog_options: :class:`~ssog.layers.SSoGAttention` options (``num_atoms``,
            ``sigma_min``, ``steer``, ``centre_init``, ...).

    Returns:
        ``model``, its attentions now :class:`ConvertedAttention` with the value slice of
        ``qkv`` and the output projection copied; everything else keeps its weights.
    """
    blocks = getattr(model, "blocks", None)
    patch_embed = getattr(model, "patch_embed", None)
    if blocks is None or patch_embed is None or not hasattr(model, "num_prefix_tokens"):
        raise ValueError(f"convert() takes a timm VisionTransformer (blocks, patch_embed), got {type(model).__name__}")
    if getattr(model, "dynamic_img_size", False):
        raise ValueError("convert() needs a fixed token grid: build the timm model with dynamic_img_size=False")
    mixers = []
    for index, block in enumerate(blocks):
        mixers.append(_convert_attention(block.attn, model.num_prefix_tokens, f"blocks.{index}.attn", ssog_options))
        block.attn = mixers[-1]

    def set_grid(_: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        height, width = inputs[0].shape[-2:]
        patch_h, patch_w = patch_embed.patch_size
        for mixer in mixers:
            mixer.grid_size = (height // patch_h, width // patch_w)

    patch_embed.register_forward_pre_hook(set_grid)
    return model


def _convert_attention(
    attn: nn.Module, num_prefix_tokens: int, name: str, options: dict[str, Any]
) -> ConvertedAttention:
    qkv, proj = getattr(attn, "qkv", None), getattr(attn, "proj", None)
    if not isinstance(qkv, nn.Linear) or not isinstance(proj, nn.Linear):
        raise ValueError(f"{name} ({type(attn).__name__}) has no fused qkv and proj Linear layers to convert")
    if not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
        raise ValueError(f"{name} normalises its attention output (scale_norm), which SSoG cannot keep")
    dim = proj.in_features
    if qkv.in_features != dim or qkv.out_features != 3 * dim or proj.out_features != dim:
        raise ValueError(f"{name}: qkv {qkv.in_features}->{qkv.out_features} and proj {dim}->{proj.out_features} "
                         "are not the plain width-preserving attention SSoG replaces")
    mixer = ConvertedAttention(
        dim, attn.num_heads, num_prefix_tokens=num_prefix_tokens, qkv_bias=qkv.bias is not None,
        proj_drop=getattr(attn.proj_drop, "p", 0.0), device=qkv.weight.device, dtype=qkv.weight.dtype,
        **options,
    )
    with torch.no_grad():
        mixer.v.weight.copy_(qkv.weight[2 * dim:])
        if qkv.bias is not None:
            mixer.v.bias.copy_(qkv.bias[2 * dim:])
        mixer.proj.weight.copy_(proj.weight)
        if proj.bias is not None:
            mixer.proj.bias.copy_(proj.bias)
        else:
            mixer.proj.bias.zero_()
    return mixer
