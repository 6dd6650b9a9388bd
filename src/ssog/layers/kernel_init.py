"""Where an :class:`~ssog.layers.SSoGAttention`'s fixed kernels start: the centres' ring, the widths'
ladder, and the scale that puts them in image units on any token grid (docs/operator.md,
"The layer": Initialisation)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "CENTRE_INITS", "KERNEL_UNITS", "REFERENCE_GRID", "WIDTH_INITS", "axis_pair", "describe_initial_kernels",
    "initial_centres", "initial_widths", "inverse_softplus", "kernel_scale_for_grid", "multiscale_widths",
]

#: How the fixed centres ``mu`` start (:func:`initial_centres`).
CENTRE_INITS = ("ring", "normal", "zero")
#: How the fixed widths ``sigma`` start (:func:`initial_widths`).
WIDTH_INITS = ("ladder", "narrow")
#: Tokens per side of the grid on which the initial lengths (centre ring, width ladder) and
#: the steering radius are given. A model initialises its kernels in image units: on a grid
#: of ``G`` tokens those lengths are multiplied by ``G / REFERENCE_GRID`` (:func:`kernel_scale_for_grid`),
#: so a layer starts covering the same fraction of the image at any patch size or resolution.
#: 8 is the grid where the defaults were chosen (CIFAR at patch 4, docs/results/accuracy.md).
REFERENCE_GRID = 8
#: How a model sets its layers' ``kernel_scale`` (:func:`kernel_scale_for_grid`).
KERNEL_UNITS = ("image", "tokens")


def inverse_softplus(y: Tensor) -> Tensor:
    """``softplus^{-1}(y)`` for ``y > 0``, stable for large ``y``."""
    return y + torch.log(-torch.expm1(-y))


def multiscale_widths(num_heads: int, num_atoms: int, low: float = 0.5, high: float = 4.0) -> Tensor:
    """Initial widths ``(H, R)``: a geometric ladder from ``low`` to ``high`` tokens.

    Atoms of a head step through the ladder (so every head starts multi-scale: a sharp
    atom, a broad one, and some in between), and each head is shifted by a fraction of a
    step, so that heads do not start identical.
    """
    steps = num_atoms * num_heads
    ladder = low * (high / low) ** (torch.arange(steps, dtype=torch.float64) / max(steps - 1, 1))
    return ladder.view(num_atoms, num_heads).t().float()


def initial_centres(num_heads: int, num_atoms: int, kind: str = "ring", radius: float = 2.0) -> Tensor:
    """Initial centres ``mu (H, R, 2)`` (y, x) in tokens, relative to the query.

    ``"ring"``: the ``H*R`` atoms of a layer on a circle of ``radius`` tokens at angles
    ``2*pi*k/(H*R)``, atom ``k = h*R + r``: each head's atoms fill one sector of the circle,
    so every head starts looking in its own direction (atoms spread around the whole circle
    with equal weights would make each head a near-symmetric blur again). ``"normal"``:
    i.i.d. ``N(0, radius^2)`` (from torch's global generator). ``"zero"``: all at the query,
    a symmetric blur that cannot tell left from right at the start.
    """
    if kind == "zero":
        return torch.zeros(num_heads, num_atoms, 2)
    if kind == "normal":
        return torch.randn(num_heads, num_atoms, 2) * radius
    if kind == "ring":
        steps = num_heads * num_atoms
        angle = 2 * math.pi * torch.arange(steps, dtype=torch.float64) / steps
        ring = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1) * radius
        return ring.view(num_heads, num_atoms, 2).float()
    raise ValueError(f"unknown centre_init {kind!r}; expected one of {CENTRE_INITS}")


def initial_widths(num_heads: int, num_atoms: int, kind: str = "ladder") -> Tensor:
    """Initial widths ``(H, R)`` in tokens: ``"ladder"`` (:func:`multiscale_widths`, 0.5 to
    4 tokens) or ``"narrow"`` (every atom 0.7 tokens: local at the start, widths learned)."""
    if kind == "ladder":
        return multiscale_widths(num_heads, num_atoms)
    if kind == "narrow":
        return torch.full((num_heads, num_atoms), 0.7)
    raise ValueError(f"unknown width_init {kind!r}; expected one of {WIDTH_INITS}")


def kernel_scale_for_grid(grid_size: tuple[int, int], units: str = "image") -> tuple[float, float]:
    """The ``kernel_scale (y, x)`` of a layer on a ``grid_size = (Hg, Wg)`` token grid.

    ``"image"``: ``(Hg / REFERENCE_GRID, Wg / REFERENCE_GRID)``, so the initial centres and
    widths and the steering radius cover the same fraction of the image on every grid (on
    14x14 tokens, 224 px at patch 16: a ring of 3.5 tokens, widths 0.875 to 7, a steering
    radius of 7, the paper's M). ``"tokens"``: ``(1, 1)``, the lengths as given, whatever
    the grid.
    """
    if units not in KERNEL_UNITS:
        raise ValueError(f"unknown kernel_units {units!r}; expected one of {KERNEL_UNITS}")
    if units == "tokens":
        return 1.0, 1.0
    rows, cols = grid_size
    return rows / REFERENCE_GRID, cols / REFERENCE_GRID


def describe_initial_kernels(num_heads: int, options: dict[str, Any]) -> dict[str, list[float]]:
    """Where the kernels of an :class:`SSoGAttention` built with ``options`` start, in tokens
    per axis ``[y, x]``: the centres' ring radius (``normal``: their standard deviation), the
    smallest and largest initial width, and the steering radius (what ``ssog info`` shows)."""
    scale = torch.tensor(axis_pair(options.get("kernel_scale", 1.0), "kernel_scale"), dtype=torch.float64)
    radius = 0.0 if options["centre_init"] == "zero" else options["centre_radius"]
    widths = initial_widths(num_heads, options["num_atoms"], options["width_init"]).double()
    floor = options["sigma_min"] + 0.05
    return {
        "centre_radius": (radius * scale).tolist(),
        "width_min": (widths.min() * scale).clamp_min(floor).tolist(),
        "width_max": (widths.max() * scale).clamp_min(floor).tolist(),
        "steer_radius": (options["steer_radius"] * scale).tolist(),
    }


def axis_pair(scale: float | Sequence[float], name: str) -> tuple[float, float]:
    """``scale`` as a ``(y, x)`` pair of finite numbers > 0 (one number: both axes)."""
    pair = (scale, scale) if isinstance(scale, (int, float)) else tuple(scale)
    if len(pair) != 2 or not all(isinstance(v, (int, float)) and 0 < v < math.inf for v in pair):
        raise ValueError(f"{name} must be a number > 0 or a (y, x) pair of them, got {scale!r}")
    return float(pair[0]), float(pair[1])
