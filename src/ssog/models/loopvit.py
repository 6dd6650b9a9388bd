"""Looped family (bViT): one shared pre-norm block applied ``num_loops`` times."""
from __future__ import annotations

from typing import Any, Iterator

from torch import Tensor
from timm.models._features import feature_take_indices

from ..layers.options import check_options
from ._base import ViTBase
from ._blocks import Block
from ._registry import register_family

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
    depth_arg = "num_loops"

    def __init__(self, num_loops: int = 12, **kwargs: Any) -> None:
        check_options({"num_loops": num_loops})  # before the base builds anything
        super().__init__(**kwargs)
        self.num_loops = num_loops
        self.block = Block(**self._block_args(), drop_path=self.drop_path_rate)
        self.init_weights()

    def _family_config(self) -> dict[str, Any]:
        return {"num_loops": self.num_loops}

    def forward_tokens(self, x: Tensor, grid_size: tuple[int, int]) -> Tensor:
        for _ in range(self.num_loops):
            x = self._maybe_checkpoint(self.block, x, grid_size)
        return x

    @property
    def num_intermediates(self) -> int:
        return self.num_loops

    def _states(self, x: Tensor, grid_size: tuple[int, int], last: int) -> Iterator[Tensor]:
        for _ in range(last + 1):
            x = self._maybe_checkpoint(self.block, x, grid_size)
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


register_family(__name__, LoopViT)
