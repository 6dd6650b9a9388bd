"""The SSoG kernels: row-normalised 1-D Gaussians over a token grid (docs/operator.md,
"Definition").

Everything here is a pure function of the mixture parameters; nothing touches the values.
Positions and widths are in token units. Kernels are built in float32 (float64 when asked)
whatever the dtype of the values they will be applied to: a softmax over squared distances
in fp16 loses the tails that border renormalisation relies on.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def kernel_dtype(value_dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 values, float32 for everything else (fp16, bf16, fp32)."""
    return torch.float64 if value_dtype == torch.float64 else torch.float32


def gaussian_rows(center: Tensor, sigma: Tensor, length: int) -> Tensor:
    """Row-normalised Gaussians over key positions ``0..length-1``.

    Args:
        center: ``(...)`` absolute centre of each row (query position + offset), tokens.
        sigma: ``(...)`` width of each row, tokens, > 0.
        length: number of key positions along the axis.

    Returns:
        ``(..., length)``: ``softmax_j(-(j - center)^2 / (2 sigma^2))``. The softmax is the
        border renormalisation: every row sums to 1 inside the grid, whatever the centre.
    """
    # A softmax written out: torch.softmax is slow on rows this short (about 4x on a CPU).
    # Its shift is the row's largest logit, found analytically at the key nearest the
    # centre, so the peak term is exp(0) = 1 and the sum never underflows. The result does
    # not depend on the shift, so it is a constant for autograd. Written as few passes over
    # the (..., length) tensor as possible: the per-row factors are computed on (...) first.
    #
    # Logits are clamped at 2 ln(eps) (eps of the kernel dtype): tail values below eps^2 of
    # the peak become eps^2, far below the resolution of the row sum. Without the clamp, exp
    # of logits below -87 (fp32) underflows to subnormal floats or zero, which is about 100x
    # slower per element on x86 CPUs, and subnormal kernel values slow every later product.
    keys = torch.arange(length, device=center.device, dtype=center.dtype)
    scale = (-0.5 / sigma.square()).unsqueeze(-1)  # logit = scale * (j - centre)^2
    with torch.no_grad():
        nearest = center.round().clamp(0, length - 1)
        shift = (scale * (nearest - center).square().unsqueeze(-1)).neg_()
    exponent = torch.addcmul(shift, (keys - center.unsqueeze(-1)).square(), scale)
    floor = 2.0 * math.log(torch.finfo(center.dtype).eps)
    unnormalised = exponent.clamp_min(floor).exp()
    return unnormalised / unnormalised.sum(dim=-1, keepdim=True)


def fixed_axis_kernels(mu: Tensor, sigma: Tensor, length: int) -> Tensor:
    """1-D kernel matrices of content-independent atoms along one axis.

    Args:
        mu, sigma: ``(H, R)`` offset and width of each atom along this axis, tokens.
        length: grid length along this axis.

    Returns:
        ``(H, R, length, length)`` indexed ``[h, r, query, key]``; rows sum to 1. Stored
        query-major (a transposed view of ``(H, query, R, key)``), the layout the separable
        backend multiplies with, so it needs no copy.
    """
    queries = torch.arange(length, device=mu.device, dtype=mu.dtype)
    center = queries.view(-1, 1) + mu.unsqueeze(-2)  # (H, L, R)
    return gaussian_rows(center, sigma.unsqueeze(-2).expand_as(center), length).transpose(-3, -2)


def steered_axis_kernels(mu: Tensor, sigma: Tensor, query_pos: Tensor, length: int) -> Tensor:
    """1-D kernel rows of query-dependent atoms along one axis.

    Args:
        mu, sigma: ``(B, H, Q, R)`` per-query offset and width along this axis, tokens.
        query_pos: ``(Q,)`` position of each query along this axis.
        length: grid length along this axis.

    Returns:
        ``(B, H, Q, R, length)`` kernel rows; each sums to 1.
    """
    center = query_pos.to(mu.dtype).view(-1, 1) + mu
    return gaussian_rows(center, sigma, length)


def query_positions(grid_size: tuple[int, int], device: torch.device) -> tuple[Tensor, Tensor]:
    """Row and column index of every token of a row-major ``Hg x Wg`` grid, each ``(N,)``."""
    rows, cols = grid_size
    index = torch.arange(rows * cols, device=device)
    return index // cols, index % cols
