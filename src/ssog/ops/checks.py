"""Argument checks of the SSoG operator and of the token mixers' inputs: the one place they live.

Each check raises ``ValueError`` with one line naming the argument, what it was and what was
expected. :func:`ssog.ops.ssog_mix` and :func:`ssog.ops.ssog_matrix` run the operator checks on
every call; the layers check their tokens on every call and their options once, at
construction (their ``check_options``, with :mod:`ssog.layers.options`), and then call the
operator's unchecked entry, :func:`ssog.ops.functional.mix_unchecked` (their parameters have
the right shapes by construction). Backend names are the registry's
(:func:`ssog.ops.registry.check_backend`).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from .capture import capturing_graph, functorch_wrapped
from .kernels import kernel_dtype

__all__ = [
    "MAX_CENTRE_OFFSET", "check_grid", "check_local_tolerance", "check_parameter_values", "check_parameters",
    "check_steer", "check_tokens", "check_values", "parameters_in_range",
]

#: Largest ``|mu|`` (tokens) accepted. A kernel row is a softmax of ``-(j - c)^2 / 2 sigma^2``
#: over keys ``j``; float32 resolves neighbouring keys' squared distances from a centre ``c``
#: only to about ``2^24 / |c|`` ulps, so 2^20 keeps 16 and anything beyond is a diverged
#: parameter, not a meaningful offset on any grid.
MAX_CENTRE_OFFSET = 2.0**20


def check_grid(grid_size: tuple[int, int]) -> tuple[int, int]:
    """``(Hg, Wg)`` as two positive ints (symbolic ones, of a graph recorded for any image
    size, are kept symbolic: ``int()`` would fix the graph to the example's grid)."""
    try:
        rows, cols = (s if isinstance(s, torch.SymInt) else int(s) for s in grid_size)
        # 4.5 tokens would be truncated, silently
        whole = all(isinstance(s, torch.SymInt) or int(s) == s for s in grid_size)
    except (TypeError, ValueError):
        whole = False
    if not whole:
        raise ValueError(f"grid_size must be a pair (Hg, Wg) of positive ints, got {grid_size!r}")
    if rows <= 0 or cols <= 0:
        raise ValueError(f"grid_size must be positive, got {(rows, cols)}")
    return rows, cols


def check_values(v: Tensor, grid_size: tuple[int, int]) -> tuple[int, int, int, int]:
    """``v (B, H, N, d)``, floating point, with ``N = Hg * Wg``; returns its shape."""
    if v.dim() != 4:
        raise ValueError(f"v must be (B, H, N, d), got shape {tuple(v.shape)}")
    if not v.is_floating_point():
        raise ValueError(f"v must be a floating-point tensor, got {v.dtype}")
    batch, heads, n, dim = v.shape
    if n != grid_size[0] * grid_size[1]:
        raise ValueError(f"v has N={n} tokens but grid_size {grid_size} holds {grid_size[0] * grid_size[1]}")
    return batch, heads, n, dim


def check_local_tolerance(local_tolerance: float) -> None:
    if not 0.0 < local_tolerance < 1.0:
        raise ValueError(f"local_tolerance must be in (0, 1), got {local_tolerance}")


def check_parameters(
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    batch_heads: tuple[int, int] | None,
) -> bool:
    """Validate the mixture's shapes against the grid (and ``v``'s ``(B, H)``); return True
    for steered (per-query) parameters."""
    expected_mu: tuple[int, ...]
    expected_weight: tuple[int, ...]
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
            raise ValueError(f"steered mu has N={n} queries but grid_size {grid_size} holds "
                             f"{grid_size[0] * grid_size[1]}")
        steered = True
    else:
        raise ValueError(f"mu must be (H, R, 2) fixed or (B, H, N, R, 2) steered, got shape {tuple(mu.shape)}")
    if tuple(mu.shape) != expected_mu:
        raise ValueError(f"mu must end in 2 (y, x) components: expected shape {expected_mu}, got {tuple(mu.shape)}")
    if atoms < 1:
        raise ValueError(f"the mixture needs at least 1 atom (R, the second-to-last axis of mu), got mu of shape "
                         f"{tuple(mu.shape)}")
    if tuple(sigma.shape) != expected_mu:
        raise ValueError(f"sigma must have the shape of mu {expected_mu}, got {tuple(sigma.shape)}")
    if tuple(weight.shape) != expected_weight:
        raise ValueError(f"weight must have shape {expected_weight}, got {tuple(weight.shape)}")
    return steered


def check_parameter_values(mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]) -> None:
    """Finite parameters, ``sigma > 0``, ``|mu| <= MAX_CENTRE_OFFSET``, and squared standardised
    distances ``((L + |mu|) / sigma)^2`` that the kernel dtype can hold (skipped on ``meta``)."""
    if mu.device.type == "meta":
        return
    dtype = kernel_dtype(torch.promote_types(mu.dtype, sigma.dtype))
    if _parameters_valid(mu, sigma, weight, grid_size, dtype):
        return
    offset = mu.abs()
    for name, tensor in (("mu", mu), ("sigma", sigma), ("weight", weight)):
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{name} must be finite everywhere, got {_first_bad(tensor, torch.isfinite(tensor))}")
    if not bool((sigma > 0).all()):
        raise ValueError(f"sigma must be > 0 everywhere (widths are in token units), got "
                         f"{_first_bad(sigma, sigma > 0)}")
    if not bool((offset <= MAX_CENTRE_OFFSET).all()):
        raise ValueError(f"|mu| must be <= 2^20 tokens (float32 cannot place a kernel further out), got "
                         f"{_first_bad(mu, offset <= MAX_CENTRE_OFFSET)}")
    # What is left: a reach whose square overflows the kernel dtype.
    reach = (torch.tensor(grid_size, dtype=dtype, device=mu.device) + offset.to(dtype)) / sigma.to(dtype)
    raise ValueError(f"sigma is too small for its centre: ((grid + |mu|) / sigma)^2 overflows {dtype}, got "
                     f"sigma {_first_bad(sigma, reach < math.sqrt(torch.finfo(dtype).max))}")


