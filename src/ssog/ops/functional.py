"""Public SSoG operator: ``ssog_matrix`` (the dense definition) and ``ssog_mix`` (fast).

Shapes (SPEC §4), with ``N = Hg * Wg`` patch tokens on a row-major grid:

- values ``v``: ``(B, H, N, d)``
- fixed parameters: ``mu, sigma (H, R, 2)``, ``weight (H, R)``
- steered parameters: ``mu, sigma (B, H, N, R, 2)``, ``weight (B, H, N, R)``

The last axis of ``mu``/``sigma`` is ``(y, x)``, in token units; ``mu`` is relative to the
query. ``weight`` is used as given (the layer passes a softmax, so rows of ``A`` sum to 1).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor

from . import backends
from .kernels import fixed_axis_kernels, kernel_dtype

BACKENDS = ("auto", "dense", "separable", "local")

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("ssog_forced_backend", default=None)


@contextlib.contextmanager
def forced_backend(name: str) -> Iterator[None]:
    """Run every ``ssog_mix`` inside the block with backend ``name``, whatever was asked.

    FLOP counting uses ``forced_backend("separable")`` so that mixing is counted in its
    separable form (``2 R N (Hg + Wg) d`` per head) whichever backend a model was built with.
    """
    _check_backend(name)
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)


def ssog_matrix(mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]) -> Tensor:
    """The dense mixing matrix ``A``: ``(H, N, N)`` fixed or ``(B, H, N, N)`` steered.

    ``A[q, j] = sum_r weight_r * ky_r(q_y, j_y) * kx_r(q_x, j_x)`` with row-normalised
    Gaussian ``ky``/``kx`` (SPEC §1). Computed in float32 (float64 for float64 input).
    """
    grid_size = _check_grid(grid_size)
    steered = _check_parameters(mu, sigma, weight, grid_size, batch_heads=None)
    _check_widths(sigma)
    mu, sigma, weight = _kernel_precision(mu, sigma, weight, mu.dtype)
    if steered:
        return backends.steered_matrix(mu, sigma, weight, grid_size)
    ky, kx = _fixed_kernels(mu, sigma, weight, grid_size)
    heads, n = ky.shape[0], grid_size[0] * grid_size[1]
    return torch.einsum("hryj,hrxi->hyxji", ky, kx).reshape(heads, n, n)


def ssog_mix(
    v: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    backend: str = "auto",
    local_tolerance: float = backends.LOCAL_TOLERANCE,
) -> Tensor:
    """Mix values with a sum of separable Gaussians: ``out = A @ v`` without forming ``A``.

    Args:
        v: ``(B, H, N, d)`` patch values (any float dtype; kernels are built in fp32).
        mu, sigma, weight: fixed or steered mixture parameters (module docstring).
        grid_size: ``(Hg, Wg)`` with ``Hg * Wg == N``.
        backend: ``"dense"``, ``"separable"``, ``"local"`` or ``"auto"`` (cost model,
            :func:`choose_backend`; for steered kernels it also weighs the windowed
            ``local`` path, from the key windows of the given ``mu`` and ``sigma``).
        local_tolerance: the local backend drops keys whose kernel value is below this
            fraction of their row's peak and rescales each row to its sum; an output then
            differs from the exact one by at most ``local_tolerance * N * max|v|`` (fixed
            kernels) or ``2 * local_tolerance * (Hg + Wg) * max|v|`` (steered kernels whose
            weights sum to 1; see :func:`ssog.ops.backends.steered_local`).

    Returns:
        ``(B, H, N, d)`` in the dtype of ``v``.
    """
    grid_size = _check_grid(grid_size)
    if v.dim() != 4:
        raise ValueError(f"v must be (B, H, N, d), got shape {tuple(v.shape)}")
    if not v.is_floating_point():
        raise ValueError(f"v must be a floating-point tensor, got {v.dtype}")
    batch, heads, n, _ = v.shape
    if n != grid_size[0] * grid_size[1]:
        raise ValueError(
            f"v has N={n} tokens but grid_size {grid_size} holds {grid_size[0] * grid_size[1]}"
        )
    steered = _check_parameters(mu, sigma, weight, grid_size, batch_heads=(batch, heads))
    _check_backend(backend)
    if not 0.0 < local_tolerance < 1.0:
        raise ValueError(f"local_tolerance must be in (0, 1), got {local_tolerance}")
    _check_widths(sigma)
    return mix(v, mu, sigma, weight, grid_size, backend, local_tolerance)


def mix(
    v: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    backend: str = "auto",
    local_tolerance: float = backends.LOCAL_TOLERANCE,
) -> Tensor:
    """``ssog_mix`` without input validation, for callers whose shapes hold by construction."""
    steered = mu.dim() == 5
    backend = _forced.get() or backend
    if backend == "auto" and not steered:
        requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (v, mu, sigma, weight))
        backend = choose_backend(v.shape, grid_size, mu.shape[-2], steered, v.device, requires_grad)
    mu, sigma, weight = _kernel_precision(mu, sigma, weight, v.dtype)
    # Kernels stay in fp32 under autocast; contractions run in the dtype of v.
    autocast_off = (
        torch.autocast(v.device.type, enabled=False)
        if torch.amp.is_autocast_available(v.device.type)
        else contextlib.nullcontext()
    )
    with autocast_off:
        if steered:
            return _steered(v, mu, sigma, weight, grid_size, backend, local_tolerance)
        ky, kx = _fixed_kernels(mu, sigma, weight, grid_size)
        if backend == "dense":
            return backends.fixed_dense(v, ky, kx)
        if backend == "separable":
            return backends.fixed_separable(v, ky, kx)
        ky = backends.truncate_kernels(ky, local_tolerance)
        kx = backends.truncate_kernels(kx, local_tolerance)
        return backends.fixed_separable(v, ky, kx, key_rows=backends.key_row_spans(ky))


def _steered(
    v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], backend: str, tolerance: float
) -> Tensor:
    """Steered mixing; ``auto`` measures the key windows of these parameters and takes the
    windowed (``local``) path when its tiles are cheaper than whole rows of ``A``."""
    if backend == "separable":
        return backends.steered_mix(v, mu, sigma, weight, grid_size, separable=True)
    if backend == "local" or (backend == "auto" and v.device.type != "meta"):
        windows = backends.steered_windows(mu, sigma, grid_size, tolerance)
        tiles = backends.steered_tiles(windows, backends.STEERED_TILE)
        if backend == "local" or _windowed_is_cheaper(tiles, v.shape, mu.shape[-2]):
            return backends.steered_local(v, mu, sigma, weight, grid_size, tiles)
    return backends.steered_mix(v, mu, sigma, weight, grid_size, separable=False)


#: Multiply-adds one tile of the windowed steered path costs beyond its arithmetic (Python
#: dispatch, gathering the tile's parameters and key box): about 0.1 ms at 50 GMAC/s. An
#: estimate, not yet fitted to ``ssog bench-op --steered`` measurements.
STEERED_TILE_OVERHEAD_MACS = 5_000_000


def _windowed_is_cheaper(
    tiles: list[tuple[tuple[int, int, int, int], tuple[int, int, int, int]]],
    value_shape: torch.Size | tuple[int, ...],
    num_atoms: int,
) -> bool:
    """Windowed steered cost (query-key pairs its tiles visit, plus per-tile overhead)
    against building and applying every query's whole row of ``A`` (``N^2`` pairs)."""
    batch, heads, n, dim = value_shape
    per_pair = batch * heads * (dim + num_atoms)
    windowed = backends.steered_local_cost(tiles) * per_pair + len(tiles) * STEERED_TILE_OVERHEAD_MACS
    return windowed < n * n * per_pair


