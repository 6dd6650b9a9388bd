"""Discrete family: a stack of ``depth`` pre-norm blocks (timm's ViT with a choice of mixer)."""
from __future__ import annotations

import logging
from typing import Any, Iterator

from torch import Tensor, nn
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices

from ..layers.options import check_integer
from ..layers import CLASS_TOKEN_POOLING
from ._base import ViTBase
from ._blocks import Block
from ._registry import CIFAR_CFG, DIGITS_CFG, build_registered, model_cfg

__all__ = ["ViT"]

logger = logging.getLogger(__name__)


class ViT(ViTBase):
    """Vision Transformer with ``depth`` independent pre-norm blocks.

    With ``op="mha"`` it has exactly the parameters of timm's ``VisionTransformer`` of the
    same width and depth. Stochastic depth grows linearly from 0 to ``drop_path_rate``
    over the blocks, as in timm.

    Args:
        depth: number of blocks.
        **kwargs: see :class:`~ssog.models._base.ViTBase`.
    """

    family = "vit"

    def __init__(self, depth: int = 12, **kwargs: Any) -> None:
        check_integer("depth", depth, 1)  # before the base builds anything
        super().__init__(**kwargs)
        self.depth = depth
        if self.op == "ssog" and self.global_pool == "token":
            logger.warning(
                "an SSoG ViT pooled by its class token never trains the last block's kernels: %s; global_pool='avg' "
                "without a class token is the SSoG default (docs/results/accuracy.md)", CLASS_TOKEN_POOLING,
            )
        block_args = self._block_args()
        self.blocks = nn.ModuleList(
            Block(**block_args, drop_path=rate)
            for rate in _linear_rates(self.drop_path_rate, depth)
        )
        self.init_weights()

    def _family_config(self) -> dict[str, Any]:
        return {"depth": self.depth}

    def forward_tokens(self, x: Tensor, grid_size: tuple[int, int]) -> Tensor:
        for block in self.blocks:
            x = self._maybe_checkpoint(block, x, grid_size)
        return x

    @property
    def num_intermediates(self) -> int:
        return len(self.blocks)

    def _states(self, x: Tensor, grid_size: tuple[int, int], last: int) -> Iterator[Tensor]:
        for block in self.blocks[: last + 1]:
            x = self._maybe_checkpoint(block, x, grid_size)
            yield x

    def _feature_module(self, index: int) -> str:
        return f"blocks.{index}"

    def _block_groups(self) -> list[tuple[str, Any]]:
        return [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]  # timm's VisionTransformer

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True,
    ) -> list[int]:
        """As the base, and drop the blocks after the last requested one."""
        _, max_index = feature_take_indices(self.num_intermediates, indices)
        take = super().prune_intermediate_layers(indices, prune_norm, prune_head)
        self.blocks = self.blocks[: max_index + 1]
        return take


def _linear_rates(rate: float, depth: int) -> list[float]:
    """Stochastic-depth rates rising linearly from 0 to ``rate`` over ``depth`` blocks."""
    return [rate * i / max(depth - 1, 1) for i in range(depth)]


# ------------------------------------------------------------------ registered models
default_cfgs = generate_default_cfgs({
    "mha_vit_small_patch16_224": model_cfg(),
    "mha_vit_medium_patch16_224": model_cfg(),
    "mha_vit_base_patch16_224": model_cfg(),
    "mha_vit_tiny_patch4_32": model_cfg(**CIFAR_CFG),
    "mha_vit_micro_patch1_8": model_cfg(**DIGITS_CFG),
    "mha_vit_digits_patch2_8": model_cfg(**DIGITS_CFG),
    "ssog_vit_small_patch16_224": model_cfg(),
    "ssog_vit_medium_patch16_224": model_cfg(),
    "ssog_vit_base_patch16_224": model_cfg(),
    "ssog_vit_tiny_patch4_32": model_cfg(**CIFAR_CFG),
    "ssog_vit_micro_patch1_8": model_cfg(**DIGITS_CFG),
    "ssog_vit_digits_patch2_8": model_cfg(**DIGITS_CFG),
})


@register_model
def mha_vit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with multi-head attention, the paper's small width (ViT-S/16, 224 px)."""
    model_args = dict(op="mha", embed_dim=384, num_heads=6, depth=12)
    return build_registered(ViT, "mha_vit_small_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_vit_medium_patch16_224(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with multi-head attention, the paper's medium width (patch 16, 224 px)."""
    model_args = dict(op="mha", embed_dim=576, num_heads=9, depth=12)
    return build_registered(ViT, "mha_vit_medium_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_vit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with multi-head attention, the paper's base width (ViT-B/16, 224 px)."""
    model_args = dict(op="mha", embed_dim=768, num_heads=12, depth=12)
    return build_registered(ViT, "mha_vit_base_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_vit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with multi-head attention, CPU size: 32 px CIFAR images, 8x8 tokens."""
    model_args = dict(op="mha", img_size=32, patch_size=4, embed_dim=128, num_heads=4, depth=6)
    return build_registered(ViT, "mha_vit_tiny_patch4_32", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_vit_micro_patch1_8(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with multi-head attention, CPU size: 8x8 single-channel digits, one token per pixel."""
    model_args = dict(op="mha", img_size=8, patch_size=1, embed_dim=64, num_heads=4, depth=4)
    return build_registered(ViT, "mha_vit_micro_patch1_8", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_vit_digits_patch2_8(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with multi-head attention, CPU size: 8x8 single-channel digits, 2x2-pixel patches, average pooling."""
    model_args = dict(op="mha", img_size=8, patch_size=2, embed_dim=64, num_heads=4, global_pool="avg", depth=4)
    return build_registered(ViT, "mha_vit_digits_patch2_8", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_vit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with SSoG, the paper's small width (ViT-S/16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=384, num_heads=6, depth=12)
    return build_registered(ViT, "ssog_vit_small_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_vit_medium_patch16_224(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with SSoG, the paper's medium width (patch 16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=576, num_heads=9, depth=12)
    return build_registered(ViT, "ssog_vit_medium_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_vit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with SSoG, the paper's base width (ViT-B/16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=768, num_heads=12, depth=12)
    return build_registered(ViT, "ssog_vit_base_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_vit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with SSoG, CPU size: 32 px CIFAR images, 8x8 tokens."""
    model_args = dict(op="ssog", img_size=32, patch_size=4, embed_dim=128, num_heads=4, depth=6)
    return build_registered(ViT, "ssog_vit_tiny_patch4_32", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_vit_micro_patch1_8(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with SSoG, CPU size: 8x8 single-channel digits, one token per pixel."""
    model_args = dict(op="ssog", img_size=8, patch_size=1, embed_dim=64, num_heads=4, depth=4)
    return build_registered(ViT, "ssog_vit_micro_patch1_8", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_vit_digits_patch2_8(pretrained: bool = False, **kwargs: Any) -> ViT:
    """ViT with SSoG, CPU size: 8x8 single-channel digits, 2x2-pixel patches, average pooling."""
    model_args = dict(op="ssog", img_size=8, patch_size=2, embed_dim=64, num_heads=4, global_pool="avg", depth=4)
    return build_registered(ViT, "ssog_vit_digits_patch2_8", pretrained, **dict(model_args, **kwargs))
