"""Fixed-kernel backends of ``ssog_mix``: the same linear map computed three ways.

All functions here take validated inputs: values ``v (B, H, N, d)`` on a row-major
``Hg x Wg`` grid and kernels already built in the kernel dtype (see ``kernels.py``).
One kernel per head, content-independent, shared by the whole batch:

- ``dense``: materialise ``A_h = sum_r lambda_r Ky_r (x) Kx_r`` (N x N) and multiply.
- ``separable``: contract y then x with the 1-D kernels, ``R * N * (Hg + Wg) * d`` MACs per
  head. The work is cut into blocks of (batch*head, query rows) whose intermediate fits a
  workspace budget, so the intermediate (R times the values) stays in cache and the peak
  memory stays close to the output's.
- ``local``: the separable path with each 1-D kernel truncated to a window of keys around
  its peak (renormalised), skipping the keys outside the window along y.

Query-steered kernels differ per query: :mod:`ssog.ops.steered_backends`.

Blocks are sized from the batch, except where a captured graph must hold for every batch
(:func:`ssog.ops.capture.any_batch`): they are then sized for one image and span all of
them; and except where it must hold for every grid (:func:`ssog.ops.capture.any_grid`): then
the work is one block.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .capture import any_batch, any_grid
from .chunking import checkpointed, chunk_starts, recompute_in_backward


#: Bytes of intermediate one block of the separable path may use, at most (and at most
#: the output's size, so the workspace never dominates): the block size ``ssog bench-op`` timed
#: fastest across grids (docs/results/operator.md).
SEPARABLE_BLOCK_BYTES = 4 * 2**20
#: Default tolerance of the local backend: keys whose kernel value is below this fraction
#: of the row's peak are dropped (and the row renormalised).
LOCAL_TOLERANCE = 1e-6


def fixed_matrix(ky: Tensor, kx: Tensor) -> Tensor:
    """The dense ``A (H, N, N)`` of fixed kernels ``ky (H, R, Hg, Hg)`` (mixture weights
    folded in) and ``kx (H, R, Wg, Wg)``: ``A[h, (y, x), (j, i)] = sum_r ky[h,r,y,j] kx[h,r,x,i]``."""
    heads, _, rows, _ = ky.shape
    n = rows * kx.shape[-1]
    return torch.einsum("hryj,hrxi->hyxji", ky, kx).reshape(heads, n, n)


def apply_fixed_matrix(a: Tensor, v: Tensor) -> Tensor:
    """``A (H, N, N)`` applied to ``v (B, H, N, d)``, in the dtype of ``v``; returns
    ``(B, H, N, d)`` (a permuted view of an ``(H, N, B, d)`` result).

    One GEMM per head over all images, ``(N, N) @ (N, B*d)``: ``torch.matmul`` would
    broadcast ``A`` to ``(B, H, N, N)`` and copy it, save that copy for the backward pass and
    sum ``A``'s gradient over ``B`` (docs/results/training_speed.md, "One GEMM per head")."""
    batch, heads, n, dim = v.shape
    columns = v.permute(1, 2, 0, 3).reshape(heads, n, batch * dim)
    return torch.bmm(a.to(v.dtype), columns).view(heads, n, batch, dim).permute(2, 0, 1, 3)