def parameters_in_range(mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int]) -> Tensor:
    """Whether the parameters pass :func:`check_parameter_values`, as a 0-dim bool tensor on
    their device: no host synchronisation (``torch._assert_async`` of it checks them on a GPU)."""
    dtype = kernel_dtype(torch.promote_types(mu.dtype, sigma.dtype))
    mu, sigma, weight = (t.to(dtype) for t in (mu, sigma, weight))
    rows, cols = grid_size
    lengths = torch.arange(2, dtype=dtype, device=mu.device) * (cols - rows) + rows  # (y, x), no host copy
    offset = mu.abs()
    reach = (lengths + offset) / sigma
    largest = torch.finfo(dtype).max
    return (((reach > 0) & (reach < math.sqrt(largest))).all() & (offset <= MAX_CENTRE_OFFSET).all()
            & (weight.abs() <= largest).all())


def _parameters_valid(
    mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], dtype: torch.dtype
) -> bool:
    """The whole of :func:`check_parameter_values` for valid parameters, in one pass
    (:func:`_in_range`). Plain CPU tensors are read as NumPy arrays: on a few dozen numbers
    a NumPy call costs less than a torch call's dispatch (docs/results/operator.md; the
    ``cpp`` kernels check their parameters in the library instead)."""
    if mu.device.type != "cpu" or capturing_graph() or functorch_wrapped(mu, sigma, weight):
        mu, sigma, weight = (t.to(dtype) for t in (mu, sigma, weight))
        return _in_range(mu, sigma, weight, torch.tensor(grid_size, dtype=dtype, device=mu.device),
                         torch.finfo(dtype).max)
    mu_np, sigma_np, weight_np = (t.detach().to(dtype).numpy() for t in (mu, sigma, weight))
    return _in_range(mu_np, sigma_np, weight_np, np.asarray(grid_size, dtype=mu_np.dtype),
                     float(np.finfo(mu_np.dtype).max))


#: The arrays :func:`_in_range` reads: torch tensors or NumPy arrays, all four of one kind.
_Array = TypeVar("_Array", Tensor, np.ndarray)


def _in_range(mu: _Array, sigma: _Array, weight: _Array, lengths: _Array, largest: float) -> bool:
    """Whether parameters (torch tensors or NumPy arrays, the same operators on either) pass
    every value check: ``(L + |mu|) / sigma`` is positive and its square below ``largest``
    exactly when ``sigma > 0`` is finite, ``mu`` is finite and the squared distances are
    held; NaN fails every comparison."""
    with np.errstate(all="ignore"):  # overflow and NaN are what the comparisons look for
        offset = abs(mu)
        reach = (lengths + offset) / sigma
        return bool(
            ((reach > 0) & (reach < math.sqrt(largest))).all()
            & (offset <= MAX_CENTRE_OFFSET).all()
            & (abs(weight) <= largest).all()
        )


def _first_bad(tensor: Tensor, ok: Tensor) -> str:
    bad = (~ok).nonzero()[0].tolist()
    return f"{tensor[tuple(bad)].item()} at index {tuple(bad)}"


def check_tokens(x: Tensor, grid_size: tuple[int, int], num_prefix_tokens: int, dim: int) -> tuple[int, int, int]:
    """Validate a mixer's input ``x (B, P + Hg*Wg, dim)`` against the grid; return its shape."""
    if x.dim() != 3:
        raise ValueError(f"expected tokens of shape (B, P + Hg*Wg, {dim}), got {tuple(x.shape)}")
    batch, tokens, channels = x.shape
    if channels != dim:
        raise ValueError(f"tokens have {channels} channels, the layer expects dim={dim}")
    rows, cols = check_grid(grid_size)
    if tokens != num_prefix_tokens + rows * cols:
        raise ValueError(
            f"{tokens} tokens do not match {num_prefix_tokens} prefix tokens + a {rows}x{cols} grid "
            f"({num_prefix_tokens + rows * cols} tokens)"
        )
    return batch, tokens, channels


def check_steer(steer: Iterable[str], steerable: tuple[str, ...]) -> tuple[str, ...]:
    """``steer`` (names, or one name) as a tuple in ``steerable``'s order; an error naming anything else."""
    steer = (steer,) if isinstance(steer, str) else tuple(steer)  # "mu" is one name, not the letters m, u
    unknown = sorted(set(steer) - set(steerable))
    if unknown:
        raise ValueError(f"cannot steer {unknown}; steer must be a subset of {steerable}")
    return tuple(name for name in steerable if name in steer)
