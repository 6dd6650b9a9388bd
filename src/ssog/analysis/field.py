"""How the continuous family's vector field is used: its two gated branches along the flow.

The field is ``f(t, x) = g_a * Op(N(x)(1 + s_a) + b_a) + g_m * MLP(N(x)(1 + s_m) + b_m)``
(docs/models.md, "The continuous family"). For every evaluation of one forward pass this
records the time ``t``, the mean ``|g|`` of each branch's gate over channels, and the size
of each gated branch, of the whole field and of the state ``x``: whether both branches carry
the flow or one is nearly shut (docs/results/schedule.md, "A fair continuous baseline").
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..layers import SSoGAttention
from ..models.odevit import VectorField, timestep_embedding
from .kernels import mixture_reach

__all__ = ["field_branches", "token_rms"]


def token_rms(x: Tensor) -> float:
    """Root-mean-square over channels, averaged over tokens and images: ``x (B, T, D)`` -> a
    float, in the units of the tokens."""
    return float(x.detach().double().pow(2).mean(dim=-1).sqrt().mean())


@torch.no_grad()
def field_branches(model: nn.Module, images: Tensor) -> dict[str, Any]:
    """The branches of ``model.field`` at each evaluation of one forward pass on ``images``.

    Returns ``evaluations``: a list (in call order) of ``{"t", "gate_mixer", "gate_mlp",
    "mixer", "mlp", "field", "state"}``, where the gates are mean ``|g_a|``, ``|g_m|`` over
    channels, ``mixer``/``mlp`` the :func:`token_rms` of ``g_a * Op(...)`` and
    ``g_m * MLP(...)``, ``field`` that of ``f(t, x)`` and ``state`` that of ``x``; and their
    means over the evaluations, with ``mlp_share`` = mean ``mlp`` / (mean ``mixer`` + mean
    ``mlp``). With a fixed SSoG mixer each evaluation also has ``kernel_reach``, the mean over heads
    of :func:`~ssog.analysis.kernels.mixture_reach` (tokens) at its ``t``, and ``kernel_reach_by_head``:
    constant along the flow unless the field has ``time_kernels``. Raises ``ValueError`` for a
    model without a :class:`VectorField`.
    """
    field = getattr(model, "field", None)
    if not isinstance(field, VectorField):
        raise ValueError(
            f"{type(model).__name__} has no vector field: the field analysis is for the continuous "
            "(ODE-ViT) family"
        )
    outputs: dict[str, Tensor] = {}
    evaluations: list[dict[str, Any]] = []
    fixed_kernels = isinstance(field.attn, SSoGAttention) and not field.attn.steer

    def on_field(module: VectorField, args: tuple[Any, ...], out: Tensor) -> None:
        t, x = args[:2]  # (t, x, grid_size[, prepared])
        emb = timestep_embedding(t, module.dim).to(x.dtype).unsqueeze(0)
        _, _, gate_mixer, _, _, gate_mlp = module.adaLN_modulation(emb).chunk(6, dim=-1)
        evaluations.append({
            "t": float(t),
            "gate_mixer": float(gate_mixer.abs().mean()),
            "gate_mlp": float(gate_mlp.abs().mean()),
            "mixer": token_rms(gate_mixer * outputs["mixer"]),
            "mlp": token_rms(gate_mlp * outputs["mlp"]),
            "field": token_rms(out),
            "state": token_rms(x),
        })
        if fixed_kernels:
            reach = mixture_reach(*(p.double() for p in module.kernels_at(t)))
            evaluations[-1].update(kernel_reach=float(reach.mean()), kernel_reach_by_head=reach.tolist())

    handles = [
        field.attn.register_forward_hook(lambda m, a, out: outputs.__setitem__("mixer", out)),
        field.mlp.register_forward_hook(lambda m, a, out: outputs.__setitem__("mlp", out)),
        field.register_forward_hook(on_field),
    ]
    try:
        model(images)
    finally:
        for handle in handles:
            handle.remove()
    means = {key: sum(e[key] for e in evaluations) / len(evaluations)
             for key in ("gate_mixer", "gate_mlp", "mixer", "mlp", "field", "state")}
    branches = means["mixer"] + means["mlp"]
    return {
        "images": len(images),
        "evaluations": evaluations,
        "mean": means,
        "mlp_share": means["mlp"] / branches if branches > 0 else None,
    }
