"""Discrete family: a stack of ``depth`` pre-norm blocks (timm's ViT with a choice of mixer)."""
from __future__ import annotations

import logging
from typing import Any, Iterator

from torch import Tensor, nn
from timm.models._features import feature_take_indices

from ..layers.options import check_options
from ..layers import CLASS_TOKEN_POOLING
from ._base import ViTBase
from ._blocks import Block
from ._registry import register_family

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
    depth_arg = "depth"

    def __init__(self, depth: int = 12, **kwargs: Any) -> None:
        check_options({"depth": depth})  # before the base builds anything
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


register_family(__name__, ViT)
