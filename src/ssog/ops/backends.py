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

Blocks and chunks are sized from the batch, except where a captured graph must hold for
every batch (:func:`ssog.ops.capture.any_batch`): they are then sized for one image and span all of them;
and except where it must hold for every grid (:func:`ssog.ops.capture.any_grid`): then the work is one block.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .capture import any_batch, any_grid, functorch_wrapped
from .kernels import query_positions, steered_axis_kernels

#: Bytes of intermediate one block of the separable path may use, at most (and at most
#: the output's size, so the workspace never dominates). Measured on a 2-core CPU
#: (docs/results/operator.md): 4 MiB blocks were fastest from 14x14 to 64x64, 0.25-64 MiB tried.
SEPARABLE_BLOCK_BYTES = 4 * 2**20
#: Bytes of kernel rows one query chunk of the steered path may materialise. Small enough
#: that glibc's allocator serves the chunk's temporaries from its heap on every call:
#: larger ones are mapped from the OS and page-faulted on first touch each time, which made
#: 64 MiB chunks (and 6 MiB kernel temporaries) 1.5-2x slower (docs/results/operator.md,
#: "Steered layer").
STEERED_CHUNK_BYTES = 4 * 2**20
#: With autograd, steered kernel rows up to this many bytes in all (one layer's ``B*H*N*N``)
#: are built in one chunk and kept for the backward pass, instead of being built in
#: chunks that the backward pass recomputes (activation checkpointing repeats the
#: forward's work). The tiny CIFAR models' 8 MiB of rows per layer fit (docs/results/operator.md,
#: "Steered training steps").
STEERED_SAVED_ROWS_BYTES = 16 * 2**20
#: Side (queries) of the square query tiles of the windowed steered path: each tile reads
#: the union of its queries' key windows, so smaller tiles read fewer keys per query but
#: pay Python and GEMM overhead more often.
STEERED_TILE = 8
#: Default tolerance of the local backend: keys whose kernel value is below this fraction
#: of the row's peak are dropped (and the row renormalised).
LOCAL_TOLERANCE = 1e-6