def choose_backend(
    value_shape: torch.Size | tuple[int, ...],
    grid_size: tuple[int, int],
    num_atoms: int,
    steered: bool,
    device: torch.device,
    requires_grad: bool = False,
) -> str:
    """Pick the cheapest backend for fixed or steered kernels by a cost model.

    Multiply-adds per call, with ``BH`` batch*heads and ``N = Hg*Wg``:

    - dense: ``BH N^2 d`` in one large GEMM per head, plus building ``A`` once per head
      (``H R N^2`` element-wise work, weighted as 8 MACs each);
    - separable: ``BH R N (Hg + Wg) d`` in many small GEMMs, weighted by an overhead
      factor fitted to ``ssog bench-op`` on a 2-core CPU (docs/results/operator.md): 1.9
      for the forward pass, 2.6 with autograd (its backward is more small GEMMs). On
      accelerators, where launch latency dominates small GEMMs, 3.0 (not yet measured).

    Dense is only considered while ``A`` stays small (16 MiB). From shapes alone, steered
    kernels use ``dense``: a row of ``A`` per query costs ``N (R + d)``, the separable
    contraction ``R N (Wg + 1) d``. (``ssog_mix`` with ``auto`` then checks the windowed
    ``local`` path against it, which needs the parameters' values.)
    """
    if steered:
        return "dense"
    batch, heads, n, dim = value_shape
    rows, cols = grid_size
    if device.type == "cpu":
        separable_overhead = 2.6 if requires_grad else 1.9
    else:
        separable_overhead = 3.0
    dense_cost = batch * heads * n * n * dim + heads * num_atoms * n * n * 8
    separable_cost = batch * heads * num_atoms * n * (rows + cols) * dim * separable_overhead
    if dense_cost <= separable_cost and heads * n * n * 4 <= 16 * 2**20:
        return "dense"
    return "separable"


