"""Public SSoG operator: ``ssog_matrix`` (the dense definition) and ``ssog_mix`` (fast).

``ssog_mix`` checks its arguments (:mod:`ssog.ops.checks`) and calls :func:`mix_unchecked`,
which the layers call directly: their parameters have the right shapes by construction, and
per-call checks of parameter values would synchronise a GPU. (For ``ssog_mix``, the ``cpp``
kernels check the values themselves as they start.) ``mix_unchecked`` runs the backend that
was asked for, or the one ``auto`` (:func:`choose_backend`) picks, from the registry
(:data:`ssog.ops.registry.BACKENDS`).

Shapes (docs/operator.md, "Shapes"), with ``N = Hg * Wg`` patch tokens on a
row-major grid:

- values ``v``: ``(B, H, N, d)``
- fixed parameters: ``mu, sigma (H, R, 2)``, ``weight (H, R)``
- steered parameters: ``mu, sigma (B, H, N, R, 2)``, ``weight (B, H, N, R)``

The last axis of ``mu``/``sigma`` is ``(y, x)``, in token units; ``mu`` is relative to the
query. ``weight`` is used as given (the layer passes a softmax, so rows of ``A`` sum to 1).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

import torch
from torch import Tensor

from . import backends, steered_backends
from .capture import any_batch, any_grid, functorch_wrapped
from .checks import check_grid, check_local_tolerance, check_parameter_values, check_parameters, check_values
from .costs import dense_costs
from .kernels import fixed_kernel_pair, in_kernel_precision
from .registry import BACKENDS, check_backend, pytorch_backend, windowed_tiles

__all__ = ["choose_backend", "forced_backend", "forced_backend_name", "mix_unchecked", "ssog_matrix", "ssog_mix"]

logger = logging.getLogger(__name__)

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("ssog_forced_backend", default=None)


@contextlib.contextmanager
def forced_backend(name: str) -> Iterator[None]:
    """Run every ``ssog_mix`` inside the block with backend ``name``, whatever was asked.

    FLOP counting uses ``forced_backend("separable")`` so that mixing is counted in its
    separable form (``2 R N (Hg + Wg) d`` per head) whichever backend a model was built with.
    """
    check_backend(name)
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)


def forced_backend_name() -> str | None:
    """The backend :func:`forced_backend` imposes at this point, or ``None``; ``None`` while
    ``torch.compile`` traces (the counting and analysis that force a backend run eagerly, and
    dynamo of torch 2.11 cannot trace a ``ContextVar`` read: the compiled graph would break)."""
    return None if torch.compiler.is_compiling() else _forced.get()


def ssog_matrix(mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]) -> Tensor:
    """The dense mixing matrix ``A``: ``(H, N, N)`` fixed or ``(B, H, N, N)`` steered.

    ``A[q, j] = sum_r weight_r * ky_r(q_y, j_y) * kx_r(q_x, j_x)`` with row-normalised
    Gaussian ``ky``/``kx`` (docs/operator.md, "Definition"). Computed in float32
    (float64 for float64 input).
    """
    grid_size = check_grid(grid_size)
    check_parameters(mu, sigma, weight, grid_size, batch_heads=None)
    check_parameter_values(mu, sigma, weight, grid_size)
    return matrix_unchecked(mu, sigma, weight, grid_size)


def matrix_unchecked(mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]) -> Tensor:
    """:func:`ssog_matrix` without its checks, which read the parameters' values on the host
    (on a GPU, a synchronisation per call): for callers whose parameters are right by
    construction (:class:`ssog.layers.SSoGAttention`), as :func:`mix_unchecked` is for mixing."""
    mu, sigma, weight = in_kernel_precision(mu, sigma, weight, mu.dtype)
    if mu.dim() == 5:  # steered: (B, H, N, R, 2)
        return steered_backends.steered_matrix(mu, sigma, weight, grid_size)
    return backends.fixed_matrix(*fixed_kernel_pair(mu, sigma, weight, grid_size))


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
            weights sum to 1; see :func:`ssog.ops.steered_backends.steered_local`).

    Returns:
        ``(B, H, N, d)`` in the dtype of ``v``.
    """
    grid_size = check_grid(grid_size)
    batch, heads, _, _ = check_values(v, grid_size)
    check_parameters(mu, sigma, weight, grid_size, batch_heads=(batch, heads))
    check_backend(backend)
    check_local_tolerance(local_tolerance)
    return mix_unchecked(v, mu, sigma, weight, grid_size, backend, local_tolerance, value_checks=True)


