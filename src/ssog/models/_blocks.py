"""Pieces shared by the three families: the token-mixer and MLP factories and the pre-norm block."""
from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn
from timm.layers import DropPath, Mlp

from ..layers import MultiHeadAttention, SSoGAttention
from ..layers.ssog_attention import STEERABLE
from ..ops.checks import check_steer

#: Token mixers a model can be built with.
OPS: tuple[str, ...] = ("mha", "ssog")
#: Keyword arguments of :class:`~ssog.layers.SSoGAttention` a model forwards to it.
SSOG_OPTIONS: tuple[str, ...] = (
    "num_atoms", "sigma_min", "steer", "steer_radius", "steer_gate_init", "backend",
    "centre_init", "centre_radius", "width_init",
)


def resolve_mixer_args(op: str, **options: Any) -> dict[str, Any]:
    """Validate ``op`` and the SSoG options; return the SSoG options in effect.

    ``options`` maps names of :data:`SSOG_OPTIONS` to a value or ``None`` ("the layer's
    default"). For ``op="ssog"`` the result holds every option with its effective value
    (defaults read from ``SSoGAttention``'s signature, so they live in one place); for
    ``op="mha"`` it is empty, and setting any SSoG option is an error rather than being
    silently ignored.
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}: expected one of {', '.join(OPS)}")
    unknown = set(options) - set(SSOG_OPTIONS)
    if unknown:
        raise ValueError(f"unknown SSoG option(s) {sorted(unknown)}: expected {SSOG_OPTIONS}")
    given = {k: v for k, v in options.items() if v is not None}
    if op == "mha":
        if given:
            raise ValueError(f"SSoG option(s) {sorted(given)} only apply to op='ssog', not op='mha'")
        return {}
    defaults = inspect.signature(SSoGAttention).parameters
    resolved = {name: given.get(name, defaults[name].default) for name in SSOG_OPTIONS}
    resolved["steer"] = check_steer(resolved["steer"], STEERABLE)  # "mu" is one name, not the letters m, u
    return resolved


def create_mixer(
    op: str,
    dim: int,
    num_heads: int,
    *,
    num_prefix_tokens: int,
    qkv_bias: bool = True,
    proj_drop: float = 0.0,
    ssog_args: dict[str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Build the token mixer ``op`` (see :func:`resolve_mixer_args` for ``ssog_args``) with
    its parameters on ``device`` in ``dtype``.

    Both mixers are called ``mixer(x, grid_size)`` with ``x (B, P + Hg*Wg, dim)``.
    """
    if op == "mha":
        return MultiHeadAttention(
            dim, num_heads, qkv_bias=qkv_bias, proj_drop=proj_drop,
            num_prefix_tokens=num_prefix_tokens, device=device, dtype=dtype,
        )
    if op == "ssog":
        return SSoGAttention(
            dim, num_heads, num_prefix_tokens=num_prefix_tokens, qkv_bias=qkv_bias,
            proj_drop=proj_drop, device=device, dtype=dtype, **(ssog_args or {}),
        )
    raise ValueError(f"unknown op {op!r}: expected one of {', '.join(OPS)}")


def create_mlp(
    dim: int,
    mlp_ratio: float,
    *,
    proj_drop: float = 0.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Mlp:
    """The MLP of a block: ``(..., dim) -> (..., dim)`` through ``int(dim * mlp_ratio)``
    GELU units, dropout ``proj_drop``; its parameters on ``device`` in ``dtype``."""
    return Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=proj_drop, device=device, dtype=dtype)


class Block(nn.Module):
    """Pre-norm transformer block, as timm's ``vision_transformer.Block``.

    ``x + DropPath(Mixer(LN(x)))`` then ``x + DropPath(MLP(LN(x)))``; the mixer is called
    positionally ``attn(x, grid_size)`` so a forward hook sees every application.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        op: str = "mha",
        *,
        num_prefix_tokens: int = 1,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        ssog_args: dict[str, Any] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.attn = create_mixer(
            op, dim, num_heads, num_prefix_tokens=num_prefix_tokens, qkv_bias=qkv_bias,
            proj_drop=proj_drop, ssog_args=ssog_args, **dd,
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.mlp = create_mlp(dim, mlp_ratio, proj_drop=proj_drop, **dd)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, grid_size: tuple[int, int]) -> Tensor:
        """``x (B, P + Hg*Wg, dim)`` -> same shape."""
        x = x + self.drop_path1(self.attn(self.norm1(x), grid_size))
        return x + self.drop_path2(self.mlp(self.norm2(x)))