def fixed_dense(v: Tensor, ky: Tensor, kx: Tensor) -> Tensor:
    """``v (B, H, N, d)``, ``ky (H, R, Hg, Hg)`` (mixture weights folded in), ``kx (H, R, Wg, Wg)``."""
    return apply_fixed_matrix(fixed_matrix(ky, kx), v)


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
    _, atoms, rows, _ = ky.shape
    cols = kx.shape[-1]
    every_grid = any_grid((rows, cols))  # one block of every query row (blocks sized by the grid would guard on it)
    every_image = any_batch(batch) or every_grid
    images = 1 if every_image else batch
    block_bytes = block_bytes or min(SEPARABLE_BLOCK_BYTES, images * heads * n * dim * v.element_size())
    ky = ky.to(v.dtype).transpose(1, 2).reshape(heads, rows * atoms, rows)  # [(y', r), y]
    kx = kx.to(v.dtype).transpose(1, 2).reshape(heads, cols, atoms * cols)  # [x', (r, x)]
    row_bytes = atoms * cols * (dim + cols) * v.element_size()  # intermediate + its x kernel
    if every_image:  # blocks of one image's rows (every row on a symbolic grid)
        rows_per_block = rows if every_grid else max(1, min(rows, block_bytes // (row_bytes * heads)))
        return _separable_every_image(v, ky, kx, rows_per_block, key_rows)
    values = v.reshape(batch * heads, rows, cols * dim)
    # One kernel per (batch, head) item: a gather of a few hundred KiB, done once.
    head_of = torch.arange(batch * heads, device=v.device) % heads
    ky, kx = ky[head_of], kx[head_of]

    items_per_block = max(1, block_bytes // (row_bytes * rows))
    rows_per_block = rows if items_per_block > 1 else max(1, min(rows, block_bytes // row_bytes))
    if v.is_meta:  # nothing is computed (FLOP counting): one block, instant at any grid, the same FLOPs
        items_per_block, rows_per_block = batch * heads, rows
    # With gradients, every block is recomputed in the backward pass (activation
    # checkpointing): its saved y-contraction is R times the values, more than attention
    # keeps (docs/results/training_speed.md).
    needs_grad = recompute_in_backward(v, ky, kx)
    if key_rows is None and items_per_block >= batch * heads:
        # Small problem: one block, no copies.
        args = (values, ky, kx, 0, rows, 0, rows)
        out = checkpoint(_separable_block, *args, use_reentrant=False) if needs_grad else _separable_block(*args)
        return out.view(batch, heads, n, dim)

    # split (not slicing in a loop): its backward is one concatenation, where each
    # slice's backward would allocate a gradient the size of the whole input.
    blocks = list(zip(values.split(items_per_block), ky.split(items_per_block), kx.split(items_per_block)))
    row_starts = range(0, rows, rows_per_block)

    def block(index: int, y0: int, out: Tensor | None = None) -> Tensor:
        y1 = min(rows, y0 + rows_per_block)
        k0, k1 = (0, rows) if key_rows is None else _key_span(key_rows, y0, y1)
        return _separable_block(*blocks[index], y0, y1, k0, k1, out=out)

    if needs_grad:
        # Writing blocks into one output in place would make autograd copy the whole
        # output gradient once per block (CopySlices); concatenation keeps backward linear.
        return torch.cat([
            torch.cat([checkpoint(block, index, y0, use_reentrant=False) for y0 in row_starts], dim=1)
            for index in range(len(blocks))
        ]).view(batch, heads, n, dim)
    out = v.new_empty(batch * heads, rows, cols, dim)
    for index, i0 in enumerate(range(0, batch * heads, items_per_block)):
        for y0 in row_starts:
            if rows_per_block == rows:  # whole rows: the block's output is contiguous
                block(index, y0, out=out[i0 : i0 + items_per_block])
            else:
                out[i0 : i0 + items_per_block, y0 : y0 + rows_per_block] = block(index, y0)
    return out.view(batch, heads, n, dim)


def _separable_every_image(
    v: Tensor, ky: Tensor, kx: Tensor, rows_per_block: int, key_rows: list[tuple[int, int]] | None
) -> Tensor:
    """:func:`fixed_separable` as one graph for every batch (:func:`ssog.ops.capture.any_batch`): each head's
    kernels broadcast over the images, blocks of query rows spanning every image.

    ``ky (H, Hg*R, Hg)`` rows ``(y', r)`` and ``kx (H, Wg, R*Wg)`` columns ``(r, x)``, in the
    dtype of ``v (B, H, N, d)``; returns ``(B, H, N, d)``."""
    batch, heads, n, dim = v.shape
    rows, cols = ky.shape[-1], kx.shape[1]
    atoms = ky.shape[1] // rows
    values = v.reshape(batch, heads, rows, cols * dim)

    def block(values: Tensor, y0: int) -> Tensor:
        y1 = min(rows, y0 + rows_per_block)
        k0, k1 = (0, rows) if key_rows is None else _key_span(key_rows, y0, y1)
        mixed = torch.matmul(ky[:, y0 * atoms : y1 * atoms, k0:k1], values[:, :, k0:k1])  # (B, H, (y', r), (x, d))
        mixed = mixed.view(batch, heads, y1 - y0, atoms * cols, dim)
        return torch.matmul(kx.unsqueeze(1), mixed)  # (B, H, y', x', d)

    starts = chunk_starts(rows, rows_per_block)
    out = torch.cat([checkpointed(block, values, y0, several=len(starts) > 1) for y0 in starts], dim=2)
    return out.reshape(batch, heads, n, dim)


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
    """Zero entries whose magnitude is below ``tolerance`` times their row's peak magnitude,
    keeping each row's sum.

    ``kernel (..., L, L)``: rows of one sign each, a Gaussian times its atom's weight, which may
    be negative or 0 (a softmax's limit). The peak always survives, so a row never becomes
    empty, wherever its centre lies; a row of zeros (weight 0) stays zeros, where rescaling
    it would divide 0 by 0.
    """
    magnitude = kernel.abs()
    kept = kernel * (magnitude >= tolerance * magnitude.amax(dim=-1, keepdim=True))
    kept_sum = kept.sum(dim=-1, keepdim=True)
    return kept * (kernel.sum(dim=-1, keepdim=True) / torch.where(kept_sum == 0, 1.0, kept_sum))


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



__all__ = [
    "apply_fixed_matrix",
    "fixed_dense",
    "fixed_matrix",
    "fixed_separable",
    "key_row_spans",
    "truncate_kernels",
]
