"""How far query steering moves the Gaussian mixtures of SSoG mixers on real images.

A steered mixer gives each query token ``q`` its own mixture ``mu_q, sigma_q, w_q``: the
fixed one moved by a projection of the token, times a per-head gate ``sigmoid(alpha)``
(:meth:`~ssog.layers.SSoGAttention.mixture`). The gates alone do not say whether steering is
used (an open gate on a projection near zero moves nothing), so this measures the moves
themselves, at every application of every steered mixer in one forward pass:

- centres: ``||mu_q - mu||_2`` in tokens;
- widths: ``|log(sigma_q / sigma)|``, averaged over the two axes (0.69: twice or half as wide);
- weights: the total variation ``1/2 sum_r |w_q,r - w_r|`` of each head's mixture (0: the
  fixed weights, 1: disjoint ones).

Each is a mean over images, queries, heads (and atoms), and the largest mean of one head.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .capture import on_mixer_calls
from .kernels import ssog_modules

__all__ = ["MOVE_LABELS", "MOVES", "mixture_moves", "steering_moves"]

#: The steered parameter each move measures.
MOVES = {"mu_shift": "mu", "sigma_log_ratio": "sigma", "weight_tv": "lambda"}
#: Each move's name in tables and figures.
MOVE_LABELS = {"mu_shift": "|d mu| tokens", "sigma_log_ratio": "|log sigma ratio|", "weight_tv": "weights TV"}


def mixture_moves(
    mu: Tensor, sigma: Tensor, weight: Tensor, steered: tuple[Tensor, Tensor, Tensor]
) -> dict[str, Tensor]:
    """Per head, the mean moves from the fixed mixture ``mu, sigma (H, R, 2)``, ``weight (H, R)``
    to the steered ``(B, H, N, R, 2)``, ``(B, H, N, R, 2)``, ``(B, H, N, R)``: three ``(H,)`` tensors
    keyed as :data:`MOVES` (tokens; natural log; a fraction of 1)."""
    mu_q, sigma_q, weight_q = (t.double() for t in steered)
    mu, sigma, weight = (t.double()[None, :, None] for t in (mu, sigma, weight))
    return {
        "mu_shift": (mu_q - mu).norm(dim=-1).mean(dim=(0, 2, 3)),
        "sigma_log_ratio": (sigma_q / sigma).log().abs().mean(dim=(0, 2, 3, 4)),
        "weight_tv": 0.5 * (weight_q - weight).abs().sum(dim=-1).mean(dim=(0, 2)),
    }


@torch.no_grad()
def steering_moves(model: nn.Module, images: Tensor) -> dict[str, Any]:
    """The moves of :func:`mixture_moves` of every steered SSoG mixer of ``model`` over one
    forward pass on ``images (B, C, H, W)``, averaged over its applications (blocks are applied
    once; a looped or continuous model's shared mixer at each iteration or evaluation).

    Returns ``mixers``: per steered mixer ``{"module", "steer", "applications", "gates": {name:
    mean sigmoid(alpha)}, and per move of a steered parameter "<move>": mean over heads,
    "<move>_top_head": the largest head's}``; and ``images``. Raises ``ValueError`` for a model
    without a steered SSoG mixer.
    """
    steered = {name: mixer for name, mixer in ssog_modules(model) if mixer.steer}
    if not steered:
        raise ValueError(f"{type(model).__name__} has no steered SSoG mixer (steer=...): nothing to measure")
    sums: dict[str, dict[str, Tensor]] = {}
    counts = dict.fromkeys(steered, 0)

    def on_call(name: str, _: nn.Module, x: Tensor, grid_size: tuple[int, int], __: dict) -> None:
        # (no mixing options: the continuous field refuses time_kernels with a steered mixer)
        if name not in steered:
            return
        mixer = steered[name]
        fixed = mixer.kernel_parameters()
        moves = mixture_moves(fixed["mu"], fixed["sigma"], fixed["weight"],
                              mixer.mixture(x[:, mixer.num_prefix_tokens:]))
        totals = sums.setdefault(name, {})
        for key, value in moves.items():
            totals[key] = totals[key] + value if key in totals else value
        counts[name] += 1

    with on_mixer_calls(model, on_call):
        model(images)
    mixers = []
    for name, mixer in steered.items():
        row: dict[str, Any] = {
            "module": name, "steer": list(mixer.steer), "applications": counts[name],
            "gates": {part: float(torch.sigmoid(mixer.steer_gate_of(part)).mean()) for part in mixer.steer},
        }
        for key, part in MOVES.items():
            if part in mixer.steer and counts[name]:
                per_head = sums[name][key] / counts[name]
                row[key], row[f"{key}_top_head"] = float(per_head.mean()), float(per_head.max())
        mixers.append(row)
    return {"images": len(images), "mixers": mixers}
