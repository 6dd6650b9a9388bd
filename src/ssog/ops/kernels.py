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

from .capture import capturing_graph

__all__ = [
    "fixed_axis_kernels", "fixed_kernel_pair", "gaussian_rows", "gaussian_rows_backward", "in_kernel_precision",
    "kernel_dtype",
    "query_positions", "steered_axis_kernels",
]


def kernel_dtype(value_dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 values, float32 for everything else (fp16, bf16, fp32)."""
    return torch.float64 if value_dtype == torch.float64 else torch.float32


def in_kernel_precision(
    mu: Tensor, sigma: Tensor, weight: Tensor, value_dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """``mu, sigma, weight`` in the kernel dtype of values of ``value_dtype`` (and of ``mu``'s)."""
    dtype = kernel_dtype(torch.promote_types(value_dtype, mu.dtype))
    return mu.to(dtype), sigma.to(dtype), weight.to(dtype)


def gaussian_rows(center: Tensor, sigma: Tensor, length: int) -> Tensor:
    """Row-normalised Gaussians over key positions ``0..length-1``.

    Args:
        center: ``(...)`` absolute centre of each row (query position + offset), tokens.
        sigma: ``(...)`` width of each row, tokens, > 0 (same shape as ``center``).
        length: number of key positions along the axis.

    Returns:
        ``(..., length)``: ``softmax_j(-(j - center)^2 / (2 sigma^2))``. The softmax is the
        border renormalisation: every row sums to 1 inside the grid, whatever the centre.
    """
    # The formula is differentiable as it stands; the Function only makes its backward
    # cheaper. Without autograd, calling it would cost more than the formula on small rows
    # (tens of microseconds a call), and neither dynamo (with a forward-mode rule) nor
    # torch.jit.trace records an autograd.Function (inductor fuses the formula's derivatives).
    records_graph = torch.is_grad_enabled() and (center.requires_grad or sigma.requires_grad)
    if not records_graph or capturing_graph():
        return _gaussian_rows_formula(center, sigma, length)
    return _GaussianRows.apply(center, sigma, length)


def _gaussian_rows_formula(center: Tensor, sigma: Tensor, length: int) -> Tensor:
    """:func:`gaussian_rows` as element-wise passes (autograd can differentiate them).

    A softmax written out: torch.softmax's per-call overhead dominates on rows this short.
    Its shift is the row's largest logit, found analytically at the key nearest the
    centre, so the peak term is exp(0) = 1 and the sum never underflows; the result does
    not depend on the shift (a per-row constant for autograd).

    Logits are clamped at 2 ln(eps) (eps of the kernel dtype): tail values below eps^2 of
    the peak become eps^2, far below the resolution of the row sum. Without the clamp, exp
    of logits below -87 (fp32) underflows to subnormal floats or zero, which x86 CPUs
    compute on a slow path, and subnormal kernel values slow every later product
    (docs/results/operator.md, "Steered layer").
    """
    scale = (-0.5 / sigma.square()).unsqueeze(-1)  # logit = scale * (j - centre)^2
    with torch.no_grad():
        nearest = center.round().clamp(0, length - 1).unsqueeze(-1)
        keys_from_nearest = torch.arange(length, device=center.device, dtype=center.dtype) - nearest
    # logit_j - logit_nearest = scale ((j - c)^2 - (n - c)^2) = scale (j - n) ((j - c) + (n - c)):
    # exactly 0 at the nearest key and never positive, however far the centre; the difference
    # of the two squares would cancel catastrophically there (a centre of 1e6 tokens gave
    # exponents of +512, inf, and NaN rows).
    offsets = _offsets(center, length)
    exponent = scale * keys_from_nearest * (offsets + (nearest - center.unsqueeze(-1)))
    floor = 2.0 * math.log(torch.finfo(center.dtype).eps)
    unnormalised = exponent.clamp_min(floor).exp()
    return unnormalised / unnormalised.sum(dim=-1, keepdim=True)


class _GaussianRows(torch.autograd.Function):
    """:func:`gaussian_rows` with hand-written derivatives.

    Autograd through the formula's element-wise passes records about fifteen
    ``(..., length)`` operations for the backward; the closed forms below take six
    (docs/results/operator.md, "Steered training steps"). With
    ``k = softmax_j(l_j)``, ``l_j = -u_j^2 / (2 sigma^2)`` and ``u_j = j - center``:
    ``dl_j/dcenter = u_j / sigma^2``, ``dl_j/dsigma = u_j^2 / sigma^3`` and
    ``dk_j = k_j (dl_j - sum_i k_i dl_i)``. Tested
    against autograd of the formula (gradcheck and gradgradcheck in float64, forward mode
    and torch.func included).
    """

    generate_vmap_rule = True  # torch.func.vmap / jacrev (the Lipschitz analysis)

    @staticmethod
    def forward(center: Tensor, sigma: Tensor, length: int) -> Tensor:
        return _gaussian_rows_formula(center, sigma, length)

    @staticmethod
    def setup_context(ctx, inputs: tuple[Tensor, Tensor, int], output: Tensor) -> None:
        center, sigma, length = inputs
        ctx.length = length
        ctx.save_for_backward(center, sigma, output)
        ctx.save_for_forward(center, sigma, output)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        center, sigma, rows = ctx.saved_tensors
        grad_center, grad_sigma = gaussian_rows_backward(grad, center, sigma, rows, *ctx.needs_input_grad[:2])
        return grad_center, grad_sigma, None

    @staticmethod
    def jvp(ctx, tangent_center: Tensor | None, tangent_sigma: Tensor | None, _: None) -> Tensor:
        center, sigma, rows = ctx.saved_tensors
        offsets = _offsets(center, ctx.length)
        inverse_variance = sigma.square().reciprocal()
        tangent_logits = torch.zeros_like(rows)
        if tangent_center is not None:
            tangent_logits = tangent_logits + offsets * (tangent_center * inverse_variance).unsqueeze(-1)
        if tangent_sigma is not None:
            sigma_rate = tangent_sigma * inverse_variance / sigma
            tangent_logits = tangent_logits + offsets.square() * sigma_rate.unsqueeze(-1)
        mean = (rows * tangent_logits).sum(dim=-1, keepdim=True)
        return rows * (tangent_logits - mean)


def gaussian_rows_backward(
    grad: Tensor, center: Tensor, sigma: Tensor, rows: Tensor, need_center: bool = True, need_sigma: bool = True,
) -> tuple[Tensor | None, Tensor | None]:
    """The gradients of :func:`gaussian_rows`' ``center`` and ``sigma`` (``(...)``, or ``None``
    where not needed) from the gradient ``grad`` of its result ``rows`` (``(..., length)``),
    in the closed forms of :class:`_GaussianRows`."""
    weighted = grad * rows
    grad_logits = torch.addcmul(weighted, rows, weighted.sum(dim=-1, keepdim=True), value=-1.0)
    offsets = _offsets(center, rows.shape[-1])
    grad_offsets = grad_logits * offsets  # sum_j of this is the centre's gradient * sigma^2
    inverse_variance = sigma.square().reciprocal()
    grad_center = grad_offsets.sum(dim=-1) * inverse_variance if need_center else None
    grad_sigma = (grad_offsets * offsets).sum(dim=-1) * inverse_variance / sigma if need_sigma else None
    return grad_center, grad_sigma


def _offsets(center: Tensor, length: int) -> Tensor:
    """``j - center`` for every key ``j < length``: ``(..., length)``."""
    keys = torch.arange(length, device=center.device, dtype=center.dtype)
    return keys - center.unsqueeze(-1)


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


def fixed_kernel_pair(
    mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]
) -> tuple[Tensor, Tensor]:
    """``ky (H, R, Hg, Hg)`` with the mixture weights folded in and ``kx (H, R, Wg, Wg)``, from
    fixed ``mu, sigma (H, R, 2)`` and ``weight (H, R)``."""
    rows, cols = grid_size
    ky = fixed_axis_kernels(mu[..., 0], sigma[..., 0], rows) * weight[..., None, None]
    kx = fixed_axis_kernels(mu[..., 1], sigma[..., 1], cols)
    return ky, kx


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
    # Broadcast, not ``index // cols, index % cols``: ONNX cannot take the remainder by a
    # symbolic ``cols`` (an export for every image size).
    row = torch.arange(rows, device=device).unsqueeze(1).expand(rows, cols)
    col = torch.arange(cols, device=device).unsqueeze(0).expand(rows, cols)
    return row.reshape(-1), col.reshape(-1)