# ----------------------------------------------------------------------------- fixed kernels
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
    sum ``A``'s gradient over ``B`` (1.2-1.3x slower forward and backward at 14x14 and
    16x16, batch 1-8, on the project's CPU)."""
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
    needs_grad = _recompute_in_backward(v, ky, kx)
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

    starts = _starts(rows, rows_per_block)
    out = torch.cat([_checkpointed(block, values, y0, several=len(starts) > 1) for y0 in starts], dim=2)
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
        pass (activation checkpointing), so training memory stays bounded too; rows that
        fit ``STEERED_SAVED_ROWS_BYTES`` in all are built in one chunk and kept instead.
    """
    batch, heads, n, dim = v.shape
    rows, cols = grid_size
    atoms = mu.shape[-2]
    dtype = mu.dtype
    query_y, query_x = query_positions(grid_size, v.device)
    images = 1 if any_batch(batch) else batch  # chunks sized for one image: one graph for every batch
    every_grid = any_grid(grid_size)  # one chunk of every query (chunks sized by the grid would guard on it)
    if not separable:
        query_bytes = images * heads * n * torch.finfo(dtype).bits // 8  # one query's rows
        # Chunks of a graph for every batch do not depend on autograd: torch.jit.trace checks its
        # graph by tracing again without autograd (and at most n: the same slice either way).
        whole = every_grid or (not any_batch(batch) and n * query_bytes <= STEERED_SAVED_ROWS_BYTES
                               and _recompute_in_backward(v, mu, sigma, weight))
        chunk = n if whole else min(n, max(1, (chunk_bytes or STEERED_CHUNK_BYTES) // query_bytes))
        grid_values = v.contiguous().view(batch, heads, rows, cols, dim)  # once, not once per chunk
        full = (0, rows, 0, cols)
        outputs = [
            _checkpointed(
                _steered_tile, grid_values, mu[:, :, q0 : q0 + chunk], sigma[:, :, q0 : q0 + chunk],
                weight[:, :, q0 : q0 + chunk], query_y[q0 : q0 + chunk], query_x[q0 : q0 + chunk], full,
                several=chunk < n,
            )
            for q0 in _starts(n, chunk)
        ]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)

    values = v.view(batch, heads, rows, cols, dim).transpose(2, 3).reshape(batch, heads, cols, rows * dim)
    per_query = images * heads * atoms * rows * dim
    chunk = n if every_grid else \
        min(n, max(1, (chunk_bytes or STEERED_CHUNK_BYTES) // (per_query * torch.finfo(dtype).bits // 8)))

    def mix_chunk(values: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, q0: int) -> Tensor:
        q1 = q0 + mu.shape[2]
        ky = steered_axis_kernels(mu[..., 0], sigma[..., 0], query_y[q0:q1], rows)
        kx = steered_axis_kernels(mu[..., 1], sigma[..., 1], query_x[q0:q1], cols)
        ky = (ky * weight.unsqueeze(-1)).to(v.dtype)  # (B, H, Q, R, Hg)
        kx = kx.to(v.dtype)  # (B, H, Q, R, Wg)
        queries = ky.shape[2]
        # x first: [(q, r), x] @ [x, (y, d)] -> per query [(r, y), d], then y and atoms.
        partial = torch.matmul(kx.reshape(batch, heads, queries * atoms, cols), values)
        partial = partial.view(batch, heads, queries, atoms * rows, dim)
        return torch.matmul(ky.reshape(batch, heads, queries, 1, atoms * rows), partial).squeeze(3)

    outputs = [
        _checkpointed(
            mix_chunk, values, mu[:, :, q0 : q0 + chunk], sigma[:, :, q0 : q0 + chunk],
            weight[:, :, q0 : q0 + chunk], q0, several=chunk < n,
        )
        for q0 in _starts(n, chunk)
    ]
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def _starts(length: int | torch.SymInt, step: int | torch.SymInt) -> range | tuple[int]:
    """``range(0, length, step)``, and ``(0,)`` for one step (``range`` fixes a symbolic ``length``)."""
    return (0,) if step >= length else range(0, length, step)


def _recompute_in_backward(*tensors: Tensor) -> bool:
    """Whether activation checkpointing applies to work on ``tensors``: autograd records it,
    and no ``torch.func`` transform (``vjp``, ``jacrev``, ...; the Lipschitz analysis uses
    them) is active, since those do not support the saved-tensor hooks checkpointing uses."""
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return False
    return not functorch_wrapped(*tensors)


def _checkpointed(fn, *args, several: bool) -> Tensor:
    """``fn(*args)``, recomputed in the backward pass when it is one of several chunks that
    need gradients (activation checkpointing: only one chunk's rows are alive at a time)."""
    if several and _recompute_in_backward(*(a for a in args if isinstance(a, Tensor))):
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def _rows_times_values(ky: Tensor, kx: Tensor, keys: Tensor) -> Tensor:
    """``ky (B, H, Q, R, Hk)`` (weights folded in), ``kx (B, H, Q, R, Wk)`` and ``keys
    (B, H, Hk*Wk, d)``: each query's row of ``A`` (``R`` outer products), times the keys.
    Returns ``(B, H, Q, d)``."""
    rows_of_a = torch.matmul(ky.transpose(-1, -2).to(keys.dtype), kx.to(keys.dtype))  # (B, H, Q, Hk, Wk)
    return torch.matmul(rows_of_a.flatten(-2), keys)


def _steered_tile(
    grid_values: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    query_y: Tensor,
    query_x: Tensor,
    box: tuple[int, int, int, int],
) -> Tensor:
    """Steered mixing of ``Q`` queries over the keys of one box of the grid.

    ``grid_values (B, H, Hg, Wg, d)``; ``mu, sigma (B, H, Q, R, 2)``, ``weight (B, H, Q, R)``;
    ``query_y, query_x (Q,)`` the queries' positions; ``box = (y0, y1, x0, x1)`` the key rows
    and columns read. Each 1-D kernel is a softmax over the box's keys, i.e. the exact kernel
    renormalised to the box (exact when the box is the whole grid). Returns ``(B, H, Q, d)``.
    """
    y0, y1, x0, x1 = box
    batch, heads, _, _ = weight.shape
    ky = steered_axis_kernels(mu[..., 0], sigma[..., 0], query_y - y0, y1 - y0) * weight.unsqueeze(-1)
    kx = steered_axis_kernels(mu[..., 1], sigma[..., 1], query_x - x0, x1 - x0)
    keys = grid_values[:, :, y0:y1, x0:x1].reshape(batch, heads, -1, grid_values.shape[-1])
    return _rows_times_values(ky, kx, keys)


def steered_reach(sigma: Tensor, tolerance: float) -> Tensor:
    """Distance (tokens) from a kernel's clamped centre beyond which its keys weigh less than
    ``tolerance`` times the row's peak: ``sqrt(2 sigma^2 ln(1/tolerance) + 1/4)``.

    Why it suffices: let ``c`` be the centre and ``j*`` the key nearest to it (the peak).
    Inside the grid ``|j* - c| <= 1/2``, so a key with ``|j - c| > D`` has
    ``(j - c)^2 - (j* - c)^2 > D^2 - 1/4 = 2 sigma^2 ln(1/tolerance)``. Outside (say
    ``c < 0``, ``j* = 0``) the clamped centre is ``0`` and ``(j - c)^2 - c^2 >= j^2 > D^2``.
    """
    return (2.0 * math.log(1.0 / tolerance) * sigma.square() + 0.25).sqrt()


def steered_windows(mu: Tensor, sigma: Tensor, grid_size: tuple[int, int], tolerance: float) -> Tensor:
    """Per query, the box of keys that holds every atom's kernel mass up to ``tolerance``.

    ``mu, sigma (B, H, N, R, 2)``. Derived from the tensors themselves (any centre, any
    width), over batch, heads and atoms: keys outside the box weigh less than ``tolerance``
    times their row's peak in every kernel of the query (:func:`steered_reach`).

    Returns ``(4, Hg, Wg)`` int64: first key row, last key row + 1, first key column, last
    key column + 1. A kernel whose reach spans the grid gets the whole axis.
    """
    rows, cols = grid_size
    with torch.no_grad():
        query_y, query_x = query_positions(grid_size, mu.device)
        queries = torch.stack([query_y, query_x], dim=-1).to(mu.dtype)  # (N, 2)
        last = torch.tensor([rows - 1, cols - 1], device=mu.device, dtype=mu.dtype)
        # The clamped centre lies between the query and its centre, so a centre far outside
        # the grid still keeps the border key nearest to it.
        centre = torch.minimum((queries[:, None, :] + mu).clamp_min(0), last)
        reach = steered_reach(sigma, tolerance)
        first = (centre - reach).floor().amin(dim=(0, 1, 3))  # (N, 2)
        end = (centre + reach).ceil().amax(dim=(0, 1, 3)) + 1
        # Non-finite parameters (a diverged run) read the whole grid rather than a bogus box.
        first = first.nan_to_num(0.0).clamp_min(0)
        end = torch.minimum(end.nan_to_num(float(max(rows, cols))), last + 1)
        return torch.stack([first[:, 0], end[:, 0], first[:, 1], end[:, 1]]).long().view(4, rows, cols)


def steered_tiles(windows: Tensor, tile: int) -> list[tuple[tuple[int, int, int, int], tuple[int, int, int, int]]]:
    """Square tiles of queries and the key box each reads: ``[(query box, key box), ...]``.

    ``windows (4, Hg, Wg)`` from :func:`steered_windows`; a tile's key box is the union of
    its queries' boxes. Boxes are ``(y0, y1, x0, x1)``, row-major over tiles.
    """
    _, rows, cols = windows.shape
    ty, tx = min(tile, rows), min(tile, cols)
    low = -F.max_pool2d(-windows[[0, 2]].float().unsqueeze(0), (ty, tx), ceil_mode=True)[0]
    high = F.max_pool2d(windows[[1, 3]].float().unsqueeze(0), (ty, tx), ceil_mode=True)[0]
    boxes = torch.stack([low[0], high[0], low[1], high[1]], dim=-1).long().tolist()
    tiles = []
    for i, y0 in enumerate(range(0, rows, ty)):
        for j, x0 in enumerate(range(0, cols, tx)):
            tiles.append(((y0, min(rows, y0 + ty), x0, min(cols, x0 + tx)), tuple(boxes[i][j])))
    return tiles


def steered_local(
    v: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    tiles: list[tuple[tuple[int, int, int, int], tuple[int, int, int, int]]],
) -> Tensor:
    """Windowed steered mixing: each tile of queries reads only its key box.

    ``tiles`` from :func:`steered_tiles`. Per query, every atom's 1-D kernels are
    renormalised to the tile's box; keys outside it weigh less than the tolerance times
    their row's peak, so (with weights summing to 1) an output differs from the exact one
    by less than ``2 * tolerance * (Hg + Wg) * max|v|``: per axis the dropped mass is below
    ``tolerance * L``, and renormalising moves the kept mass by as much again.
    Cost per query: the box's area times ``R + d``, instead of ``N (R + d)``.
    """
    batch, heads, n, dim = v.shape
    rows, cols = grid_size
    atoms = mu.shape[-2]
    grid_values = v.contiguous().view(batch, heads, rows, cols, dim)
    grid_mu = mu.view(batch, heads, rows, cols, atoms, 2)
    grid_sigma = sigma.view(batch, heads, rows, cols, atoms, 2)
    grid_weight = weight.view(batch, heads, rows, cols, atoms)
    query_y, query_x = (p.view(rows, cols) for p in query_positions(grid_size, v.device))
    several = len(tiles) > 1
    tile_rows: list[list[Tensor]] = []
    for (y0, y1, x0, x1), box in tiles:
        if x0 == 0:
            tile_rows.append([])
        window = (slice(None), slice(None), slice(y0, y1), slice(x0, x1))  # [:, :, y0:y1, x0:x1]
        tile_mu, tile_sigma, tile_weight = (t[window].flatten(2, 3) for t in (grid_mu, grid_sigma, grid_weight))
        out = _checkpointed(
            _steered_tile, grid_values, tile_mu, tile_sigma, tile_weight,
            query_y[y0:y1, x0:x1].flatten(), query_x[y0:y1, x0:x1].flatten(), box, several=several,
        )
        tile_rows[-1].append(out.view(batch, heads, y1 - y0, x1 - x0, dim))
    return torch.cat([torch.cat(row, dim=3) for row in tile_rows], dim=2).view(batch, heads, n, dim)


def steered_local_cost(tiles: list[tuple[tuple[int, int, int, int], tuple[int, int, int, int]]]) -> int:
    """Query-key pairs the windowed path visits (``N^2`` for the dense steered path)."""
    return sum((y1 - y0) * (x1 - x0) * (b1 - b0) * (c1 - c0) for (y0, y1, x0, x1), (b0, b1, c0, c1) in tiles)


def steered_matrix(mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]) -> Tensor:
    """Dense ``A`` of steered kernels: ``(B, H, N, N)``."""
    rows, cols = grid_size
    query_y, query_x = query_positions(grid_size, mu.device)
    ky = steered_axis_kernels(mu[..., 0], sigma[..., 0], query_y, rows) * weight.unsqueeze(-1)
    kx = steered_axis_kernels(mu[..., 1], sigma[..., 1], query_x, cols)
    a = torch.matmul(ky.transpose(-1, -2), kx)  # (B, H, N, Hg, Wg)
    return a.flatten(-2)


__all__ = [
    "apply_fixed_matrix",
    "fixed_dense",
    "fixed_matrix",
    "fixed_separable",
    "key_row_spans",
    "steered_local",
    "steered_local_cost",
    "steered_matrix",
    "steered_mix",
    "steered_reach",
    "steered_tiles",
    "steered_windows",
    "truncate_kernels",
]