# ----------------------------------------------------------------------------- helpers
def _fixed_kernels(mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """``ky (H, R, Hg, Hg)`` with the mixture weights folded in and ``kx (H, R, Wg, Wg)``."""
    rows, cols = grid_size
    ky = fixed_axis_kernels(mu[..., 0], sigma[..., 0], rows) * weight[..., None, None]
    kx = fixed_axis_kernels(mu[..., 1], sigma[..., 1], cols)
    return ky, kx


def _kernel_precision(mu: Tensor, sigma: Tensor, weight: Tensor, value_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    dtype = kernel_dtype(torch.promote_types(value_dtype, mu.dtype))
    return mu.to(dtype), sigma.to(dtype), weight.to(dtype)


def _check_backend(name: str) -> None:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")


def _check_widths(sigma: Tensor) -> None:
    if sigma.device.type != "meta" and bool((sigma <= 0).any()):
        raise ValueError("sigma must be > 0 everywhere (widths are in token units)")


def _check_grid(grid_size: tuple[int, int]) -> tuple[int, int]:
    try:
        rows, cols = (int(s) for s in grid_size)
    except (TypeError, ValueError):
        raise ValueError(f"grid_size must be a pair (Hg, Wg) of positive ints, got {grid_size!r}") from None
    if rows <= 0 or cols <= 0:
        raise ValueError(f"grid_size must be positive, got {(rows, cols)}")
    return rows, cols


def _check_parameters(
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    batch_heads: tuple[int, int] | None,
) -> bool:
    """Validate shapes; return True for steered (per-query) parameters."""
    if mu.dim() == 3:
        heads, atoms, _ = mu.shape
        expected_mu, expected_weight = (heads, atoms, 2), (heads, atoms)
        if batch_heads is not None and heads != batch_heads[1]:
            raise ValueError(f"mu has {heads} heads but v has {batch_heads[1]}")
        steered = False
    elif mu.dim() == 5:
        batch, heads, n, atoms, _ = mu.shape
        expected_mu, expected_weight = (batch, heads, n, atoms, 2), (batch, heads, n, atoms)
        if batch_heads is not None and (batch, heads) != batch_heads:
            raise ValueError(f"steered mu has (B, H) = {(batch, heads)} but v has {batch_heads}")
        if n != grid_size[0] * grid_size[1]:
            raise ValueError(f"steered mu has N={n} queries but grid_size {grid_size} holds {grid_size[0] * grid_size[1]}")
        steered = True
    else:
        raise ValueError(f"mu must be (H, R, 2) fixed or (B, H, N, R, 2) steered, got shape {tuple(mu.shape)}")
    if tuple(mu.shape) != expected_mu:
        raise ValueError(f"mu must end in 2 (y, x) components: expected shape {expected_mu}, got {tuple(mu.shape)}")
    if tuple(sigma.shape) != expected_mu:
        raise ValueError(f"sigma must have the shape of mu {expected_mu}, got {tuple(sigma.shape)}")
    if tuple(weight.shape) != expected_weight:
        raise ValueError(f"weight must have shape {expected_weight}, got {tuple(weight.shape)}")
    return steered
