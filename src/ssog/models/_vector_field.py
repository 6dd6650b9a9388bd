"""The continuous family's vector field: one time-conditioned block, ``dx/dt = f(t, x)``
(docs/models.md, "The continuous family"); :class:`~ssog.models.odevit.OdeViT` integrates it."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from timm.layers import DropPath

from ..layers import KERNEL_OFFSET_SIZE, CenterNorm, SSoGAttention
from ._blocks import create_mixer, create_mlp

__all__ = ["FIELD_NORMS", "VectorField", "timestep_embedding"]

#: Parameter-free norms of the vector field.
FIELD_NORMS: tuple[str, ...] = ("center", "layernorm")


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10000.0, scale: float = 10.0) -> Tensor:
    """Sinusoidal embedding ``(dim,)`` of a scalar time ``t``, laid out as DiT's.

    Frequencies are geometric from ``scale`` down to ``scale / max_period`` (radians per
    unit time); the first half is ``cos(f t)``, the second ``sin(f t)`` (one zero pad when
    ``dim`` is odd). DiT embeds integer steps 0..999; on ``t`` in ``[0, 1]`` we keep the
    fastest component under two turns, so the field is smooth in ``t`` on the scale of a
    12-step solver and adaptive solvers need not resolve fast oscillations. Computed in
    float64 for a float64 ``t``, else float32.
    """
    dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    half = dim // 2
    exponents = torch.arange(half, device=t.device, dtype=dtype) / half
    freqs = scale * torch.exp(-math.log(max_period) * exponents)
    args = t.to(dtype).reshape(()) * freqs
    emb = torch.cat([torch.cos(args), torch.sin(args)])
    if dim % 2:
        emb = torch.cat([emb, emb.new_zeros(1)])
    return emb


class VectorField(nn.Module):
    """``f(t, x) = g_a * Op(N(x)(1 + s_a) + b_a) + g_m * MLP(N(x)(1 + s_m) + b_m)``.

    ``(s_a, b_a, g_a, s_m, b_m, g_m) = Linear(D, 6D)(SiLU(emb(t)))`` (:func:`timestep_embedding`);
    the modulation starts at zero (adaLN-Zero), so the flow starts as the identity. ``N`` is
    :class:`~ssog.layers.CenterNorm` (``norm="center"``, linear, so with fixed SSoG the
    field is globally Lipschitz in ``x``) or LayerNorm without affine (``"layernorm"``).

    ``time_kernels=True`` (SSoG only) lets the mixer's kernels move with ``t``: a second
    adaLN-Zero map ``Linear(D, H*R*5)(SiLU(emb(t)))`` adds offsets to the centres, the widths
    (before the softplus) and the mixture logits of every head and atom
    (:meth:`SSoGAttention.forward`'s ``kernel_offset``). Attention's field changes its mixing
    with ``t`` through the modulated queries and keys; a fixed kernel cannot, and this gives it
    the way to, at ``(D + 1) * H*R*5`` parameters and one build of the 1-D kernels per evaluation.

    Call ``field(t, x, (Hg, Wg))`` with a scalar tensor ``t`` and tokens ``x (B, P + Hg*Wg, D)``
    on a token grid of ``Hg x Wg``; ``field.nfe`` counts the calls.
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
        mixer_kwargs: dict[str, Any] | None = None,
        norm: str = "center",
        time_kernels: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dd: dict[str, Any] = {"device": device, "dtype": dtype}
        if norm not in FIELD_NORMS:
            raise ValueError(f"unknown field norm {norm!r}: expected one of {FIELD_NORMS}")
        if not isinstance(time_kernels, bool):
            raise ValueError(f"time_kernels={time_kernels!r}: expected true or false")
        self.dim = dim
        self.norm = CenterNorm(dim) if norm == "center" else nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False, **dd)
        self.attn = create_mixer(
            op, dim, num_heads, num_prefix_tokens=num_prefix_tokens, qkv_bias=qkv_bias,
            proj_drop=proj_drop, mixer_kwargs=mixer_kwargs, **dd,
        )
        self.mlp = create_mlp(dim, mlp_ratio, proj_drop=proj_drop, **dd)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim, **dd))
        self.kernel_modulation: nn.Sequential | None = None
        if time_kernels:
            if not isinstance(self.attn, SSoGAttention):
                raise ValueError(
                    f"time_kernels moves SSoG's kernels with t, and op {op!r} has none: use op='ssog' or "
                    "time_kernels=False"
                )
            if self.attn.steer:
                raise ValueError(
                    "time_kernels moves SSoG's fixed kernels with t, and this mixer steers them by the tokens "
                    f"(steer={list(self.attn.steer)}): use one or the other"
                )
            offsets = self.attn.num_heads * self.attn.num_atoms * KERNEL_OFFSET_SIZE
            self.kernel_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, offsets, **dd))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.nfe = 0

    def zero_modulation(self) -> None:
        """adaLN-Zero: all gates and shifts 0, so ``f = 0`` and the flow is the identity; the
        kernels' offsets (``time_kernels``) 0, so they start as the mixer's own."""
        for modulation in (self.adaLN_modulation, self.kernel_modulation):
            if modulation is not None:
                for parameter in modulation.parameters():
                    nn.init.zeros_(parameter)

    @property
    def time_kernels(self) -> bool:
        """Whether the mixer's kernels move with ``t`` (the constructor's ``time_kernels``)."""
        return self.kernel_modulation is not None

    def _kernel_offset(self, embedding: Tensor) -> Tensor | None:
        """The kernels' offsets ``(H, R, 5)`` at the time embedded as ``embedding (1, D)`` with
        ``time_kernels``, else ``None``."""
        if self.kernel_modulation is None:
            return None
        return self.kernel_modulation(embedding).view(self.attn.num_heads, self.attn.num_atoms, KERNEL_OFFSET_SIZE)

    def kernel_offset(self, t: Tensor) -> Tensor | None:
        """What ``time_kernels`` adds to the mixer's kernel parameters at time ``t`` (a scalar
        tensor): ``(H, R, 5)`` (:meth:`SSoGAttention.forward`'s ``kernel_offset``), else ``None``."""
        if self.kernel_modulation is None:
            return None
        dtype = next(self.kernel_modulation.parameters()).dtype
        return self._kernel_offset(timestep_embedding(t, self.dim).to(dtype).unsqueeze(0))

    def kernels_at(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The SSoG mixer's Gaussian mixture at time ``t`` (a scalar tensor): ``mu, sigma (H, R, 2)``
        in tokens and ``weight (H, R)``; the same at every ``t`` without ``time_kernels``.
        Raises ``ValueError`` for an MHA field or a steered mixer (whose mixture follows the tokens)."""
        if not isinstance(self.attn, SSoGAttention):
            raise ValueError(f"kernels_at gives an SSoG mixture; this field mixes with {type(self.attn).__name__}")
        if self.attn.steer:
            raise ValueError("kernels_at gives a fixed SSoG mixture; this field's is steered by the tokens")
        return self.attn.mixture(kernel_offset=self.kernel_offset(t))

    def prepare(self, grid_size: tuple[int, int]) -> Any:
        """What the mixer computes once per integration (its ``prepare``), or ``None`` with
        ``time_kernels``, whose kernels are built at each evaluation."""
        return None if self.time_kernels else self.attn.prepare(grid_size)

    def forward(self, t: Tensor, x: Tensor, grid_size: tuple[int, int], prepared: Any = None) -> Tensor:
        """``t`` scalar tensor, ``x (B, P + Hg*Wg, D)`` on the grid ``grid_size = (Hg, Wg)`` ->
        ``dx/dt`` of the same shape. ``prepared``: the mixer's ``prepare(grid_size)``, computed
        once per integration."""
        self.nfe += 1
        # (1, D) rather than (D,): a 2-D input makes the modulation a matmul FLOP counters see.
        c = timestep_embedding(t, self.dim).to(x.dtype).unsqueeze(0)
        s_a, b_a, g_a, s_m, b_m, g_m = self.adaLN_modulation(c).chunk(6, dim=-1)
        h = self.norm(x)
        mixer_input = h * (1 + s_a) + b_a
        offset = self._kernel_offset(c)
        if offset is not None:
            attn = g_a * self.attn(mixer_input, grid_size, kernel_offset=offset)
        else:
            attn = g_a * self.attn(mixer_input, grid_size, prepared=prepared)
        mlp = g_m * self.mlp(h * (1 + s_m) + b_m)
        return self.drop_path(attn) + self.drop_path(mlp)
