"""The learned Gaussian mixtures of SSoG mixers: statistics and kernel maps.

Statistics follow the paper: the smallest learned width (Table 6, "learned sigma min"),
the mean distance of the atom centres from the query ``|mu|`` (Table 9), and the mixture
weights. A steered mixer's statistics are those of its fixed (unsteered) part, plus the
open fraction ``sigmoid(alpha)`` of each steering gate.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..layers import SSoGAttention, named_mixers
from ..models.odevit import VectorField
from ..ops import fixed_axis_kernels

__all__ = [
    "kernel_maps", "kernel_snapshots", "kernel_statistics", "mixer_kernel_statistics", "mixture_reach", "ssog_modules",
]


def mixture_reach(mu: Tensor, sigma: Tensor, weight: Tensor) -> Tensor:
    """How far each head reads: the root-mean-square distance from the query of its 2-D mixture,
    ``sqrt(sum_r w_r (|mu_r|^2 + |sigma_r|^2))``, in tokens, ``(H,)``, from ``mu, sigma (H, R, 2)``
    and ``weight (H, R)`` (the untruncated Gaussians: on a small grid the borders cut it short)."""
    return (weight * (mu.square() + sigma.square()).sum(dim=-1)).sum(dim=-1).sqrt()


def ssog_modules(model: nn.Module) -> list[tuple[str, SSoGAttention]]:
    """``(name, module)`` of every SSoG mixer (a shared one, looped or ODE, listed once)."""
    modules = [(name, module) for name, module in named_mixers(model, SSoGAttention)
               if isinstance(module, SSoGAttention)]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no SSoGAttention mixer: learned kernels are an SSoG property")
    return modules


@torch.no_grad()
def kernel_snapshots(model: nn.Module) -> list[tuple[str, SSoGAttention, Tensor | None]]:
    """``(label, mixer, kernel_offset)`` for each mixture the model's SSoG mixers use: one per
    mixer (offset ``None``), or, for a mixer whose field moves it with ``t`` (``time_kernels``),
    one at ``t = 0``, the middle and the end of the flow (``end_time``), labelled ``name@t=T``."""
    end_time = float(getattr(model, "end_time", 1.0))
    snapshots: list[tuple[str, SSoGAttention, Tensor | None]] = []
    for name, mixer in ssog_modules(model):
        field = model.get_submodule(name.rpartition(".")[0])
        if not (isinstance(field, VectorField) and field.time_kernels):
            snapshots.append((name, mixer, None))
            continue
        for t in (0.0, end_time / 2, end_time):
            snapshots.append((f"{name}@t={t:.2f}", mixer, field.kernel_offset(mixer.mu.new_tensor(t))))
    return snapshots


@torch.no_grad()
def mixer_kernel_statistics(mixer: SSoGAttention, kernel_offset: Tensor | None = None) -> dict[str, Any]:
    """Mixture of one SSoG mixer (moved by ``kernel_offset (H, R, 5)`` if given, see
    :meth:`SSoGAttention.forward`): parameters per head and their summary statistics.

    ``mu``, ``sigma``: ``[H][R][2]`` (y, x) in tokens; ``weight``: ``[H][R]``;
    ``min_sigma``: smallest width over heads, atoms and axes; ``mean_abs_mu``: mean over
    heads and atoms of ``||mu||_2``; ``effective_atoms``: mean over heads of
    ``exp(entropy(weight))``, the number of atoms a head's mixture spreads over (1: one atom
    carries it, ``R``: all equally); ``steer_gates``: ``{component: [H]}``.
    """
    params = {k: v.detach().double().cpu() for k, v in mixer.kernel_parameters(kernel_offset).items()}
    mu, sigma, weight = params["mu"], params["sigma"], params["weight"]
    entropy = -torch.special.xlogy(weight, weight).sum(dim=-1)  # (H,), 0 log 0 = 0
    return {
        "num_heads": mixer.num_heads,
        "num_atoms": mixer.num_atoms,
        "sigma_floor": mixer.sigma_min,
        "min_sigma": float(sigma.min()),
        "mean_abs_mu": float(mu.norm(dim=-1).mean()),
        "max_abs_mu": float(mu.norm(dim=-1).max()),
        "max_weight": float(weight.max()),
        "effective_atoms": float(entropy.exp().mean()),
        "mu": mu.tolist(),
        "sigma": sigma.tolist(),
        "weight": weight.tolist(),
        "steer": list(mixer.steer),
        "steer_gates": {name: torch.sigmoid(mixer.steer_gate_of(name).detach()).tolist() for name in mixer.steer},
    }


def kernel_statistics(model: nn.Module) -> dict[str, Any]:
    """Per-mixture :func:`mixer_kernel_statistics` (of :func:`kernel_snapshots`) and the model-wide ``min_sigma``,
    ``mean_abs_mu`` (over all atoms of all mixers), ``max_weight`` and ``effective_atoms``
    (over all heads of all mixers)."""
    mixers = [{"module": name, **mixer_kernel_statistics(m, offset)} for name, m, offset in kernel_snapshots(model)]
    atoms = sum(m["num_heads"] * m["num_atoms"] for m in mixers)
    heads = sum(m["num_heads"] for m in mixers)
    return {
        "min_sigma": min(m["min_sigma"] for m in mixers),
        "mean_abs_mu": sum(m["mean_abs_mu"] * m["num_heads"] * m["num_atoms"] for m in mixers) / atoms,
        "max_weight": max(m["max_weight"] for m in mixers),
        "effective_atoms": sum(m["effective_atoms"] * m["num_heads"] for m in mixers) / heads,
        "mixers": mixers,
    }


@torch.no_grad()
def kernel_maps(
    mixer: SSoGAttention, grid_size: tuple[int, int], query: tuple[int, int] | None = None,
    kernel_offset: Tensor | None = None,
) -> Tensor:
    """Each head's mixing weights from one query to every patch: ``(H, Hg, Wg)``.

    The row of ``A_h`` of ``query`` (default: the grid centre), built separably from the
    1-D kernels (border renormalisation included), of the mixture moved by ``kernel_offset``
    if given. Each map sums to 1.
    """
    rows, cols = grid_size
    qy, qx = (rows // 2, cols // 2) if query is None else query
    if not (0 <= qy < rows and 0 <= qx < cols):
        raise ValueError(f"query {query} is outside the {rows}x{cols} grid")
    params = mixer.kernel_parameters(kernel_offset)
    mu, sigma, weight = (params[k].detach().double() for k in ("mu", "sigma", "weight"))
    ky = fixed_axis_kernels(mu[..., 0], sigma[..., 0], rows)[:, :, qy]  # (H, R, Hg)
    kx = fixed_axis_kernels(mu[..., 1], sigma[..., 1], cols)[:, :, qx]  # (H, R, Wg)
    return torch.einsum("hr,hry,hrx->hyx", weight, ky, kx)
