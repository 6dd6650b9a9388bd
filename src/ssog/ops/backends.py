"""Backends of ``ssog_mix``: the same linear map computed three ways.

All functions here take validated inputs: values ``v (B, H, N, d)`` on a row-major
``Hg x Wg`` grid and kernels already built in the kernel dtype (see ``kernels.py``).

Fixed (content-independent) kernels, one per head, shared by the whole batch:

- ``dense``: materialise ``A_h = sum_r lambda_r Ky_r (x) Kx_r`` (N x N) and multiply.
- ``separable``: contract y then x with the 1-D kernels, ``R * N * (Hg + Wg) * d`` MACs per
  head. The work is cut into blocks of (batch*head, query rows) whose intermediate fits a
  workspace budget, so the intermediate (R times the values) stays in cache and the peak
  memory stays close to the output's.
- ``local``: the separable path with each 1-D kernel truncated to a window of keys around
  its peak (renormalised), skipping the keys outside the window along y.

Query-steered kernels differ per query, so they are built and applied in query chunks.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .kernels import query_positions, steered_axis_kernels

#: Bytes of intermediate one block of the separable path may use, at most (and at most
#: the output's size, so the workspace never dominates). Measured on a 2-core CPU
#: (docs/results/operator.md): 4 MiB blocks were fastest from 14x14 to 64x64, 0.25-64 MiB tried.
SEPARABLE_BLOCK_BYTES = 4 * 2**20
#: Bytes of kernel rows one query chunk of the steered path may materialise.
STEERED_CHUNK_BYTES = 64 * 2**20
#: Default tolerance of the local backend: keys whose kernel value is below this fraction
#: of the row's peak are dropped (and the row renormalised).
LOCAL_TOLERANCE = 1e-6


# ----------------------------------------------------------------------------- fixed kernels
def fixed_dense(v: Tensor, ky: Tensor, kx: Tensor) -> Tensor:
    """``v (B, H, N, d)``, ``ky (H, R, Hg, Hg)`` (mixture weights folded in), ``kx (H, R, Wg, Wg)``."""
    heads, _, rows, _ = ky.shape
    cols = kx.shape[-1]
    n = rows * cols
    a = torch.einsum("hryj,hrxi->hyxji", ky, kx).reshape(heads, n, n).to(v.dtype)
    return torch.einsum("hnm,bhmd->bhnd", a, v)


def fixed_separable(
    v: Tensor,
    ky: Tensor,
    kx: Tensor,
    key_rows: list[tuple[int, int]] | None = None,
    block_bytes: int | None = None,
) -> Tensor:
    """Separable mixing with fixed kernels, in cache-sized blocks.

    Args:
        v: ``(B, H, N, d)`` values.
        ky: ``(H, R, Hg, Hg)`` y kernels ``[h, r, query row, key row]``, weights folded in.
        kx: ``(H, R, Wg, Wg)`` x kernels ``[h, r, query col, key col]``.
        key_rows: optional, per query row ``(first, last + 1)`` key rows with non-zero
            weight in any head or atom (the local backend's band); ``None`` = all rows.
        block_bytes: budget of one block's intermediate (default: ``SEPARABLE_BLOCK_BYTES``
            or the output's size, whichever is smaller).

    Returns:
        ``(B, H, N, d)``.
    """
    batch, heads, n, dim = v.shape
    block_bytes = block_bytes or min(SEPARABLE_BLOCK_BYTES, v.numel() * v.element_size())
    _, atoms, rows, _ = ky.shape
    cols = kx.shape[-1]
    ky = ky.to(v.dtype).transpose(1, 2).reshape(heads, rows * atoms, rows)  # [(y', r), y]
    kx = kx.to(v.dtype).transpose(1, 2).reshape(heads, cols, atoms * cols)  # [x', (r, x)]
    values = v.reshape(batch * heads, rows, cols * dim)
    # One kernel per (batch, head) item: a gather of a few hundred KiB, done once.
    head_of = torch.arange(batch * heads, device=v.device) % heads
    ky, kx = ky[head_of], kx[head_of]

    row_bytes = atoms * cols * (dim + cols) * v.element_size()  # intermediate + its x kernel
    items_per_block = max(1, block_bytes // (row_bytes * rows))
    rows_per_block = rows if items_per_block > 1 else max(1, min(rows, block_bytes // row_bytes))
    if key_rows is None and items_per_block >= batch * heads:
        # Small problem: one block, no copies.
        return _separable_block(values, ky, kx, 0, rows, 0, rows).view(batch, heads, n, dim)

    # split (not slicing in a loop): its backward is one concatenation, where each
    # slice's backward would allocate a gradient the size of the whole input.
    blocks = list(zip(values.split(items_per_block), ky.split(items_per_block), kx.split(items_per_block)))
    row_starts = range(0, rows, rows_per_block)

    def block(index: int, y0: int, out: Tensor | None = None) -> Tensor:
        y1 = min(rows, y0 + rows_per_block)
        k0, k1 = (0, rows) if key_rows is None else _key_span(key_rows, y0, y1)
        return _separable_block(*blocks[index], y0, y1, k0, k1, out=out)

    if torch.is_grad_enabled() and (v.requires_grad or ky.requires_grad or kx.requires_grad):
        # Writing blocks into one output in place would make autograd copy the whole
        # output gradient once per block (CopySlices); concatenation keeps backward linear.
        return torch.cat(
            [torch.cat([block(index, y0) for y0 in row_starts], dim=1) for index in range(len(blocks))]
        ).view(batch, heads, n, dim)
    out = v.new_empty(batch * heads, rows, cols, dim)
    for index, i0 in enumerate(range(0, batch * heads, items_per_block)):
        for y0 in row_starts:
            if rows_per_block == rows:  # whole rows: the block's output is contiguous
                block(index, y0, out=out[i0 : i0 + items_per_block])
            else:
                out[i0 : i0 + items_per_block, y0 : y0 + rows_per_block] = block(index, y0)
    return out.view(batch, heads, n, dim)


def _separable_block(
    values: Tensor, ky: Tensor, kx: Tensor, y0: int, y1: int, k0: int, k1: int, out: Tensor | None = None
) -> Tensor:
    """Query rows ``y0:y1`` of a block of items, reading key rows ``k0:k1``.

    ``values (S, Hg, Wg*d)``, ``ky (S, Hg*R, Hg)`` rows ``(y', r)``, ``kx (S, Wg, R*Wg)``
    columns ``(r, x)``; returns ``(S, y1 - y0, Wg, d)``, in ``out`` (contiguous) if given.
    """
    items, cols, _ = kx.shape
    atoms = ky.shape[1] // ky.shape[2]
    dim = values.shape[-1] // cols
    # y contraction: [(y', r), y] @ [y, (x, d)] -> [(y', r), (x, d)] = [y', (r, x), d]
    mixed = torch.bmm(ky[:, y0 * atoms : y1 * atoms, k0:k1], values[:, k0:k1])
    mixed = mixed.view(items * (y1 - y0), atoms * cols, dim)
    # x contraction: [x', (r, x)] @ [(r, x), d] for every (item, y'); the kernel of an item
    # is shared by its rows (expanded: bmm needs one batch stride).
    kernel = kx.unsqueeze(1).expand(-1, y1 - y0, -1, -1).reshape(-1, cols, atoms * cols)
    if out is not None:
        return torch.bmm(kernel, mixed, out=out.view(-1, cols, dim)).view(items, y1 - y0, cols, dim)
    return torch.bmm(kernel, mixed).view(items, y1 - y0, cols, dim)


def truncate_kernels(kernel: Tensor, tolerance: float) -> Tensor:
    """Zero entries below ``tolerance`` times their row's peak, keeping each row's sum.

    ``kernel (..., L, L)``. The peak itself always survives, so a row never becomes empty,
    wherever its centre lies.
    """
    keep = kernel >= tolerance * kernel.amax(dim=-1, keepdim=True)
    kept = kernel * keep
    return kept * (kernel.sum(dim=-1, keepdim=True) / kept.sum(dim=-1, keepdim=True))


def key_row_spans(ky: Tensor) -> list[tuple[int, int]]:
    """Per query row, the span ``(first, last + 1)`` of key rows any head/atom reads."""
    used = (ky != 0).flatten(0, 1).any(dim=0)  # (Hg query rows, Hg key rows)
    positions = torch.arange(used.shape[-1], device=used.device)
    first = torch.where(used, positions, used.shape[-1]).amin(dim=-1)
    last = torch.where(used, positions, -1).amax(dim=-1)
    return list(zip(first.tolist(), (last + 1).tolist()))


def _key_span(spans: list[tuple[int, int]], y0: int, y1: int) -> tuple[int, int]:
    block = spans[y0:y1]
    return min(s[0] for s in block), max(s[1] for s in block)


# --------------------------------------------------------------------------- steered kernels
def steered_mix(
    v: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    separable: bool,
    chunk_bytes: int | None = None,
) -> Tensor:
    """Mixing with per-query parameters, computed in query chunks.

    Args:
        v: ``(B, H, N, d)``; mu, sigma: ``(B, H, N, R, 2)``; weight: ``(B, H, N, R)``.
        separable: contract x then y per query (``R*N*(Wg + 1)*d`` MACs per query) instead
            of building each query's row of ``A`` (``N*(R + d)``).

    Returns:
        ``(B, H, N, d)``. With gradients enabled each chunk is recomputed in the backward
        pass (activation checkpointing), so training memory stays bounded too.
    """
    batch, heads, n, dim = v.shape
    rows, cols = grid_size
    atoms = mu.shape[-2]
    dtype = mu.dtype
    query_y, query_x = query_positions(grid_size, v.device)
    if separable:
        values = v.view(batch, heads, rows, cols, dim).transpose(2, 3).reshape(batch, heads, cols, rows * dim)
        per_query = batch * heads * atoms * rows * dim
    else:
        values = v
        per_query = batch * heads * n
    chunk = max(1, (chunk_bytes or STEERED_CHUNK_BYTES) // (per_query * torch.finfo(dtype).bits // 8))

    def mix_chunk(values: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, q0: int) -> Tensor:
        q1 = q0 + mu.shape[2]
        ky = steered_axis_kernels(mu[..., 0], sigma[..., 0], query_y[q0:q1], rows)
        kx = steered_axis_kernels(mu[..., 1], sigma[..., 1], query_x[q0:q1], cols)
        ky = (ky * weight.unsqueeze(-1)).to(v.dtype)  # (B, H, Q, R, Hg)
        kx = kx.to(v.dtype)  # (B, H, Q, R, Wg)
        queries = ky.shape[2]
        if separable:
            # x first: [(q, r), x] @ [x, (y, d)] -> per query [(r, y), d], then y and atoms.
            partial = torch.matmul(kx.reshape(batch, heads, queries * atoms, cols), values)
            partial = partial.view(batch, heads, queries, atoms * rows, dim)
            return torch.matmul(ky.reshape(batch, heads, queries, 1, atoms * rows), partial).squeeze(3)
        rows_of_a = torch.matmul(ky.transpose(-1, -2), kx)  # (B, H, Q, Hg, Wg), summed over atoms
        return torch.matmul(rows_of_a.view(batch, heads, queries, n), values)

    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (v, mu, sigma, weight))
    outputs = []
    for q0 in range(0, n, chunk):
        args = (values, mu[:, :, q0 : q0 + chunk], sigma[:, :, q0 : q0 + chunk], weight[:, :, q0 : q0 + chunk], q0)
        if needs_grad and chunk < n:
            outputs.append(checkpoint(mix_chunk, *args, use_reentrant=False))
        else:
            outputs.append(mix_chunk(*args))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def steered_matrix(mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]) -> Tensor:
    """Dense ``A`` of steered kernels: ``(B, H, N, N)``."""
    rows, cols = grid_size
    query_y, query_x = query_positions(grid_size, mu.device)
    ky = steered_axis_kernels(mu[..., 0], sigma[..., 0], query_y, rows) * weight.unsqueeze(-1)
    kx = steered_axis_kernels(mu[..., 1], sigma[..., 1], query_x, cols)
    a = torch.matmul(ky.transpose(-1, -2), kx)  # (B, H, N, Hg, Wg)
    return a.flatten(-2)


__all__ = [
    "fixed_dense",
    "fixed_separable",
    "key_row_spans",
    "steered_matrix",
    "steered_mix",
    "truncate_kernels",
]
