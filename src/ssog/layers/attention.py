"""``MultiHeadAttention``: the dense baseline on fused scaled-dot-product attention."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops.checks import check_tokens
from ._tokens import refuse_torchscript
from .options import check_heads, check_integer, check_probability

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with fused q/k/v (``qkv``) and output (``proj``) projections.

    Parameter names and counts match timm's ``Attention``, so a ViT built on it has exactly
    timm's parameter count. ``forward(x, grid_size)`` takes the grid only to share the token
    mixers' signature (and to check the token count); attention itself ignores geometry.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        num_prefix_tokens: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dd: dict[str, Any] = {"device": device, "dtype": dtype}
        self.check_options(dict(dim=dim, num_heads=num_heads, attn_drop=attn_drop, proj_drop=proj_drop,
                                num_prefix_tokens=num_prefix_tokens))
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.num_prefix_tokens = num_prefix_tokens
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias, **dd)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    @staticmethod
    def check_options(options: Mapping[str, Any]) -> None:
        """The numeric options of this mixer in ``options`` (absent or ``None``: the default),
        each in its range, and ``dim`` (where given) split into ``num_heads`` equal heads; the
        constructor runs it, and the model families on their mixer options before they build
        anything."""
        if "dim" in options:
            check_heads(options["dim"], options["num_heads"])
        check_probability("attn_drop", options.get("attn_drop"))
        check_probability("proj_drop", options.get("proj_drop"))
        check_integer("num_prefix_tokens", options.get("num_prefix_tokens"), 0)

    def _qkv(self, x: Tensor, grid_size: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
        batch, tokens, _ = check_tokens(x, grid_size, self.num_prefix_tokens, self.dim)
        qkv = self.qkv(x).view(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)  # each (B, H, T, d)

    __prepare_scriptable__ = refuse_torchscript

    def prepare(self, grid_size: tuple[int, int]) -> None:
        """Nothing: attention computes nothing per grid that a block applied several times could
        share (the token mixers' common interface; :meth:`ssog.layers.SSoGAttention.prepare`)."""
        return None

    def forward(self, x: Tensor, grid_size: tuple[int, int], prepared: None = None) -> Tensor:
        """``x (B, T, dim)`` -> same shape (``prepared``: :meth:`prepare`'s, nothing)."""
        q, k, v = self._qkv(x, grid_size)
        dropout = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(x.shape)))

    def attention_matrix(self, x: Tensor, grid_size: tuple[int, int]) -> Tensor:
        """Softmax attention weights ``(B, H, T, T)`` (rows sum to 1)."""
        q, k, _ = self._qkv(x, grid_size)
        return (q @ k.transpose(-1, -2) * self.head_dim**-0.5).softmax(dim=-1)