def mix_unchecked(
    v: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    backend: str = "auto",
    local_tolerance: float = backends.LOCAL_TOLERANCE,
    out: Tensor | None = None,
    value_checks: bool = False,
) -> Tensor:
    """:func:`ssog_mix` without its argument checks; same arguments, shapes and result.

    It skips every check of :mod:`ssog.ops.checks` that ``ssog_mix`` runs (the shapes of
    ``v`` and the parameters against each other and the grid, the backend's name,
    ``local_tolerance``) and, unless ``value_checks``, the parameters' values: wrong
    arguments give an error deep in a backend or a wrong result, not a one-line
    ``ValueError``. Only callers whose arguments hold by construction may call it:
    :class:`ssog.layers.SSoGAttention` (its parameters have the right shapes, and per-call
    value checks would synchronise a GPU), ``ssog bench-op``'s compiled candidates (as a
    compiled layer mixes: value checks read values on the host, which breaks the graph) and
    :func:`ssog_mix` after its checks. Everyone else calls :func:`ssog_mix`.

    ``out``: an optional ``(B, H, N, d)`` destination (a view with contiguous features, not
    overlapping ``v``) that the result is written into and returned as; the ``cpp`` kernels
    write there directly, the layers pass a view of their output tokens to save two copies.
    ``value_checks``: check the parameters' values (:func:`ssog.ops.checks.check_parameter_values`)
    before mixing, as ``ssog_mix`` does; the ``cpp`` kernels do it in the library, where it
    costs nothing next to the mixing (in Python it is a noticeable share of a small grid's call).
    """
    steered = mu.dim() == 5
    backend = forced_backend_name() or backend
    if backend == "auto":
        transformed = functorch_wrapped(v, mu, sigma, weight)
        requires_grad = transformed or _recorded(v, mu, sigma, weight)
        backend = choose_backend(
            v.shape, grid_size, mu.shape[-2], steered, v.device, requires_grad, dtype=v.dtype, transformed=transformed
        )
        if steered and backend == "dense" and v.device.type == "cpu":
            # from shapes alone: the windowed path may be cheaper (reading its windows would
            # synchronise a GPU, so elsewhere steered kernels take dense rows)
            return _steered_auto(v, mu, sigma, weight, grid_size, local_tolerance, out=out, value_checks=value_checks)
    mix = BACKENDS[backend].mixing(steered)
    return mix(v, mu, sigma, weight, grid_size, local_tolerance, out=out, value_checks=value_checks)


@pytorch_backend
def _steered_auto(
    v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], tolerance: float
) -> Tensor:
    """Steered mixing for ``auto``: measures the key windows of these parameters and takes the
    windowed (``local``) path when its tiles are cheaper than whole rows of ``A`` (reading
    the windows synchronises a GPU once per call), else ``dense``. Where ``local`` cannot run
    (graph capture: ``torch.compile``, ``torch.export``, ``torch.jit.trace``; the meta device)
    it uses whole rows: the windows depend on the values, not on shapes."""
    if BACKENDS["local"].can_run(v.device, v.dtype, v.shape[-1], True, False):
        tiles = windowed_tiles(mu, sigma, grid_size, tolerance)
        if _windowed_is_cheaper(tiles, v.shape, mu.shape[-2]):
            return steered_backends.steered_local(v, mu, sigma, weight, grid_size, tiles)
    return steered_backends.steered_mix(v, mu, sigma, weight, grid_size, separable=False)


#: Multiply-adds one tile of the windowed steered path costs beyond its arithmetic (Python
#: dispatch, gathering the tile's parameters and key box): an estimate, 0.1 ms at 50 GMAC/s,
#: that ``ssog bench-op --steered-layer`` timings can refine.
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
    windowed = steered_backends.steered_local_cost(tiles) * per_pair + len(tiles) * STEERED_TILE_OVERHEAD_MACS
    return windowed < n * n * per_pair


