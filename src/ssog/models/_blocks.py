"""Pieces shared by the three families: the token-mixer and MLP factories and the pre-norm block."""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from timm.layers import DropPath, Mlp

from ..layers import MultiHeadAttention, SSoGAttention
from ..layers.ssog_attention import STEERABLE
from ..ops.checks import check_steer

#: The token mixers a model can be built with, by ``op``.
MIXERS: dict[str, type[MultiHeadAttention] | type[SSoGAttention]] = {"mha": MultiHeadAttention, "ssog": SSoGAttention}
#: The values ``op`` takes: the names of :data:`MIXERS`.
MIXER_NAMES: tuple[str, ...] = tuple(MIXERS)
#: Constructor arguments of a mixer that the model sets from its own (width, heads, prefix
#: tokens, biases, dropout, token grid, device); every other one is a mixer option.
MODEL_SET: frozenset[str] = frozenset({"dim", "num_heads", "num_prefix_tokens", "qkv_bias", "proj_drop",
                                       "kernel_scale", "device", "dtype"})


def mixer_options(op: str) -> dict[str, inspect.Parameter]:
    """The options of the mixer ``op`` a model forwards to it: its constructor's arguments but
    those of :data:`MODEL_SET`, with their defaults (the mixer's signature is their one home)."""
    if op not in MIXERS:
        raise ValueError(f"unknown op {op!r}: expected one of {', '.join(MIXER_NAMES)}")
    parameters = inspect.signature(MIXERS[op]).parameters
    return {name: parameter for name, parameter in parameters.items() if name not in MODEL_SET}


def resolve_mixer_args(op: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``options`` (``None`` values: the mixer's default) against the mixer ``op``; return
    the options in effect.

    For ``op="ssog"`` the result holds every option of :func:`mixer_options` with its effective
    value (``steer`` as a tuple of names); for ``op="mha"`` the options given.

    Raises:
        ValueError: an option of another mixer, naming the ``op`` that takes it.
        TypeError: an option no mixer takes, as Python's for an unexpected keyword (timm's
            model contract: unknown constructor arguments raise ``TypeError``).
    """
    known = mixer_options(op)
    given = {name: value for name, value in options.items() if value is not None}
    unknown = sorted(set(given) - set(known))
    if unknown:
        owners = [other for other in MIXER_NAMES if other != op and set(unknown) <= set(mixer_options(other))]
        if owners:
            raise ValueError(f"option(s) {unknown} only apply to op={owners[0]!r}, not op={op!r}")
        raise TypeError(f"unexpected option(s) {unknown}: neither a model argument nor an option of the {op!r} "
                        f"mixer ({', '.join(sorted(known))})")
    if op != "ssog":
        return given
    resolved = {name: given.get(name, parameter.default) for name, parameter in known.items()}
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
    mixer_kwargs: Mapping[str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> MultiHeadAttention | SSoGAttention:
    """Build the token mixer ``op`` with its options ``mixer_kwargs`` (see
    :func:`resolve_mixer_args`), its parameters on ``device`` in ``dtype``.

    Both mixers are called ``mixer(x, grid_size)`` with ``x (B, P + Hg*Wg, dim)``.
    """
    if op not in MIXERS:
        raise ValueError(f"unknown op {op!r}: expected one of {', '.join(MIXER_NAMES)}")
    return MIXERS[op](
        dim, num_heads, num_prefix_tokens=num_prefix_tokens, qkv_bias=qkv_bias, proj_drop=proj_drop,
        device=device, dtype=dtype, **(mixer_kwargs or {}),
    )


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
        mixer_kwargs: Mapping[str, Any] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dd: dict[str, Any] = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.attn = create_mixer(
            op, dim, num_heads, num_prefix_tokens=num_prefix_tokens, qkv_bias=qkv_bias,
            proj_drop=proj_drop, mixer_kwargs=mixer_kwargs, **dd,
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.mlp = create_mlp(dim, mlp_ratio, proj_drop=proj_drop, **dd)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, grid_size: tuple[int, int], prepared: Any = None) -> Tensor:
        """``x (B, P + Hg*Wg, dim)`` -> same shape. ``prepared``: the mixer's ``prepare(grid_size)``,
        computed once by a model that applies the block several times per forward pass."""
        x = x + self.drop_path1(self.attn(self.norm1(x), grid_size, prepared=prepared))
        return x + self.drop_path2(self.mlp(self.norm2(x)))

