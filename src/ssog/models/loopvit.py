"""Looped family (bViT): one shared pre-norm block applied ``num_loops`` times."""
from __future__ import annotations

from typing import Any, Iterator

from torch import Tensor
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices

from ..layers.options import check_integer
from ._base import ViTBase
from ._blocks import Block
from ._registry import CIFAR_CFG, DIGITS_CFG, build_registered, model_cfg

__all__ = ["LoopViT"]


class LoopViT(ViTBase):
    """Vision Transformer whose single block is applied ``num_loops`` times (weight sharing).

    The parameter count is one block's plus the embeddings, final norm and head. The same
    ``drop_path_rate`` applies at every iteration (a fresh mask each time).

    Args:
        num_loops: iterations of the shared block (``K``, 12 in the paper).
        **kwargs: see :class:`~ssog.models._base.ViTBase`.
    """

    family = "loopvit"

    def __init__(self, num_loops: int = 12, **kwargs: Any) -> None:
        check_integer("num_loops", num_loops, 1)  # before the base builds anything
        super().__init__(**kwargs)
        self.num_loops = num_loops
        self.block = Block(**self._block_args(), drop_path=self.drop_path_rate)
        self.init_weights()

    def _family_config(self) -> dict[str, Any]:
        return {"num_loops": self.num_loops}

    def forward_tokens(self, x: Tensor, grid_size: tuple[int, int]) -> Tensor:
        prepared = self.block.attn.prepare(grid_size)  # once for every application of the shared block
        for _ in range(self.num_loops):
            x = self._maybe_checkpoint(self.block, x, grid_size, prepared)
        return x

    @property
    def num_intermediates(self) -> int:
        return self.num_loops

    def _states(self, x: Tensor, grid_size: tuple[int, int], last: int) -> Iterator[Tensor]:
        prepared = self.block.attn.prepare(grid_size)
        for _ in range(last + 1):
            x = self._maybe_checkpoint(self.block, x, grid_size, prepared)
            yield x

    def _feature_module(self, index: int) -> str:
        return "block"

    def _block_groups(self) -> list[tuple[str, Any]]:
        return [(r"^block\.", None)]  # the shared block: one group (the final norm goes with the head)

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True,
    ) -> list[int]:
        """As the base, and stop looping after the last requested iteration."""
        _, max_index = feature_take_indices(self.num_intermediates, indices)
        take = super().prune_intermediate_layers(indices, prune_norm, prune_head)
        self.num_loops = max_index + 1
        return take


# ------------------------------------------------------------------ registered models
default_cfgs = generate_default_cfgs({
    "mha_loopvit_small_patch16_224": model_cfg(),
    "mha_loopvit_medium_patch16_224": model_cfg(),
    "mha_loopvit_base_patch16_224": model_cfg(),
    "mha_loopvit_tiny_patch4_32": model_cfg(**CIFAR_CFG),
    "mha_loopvit_micro_patch1_8": model_cfg(**DIGITS_CFG),
    "mha_loopvit_digits_patch2_8": model_cfg(**DIGITS_CFG),
    "ssog_loopvit_small_patch16_224": model_cfg(),
    "ssog_loopvit_medium_patch16_224": model_cfg(),
    "ssog_loopvit_base_patch16_224": model_cfg(),
    "ssog_loopvit_tiny_patch4_32": model_cfg(**CIFAR_CFG),
    "ssog_loopvit_micro_patch1_8": model_cfg(**DIGITS_CFG),
    "ssog_loopvit_digits_patch2_8": model_cfg(**DIGITS_CFG),
})


@register_model
def mha_loopvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with multi-head attention, the paper's small width (ViT-S/16, 224 px)."""
    model_args = dict(op="mha", embed_dim=384, num_heads=6, num_loops=12)
    return build_registered(LoopViT, "mha_loopvit_small_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_loopvit_medium_patch16_224(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with multi-head attention, the paper's medium width (patch 16, 224 px)."""
    model_args = dict(op="mha", embed_dim=576, num_heads=9, num_loops=12)
    return build_registered(LoopViT, "mha_loopvit_medium_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_loopvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with multi-head attention, the paper's base width (ViT-B/16, 224 px)."""
    model_args = dict(op="mha", embed_dim=768, num_heads=12, num_loops=12)
    return build_registered(LoopViT, "mha_loopvit_base_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_loopvit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with multi-head attention, CPU size: 32 px CIFAR images, 8x8 tokens."""
    model_args = dict(op="mha", img_size=32, patch_size=4, embed_dim=128, num_heads=4, num_loops=6)
    return build_registered(LoopViT, "mha_loopvit_tiny_patch4_32", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_loopvit_micro_patch1_8(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with multi-head attention, CPU size: 8x8 single-channel digits, one token per pixel."""
    model_args = dict(op="mha", img_size=8, patch_size=1, embed_dim=64, num_heads=4, num_loops=4)
    return build_registered(LoopViT, "mha_loopvit_micro_patch1_8", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_loopvit_digits_patch2_8(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with multi-head attention, CPU size: 8x8 single-channel digits, 2x2-pixel patches, average pooling."""
    model_args = dict(op="mha", img_size=8, patch_size=2, embed_dim=64, num_heads=4, global_pool="avg", num_loops=4)
    return build_registered(LoopViT, "mha_loopvit_digits_patch2_8", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_loopvit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with SSoG, the paper's small width (ViT-S/16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=384, num_heads=6, num_loops=12)
    return build_registered(LoopViT, "ssog_loopvit_small_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_loopvit_medium_patch16_224(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with SSoG, the paper's medium width (patch 16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=576, num_heads=9, num_loops=12)
    return build_registered(LoopViT, "ssog_loopvit_medium_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_loopvit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with SSoG, the paper's base width (ViT-B/16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=768, num_heads=12, num_loops=12)
    return build_registered(LoopViT, "ssog_loopvit_base_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_loopvit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with SSoG, CPU size: 32 px CIFAR images, 8x8 tokens."""
    model_args = dict(op="ssog", img_size=32, patch_size=4, embed_dim=128, num_heads=4, num_loops=6)
    return build_registered(LoopViT, "ssog_loopvit_tiny_patch4_32", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_loopvit_micro_patch1_8(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with SSoG, CPU size: 8x8 single-channel digits, one token per pixel."""
    model_args = dict(op="ssog", img_size=8, patch_size=1, embed_dim=64, num_heads=4, num_loops=4)
    return build_registered(LoopViT, "ssog_loopvit_micro_patch1_8", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_loopvit_digits_patch2_8(pretrained: bool = False, **kwargs: Any) -> LoopViT:
    """LoopViT with SSoG, CPU size: 8x8 single-channel digits, 2x2-pixel patches, average pooling."""
    model_args = dict(op="ssog", img_size=8, patch_size=2, embed_dim=64, num_heads=4, global_pool="avg", num_loops=4)
    return build_registered(LoopViT, "ssog_loopvit_digits_patch2_8", pretrained, **dict(model_args, **kwargs))