def choose_backend(
    value_shape: torch.Size | tuple[int, ...],
    grid_size: tuple[int, int],
    num_atoms: int,
    steered: bool,
    device: torch.device,
    requires_grad: bool = False,
    matrix_cached: bool = False,
    dtype: torch.dtype = torch.float32,
    transformed: bool = False,
) -> str:
    """Pick the backend for fixed or steered kernels.

    In order:

    1. ``cpp`` where it can run (``BACKENDS["cpp"].can_run``, :mod:`ssog.ops.registry`:
       without autograd, on a CPU where its compiled kernels take ``dtype`` and the head
       dimension): one pass per call, for fixed kernels the separable multiply-adds, for
       steered ones the dense path's (fewer where kernels are narrow; docs/results/operator.md).
    2. Steered kernels: ``dense`` from shapes alone (a row of ``A`` per query costs
       ``N (R + d)``, the separable contraction ``R N (Wg + 1) d``). ``ssog_mix`` with ``auto``
       then weighs the windowed ``local`` path against it on a CPU, from the parameters'
       values; elsewhere reading them would synchronise the device.
    3. A graph that must hold for every grid (:func:`ssog.ops.capture.any_grid`:
       ``torch.export`` with a dynamic height and width): ``separable``, which holds at every
       grid (dense's ``A`` grows as ``N^2``).
    4. ``fused``, the registered ops (:mod:`ssog.ops.fused`: Triton kernels on CUDA, the
       compiled CPU kernels or PyTorch on a CPU), with or without autograd, under
       ``torch.compile`` too; not while ``torch.export`` or ``torch.jit.trace`` records
       (:func:`ssog.ops.capture.exporting_graph`) and not under a ``torch.func`` transform
       (``transformed``: ``vmap``, ``jvp``, ``jacrev``, ... wrap the values; the ops have no
       batching or forward-mode rule).
    5. Otherwise the cost model (:func:`ssog.ops.costs.dense_costs`): dense when one GEMM
       per head with ``A`` (plus building ``A``, unless ``matrix_cached``) costs less than the
       separable contractions weighted by their overhead on ``device``, and ``A`` of all heads
       (fp32) fits ``DENSE_MAX_MATRIX_BYTES``; else ``separable``.

    A graph that must hold for every batch (:func:`ssog.ops.capture.any_batch`:
    ``torch.export`` with a dynamic batch, ``torch.jit.trace``) is chosen for as for a large
    batch with a cached ``A`` and for the forward pass: the choice then depends on the grid,
    atoms and head_dim alone (``torch.jit.trace`` records twice, the second time without
    autograd, and refuses a graph that differs). The costs and the choice are logged at debug
    level (``logging.getLogger("ssog.ops.functional")``).
    """
    batch, heads, n, dim = value_shape
    if any_batch(batch):
        batch, matrix_cached, requires_grad = 1, True, False
    if BACKENDS["cpp"].can_run(device, dtype, dim, steered, requires_grad):
        _debug("choose_backend: cpp (fused CPU kernels, no autograd)")
        return "cpp"
    if steered:
        _debug("choose_backend: dense for steered kernels (from shapes alone)")
        return "dense"
    if any_grid(grid_size):
        _debug("choose_backend: separable for fixed kernels on a symbolic grid (any image size)")
        return "separable"
    if not transformed and BACKENDS["fused"].can_run(device, dtype, dim, steered, requires_grad):
        _debug("choose_backend: fused (the registered ops) for fixed kernels on %s", device)
        return "fused"
    rows, cols = grid_size
    dense, dense_cost, separable_cost, overhead = dense_costs(
        value_shape, grid_size, num_atoms, device, requires_grad, matrix_cached)
    choice = "dense" if dense else "separable"
    _debug(
        "choose_backend: %s for v %s on a %dx%d grid, R=%d, %s%s%s: dense %.3g MACs, separable %.3g weighted "
        "MACs (x%.1f)", choice, tuple(value_shape), rows, cols, num_atoms, device.type,
        " with autograd" if requires_grad else "", " and a cached A" if matrix_cached else "", dense_cost,
        separable_cost, overhead,
    )
    return choice


# ----------------------------------------------------------------------------- helpers
def _recorded(*tensors: Tensor) -> bool:
    """Whether autograd records work on ``tensors``. With a ``torch.func`` transform
    (``vmap``, ``jacrev``, ...; the Lipschitz analysis) wrapping them
    (:func:`ssog.ops.capture.functorch_wrapped`), it is ``requires_grad`` of
    :func:`choose_backend`: either way the forward-only ``cpp`` kernels, which read raw
    memory, must not run."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _debug(message: str, *args: object) -> None:
    """``logger.debug``, skipped while ``torch.compile`` traces: a logging call inside the
    graph would break ``fullgraph=True``, and the choice is a constant of the graph anyway."""
    if not torch.compiler.is_compiling():
        logger.debug(message, *args)
