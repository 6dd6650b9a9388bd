"""Query-steered backends of ``ssog_mix``: kernels whose centres, widths or weights differ
per query, so each query's kernel row is built (in query chunks, or in query tiles over the
keys its window reaches) and applied at once.

All functions here take validated inputs: values ``v (B, H, N, d)`` on a row-major
``Hg x Wg`` grid and per-query parameters ``mu, sigma (B, H, N, R, 2)``, ``weight
(B, H, N, R)`` in the kernel dtype. Chunks are sized from the batch, except where a captured
graph must hold for every batch (:func:`ssog.ops.capture.any_batch`): they are then sized
for one image; and except where it must hold for every grid
(:func:`ssog.ops.capture.any_grid`): then every query is one chunk.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .capture import any_batch, any_grid
from .chunking import checkpointed, chunk_starts, recompute_in_backward
from .kernels import query_positions, steered_axis_kernels

#: Bytes of kernel rows one query chunk of the steered path may materialise. Small enough
#: that glibc's allocator serves the chunk's temporaries from its heap on every call:
#: larger ones are mapped from the OS and page-faulted on first touch each time
#: (docs/results/operator.md, "Steered layer").
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
                               and recompute_in_backward(v, mu, sigma, weight))
        chunk = n if whole else min(n, max(1, (chunk_bytes or STEERED_CHUNK_BYTES) // query_bytes))
        grid_values = v.contiguous().view(batch, heads, rows, cols, dim)  # once, not once per chunk
        full = (0, rows, 0, cols)
        outputs = [
            checkpointed(
                _steered_tile, grid_values, mu[:, :, q0 : q0 + chunk], sigma[:, :, q0 : q0 + chunk],
                weight[:, :, q0 : q0 + chunk], query_y[q0 : q0 + chunk], query_x[q0 : q0 + chunk], full,
                several=chunk < n,
            )
            for q0 in chunk_starts(n, chunk)
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
        checkpointed(
            mix_chunk, values, mu[:, :, q0 : q0 + chunk], sigma[:, :, q0 : q0 + chunk],
            weight[:, :, q0 : q0 + chunk], q0, several=chunk < n,
        )
        for q0 in chunk_starts(n, chunk)
    ]
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)



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
        out = checkpointed(
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
    "steered_local",
    "steered_local_cost",
    "steered_matrix",
    "steered_mix",
    "steered_reach",
    "steered_tiles",
    "steered_windows",
]
