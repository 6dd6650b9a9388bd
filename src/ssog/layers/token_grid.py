"""Token grids taken from each image: :class:`SSoGAttention` layers inside a timm ViT, whose
images (and so grids) may change size from one batch to the next."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from .ssog_attention import SSoGAttention


class TokenGridFromImages:
    """``patch_embed``'s forward pre-hook that sets the token grid of ``mixers`` from each
    image batch ``(B, C, H, W)``: ``patch_embed.dynamic_feat_size((H, W))`` where timm's patch
    embedding has it (rounded up under ``dynamic_img_pad``), else ``(H // patch_h, W // patch_w)``.

    An object rather than a closure, so that ``copy.deepcopy`` of the model (an EMA copy)
    copies the mixers it sets with the model's, and ``torch.save`` can pickle it.
    """

    def __init__(self, mixers: Sequence[SSoGAttention]) -> None:
        self.mixers = list(mixers)

    def __call__(self, patch_embed: Any, inputs: tuple[Tensor, ...]) -> None:
        height, width = inputs[0].shape[-2:]
        if hasattr(patch_embed, "dynamic_feat_size"):
            grid = tuple(patch_embed.dynamic_feat_size((height, width)))
        else:
            grid = (height // patch_embed.patch_size[0], width // patch_embed.patch_size[1])
        for mixer in self.mixers:
            mixer.grid_size = grid


def follow_model_grid(model: nn.Module) -> list[SSoGAttention]:
    """Let the :class:`SSoGAttention` layers of a timm ViT (built with
    ``attn_layer=SSoGAttention``, or converted) take their token grid from each image and their
    number of prefix tokens from the model: ``model.num_prefix_tokens`` (class, register and
    distillation tokens), and a :class:`TokenGridFromImages` hook on ``model.patch_embed``. The
    layers then work on non-square images, at any size under ``dynamic_img_size``, and with
    register tokens. Returns the layers; a model without them, a patch embedding or
    ``num_prefix_tokens`` is a ValueError."""
    mixers = [module for module in model.modules() if isinstance(module, SSoGAttention)]
    patch_embed = getattr(model, "patch_embed", None)
    num_prefix_tokens = getattr(model, "num_prefix_tokens", None)
    if not mixers or patch_embed is None or num_prefix_tokens is None:
        raise ValueError(f"follow_model_grid() takes a timm ViT (patch_embed, num_prefix_tokens) with SSoGAttention "
                         f"layers, got {type(model).__name__}")
    for mixer in mixers:
        mixer.num_prefix_tokens = num_prefix_tokens
    patch_embed.register_forward_pre_hook(TokenGridFromImages(mixers))
    return mixers


__all__ = ["TokenGridFromImages", "follow_model_grid"]
