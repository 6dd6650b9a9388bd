"""The backends of ``ssog_mix`` in one table: what each computes and where it can run.

:data:`BACKENDS` maps every name ``backend=`` takes but ``auto`` to a :class:`Backend`: its
function for fixed kernels, its function for steered kernels (``None``: fixed kernels only)
and ``can_run``, the one place that says on which device, dtype and head dimension, with or
without autograd, the backend runs. ``auto`` (:func:`ssog.ops.choose_backend`) picks among the
backends that can run; the layers and ``ssog bench-op`` ask ``can_run`` too.

Every mixing function takes ``(v, mu, sigma, weight, grid_size, local_tolerance, out=None,
value_checks=False)`` with unchecked shapes (docs/operator.md, "Shapes") and returns
``(B, H, N, d)`` in the dtype of ``v``, in ``out`` when given; ``value_checks`` checks the
parameters' values first (:func:`ssog.ops.checks.check_parameter_values`).
"""
from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from . import backends, cpp_kernels, steered_backends
from . import fused  # noqa: F401  (registers the ops that torch.ops.ssog calls below)
from .capture import capturing_graph, exporting_graph
from .checks import check_parameter_values
from .kernels import fixed_kernel_pair, in_kernel_precision

__all__ = [
    "BACKENDS", "BACKEND_NAMES", "Backend", "CanRun", "MixFunction", "check_backend", "pytorch_backend",
    "windowed_tiles",
]


class MixFunction(Protocol):
    """A backend's mixing (module docstring)."""

    def __call__(
        self, v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int],
        local_tolerance: float, out: Tensor | None = None, value_checks: bool = False,
    ) -> Tensor: ...


#: ``can_run(device, dtype, head_dim, steered, requires_grad)``: whether a backend computes
#: values of this device, dtype and head dimension, for steered kernels or not, with autograd
#: recording (or a ``torch.func`` transform wrapping) the work or not.
CanRun = Callable[[torch.device, torch.dtype, int, bool, bool], bool]


@dataclass(frozen=True)
class Backend:
    """One backend: ``fixed`` and ``steered`` mix (``steered`` is ``None`` for a backend of
    fixed kernels only); ``can_run`` says where they run (:data:`CanRun`)."""

    name: str
    fixed: MixFunction
    steered: MixFunction | None
    can_run: CanRun

    def mixing(self, steered: bool) -> MixFunction:
        """The function for fixed or steered kernels; ``ValueError`` where there is none."""
        if not steered:
            return self.fixed
        if self.steered is None:
            raise ValueError(f"the {self.name} backend supports fixed kernels only; use dense, separable or local")
        return self.steered


def pytorch_backend(
    mix: Callable[..., Tensor], *, fixed_kernels: bool = False, tolerance: bool = True,
) -> MixFunction:
    """A :data:`MixFunction` from ``mix`` written in PyTorch ops: the parameters' values checked
    when asked, then converted to the kernel dtype (fp32, fp64 for fp64;
    :func:`ssog.ops.kernels.in_kernel_precision`), and autocast off, so kernels stay in fp32 and
    only the contractions run in the dtype of ``v``.

    ``mix`` takes ``(v, mu, sigma, weight, grid_size)``, or with ``fixed_kernels`` the 1-D
    kernels ``(v, ky, kx)`` (:func:`ssog.ops.kernels.fixed_kernel_pair`: ``ky (H, R, Hg, Hg)``
    with the mixture weights folded in, ``kx (H, R, Wg, Wg)``), then ``local_tolerance`` where
    ``tolerance``. The backend's function is called from here directly: one wrapper between
    :func:`ssog.ops.functional.mix_unchecked` and the arithmetic."""

    @functools.wraps(mix)
    def run(
        v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], local_tolerance: float,
        out: Tensor | None = None, value_checks: bool = False,
    ) -> Tensor:
        if value_checks:
            check_parameter_values(mu, sigma, weight, grid_size)
        mu, sigma, weight = in_kernel_precision(mu, sigma, weight, v.dtype)
        autocast_off = (
            torch.autocast(v.device.type, enabled=False)
            if torch.amp.is_autocast_available(v.device.type)
            else contextlib.nullcontext()
        )
        with autocast_off:
            args = (v, *fixed_kernel_pair(mu, sigma, weight, grid_size)) if fixed_kernels else \
                (v, mu, sigma, weight, grid_size)
            mixed = mix(*args, local_tolerance) if tolerance else mix(*args)
        return mixed if out is None else out.copy_(mixed)

    return run


def windowed_tiles(
    mu: Tensor, sigma: Tensor, grid_size: tuple[int, int], tolerance: float
) -> list[tuple[tuple[int, int, int, int], tuple[int, int, int, int]]]:
    """The windowed steered path's tiles of ``steered_backends.STEERED_TILE`` queries and the key box
    each reads (:func:`ssog.ops.steered_backends.steered_tiles`); reading them synchronises a GPU."""
    windows = steered_backends.steered_windows(mu, sigma, grid_size, tolerance)
    return steered_backends.steered_tiles(windows, steered_backends.STEERED_TILE)


# ------------------------------------------------------------------------------ mixing
def _steered_rows(separable: bool) -> MixFunction:
    """Steered mixing in query chunks (:func:`ssog.ops.steered_backends.steered_mix`): each query's
    row of ``A``, or (``separable``) its x then y contractions."""
    return pytorch_backend(functools.partial(steered_backends.steered_mix, separable=separable), tolerance=False)


def _local_fixed(v: Tensor, ky: Tensor, kx: Tensor, tolerance: float) -> Tensor:
    """The separable path with truncated kernels, skipping key rows outside every kernel's window."""
    ky, kx = backends.truncate_kernels(ky, tolerance), backends.truncate_kernels(kx, tolerance)
    return backends.fixed_separable(v, ky, kx, key_rows=backends.key_row_spans(ky))


@pytorch_backend
def _local_steered(
    v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], tolerance: float
) -> Tensor:
    tiles = windowed_tiles(mu, sigma, grid_size, tolerance)
    return steered_backends.steered_local(v, mu, sigma, weight, grid_size, tiles)


def _fused_fixed(
    v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], local_tolerance: float,
    out: Tensor | None = None, value_checks: bool = False,
) -> Tensor:
    """The registered ops (:mod:`ssog.ops.fused`): the 1-D kernels in one op, the mixing in
    another. Values are checked on the host on a CPU (a one-line ``ValueError``), elsewhere by a
    device-side assertion of the tables op's flag (no host synchronisation)."""
    on_host = v.device.type == "cpu"
    if value_checks and on_host:
        check_parameter_values(mu, sigma, weight, grid_size)
    mu, sigma, weight = in_kernel_precision(mu, sigma, weight, v.dtype)
    ky, kx, valid = torch.ops.ssog.fixed_tables.default(mu, sigma, weight, *grid_size)
    if value_checks and not on_host:
        torch._assert_async(valid, PARAMETER_VALUES)
    mixed = torch.ops.ssog.fixed_mix.default(v.transpose(1, 2), ky, kx, 0).transpose(1, 2)
    return mixed if out is None else out.copy_(mixed)


#: The device-side assertion's message where ``ssog_mix`` checks values without a host synchronisation.
PARAMETER_VALUES = ("ssog_mix: mu, sigma or weight failed the value checks (finite, sigma > 0, |mu| <= 2^20 tokens, "
                    "((grid + |mu|) / sigma)^2 within float32); check them on the CPU with "
                    "ssog.ops.checks.check_parameter_values for the value")


def _triton_fixed(
    v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], local_tolerance: float,
    out: Tensor | None = None, value_checks: bool = False,
) -> Tensor:
    """:func:`_fused_fixed` where its Triton kernels run, a ``RuntimeError`` elsewhere."""
    if not _can_run_triton(v.device, v.dtype, v.shape[-1], False, False):
        raise RuntimeError("the triton backend needs Triton and a CUDA device (or TRITON_INTERPRET=1 on CPU) and "
                           f"float32, float16 or bfloat16 values, got {v.dtype} on {v.device}; use 'fused' instead")
    return _fused_fixed(v, mu, sigma, weight, grid_size, local_tolerance, out, value_checks)


def _cpp_fixed(
    v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], local_tolerance: float,
    out: Tensor | None = None, value_checks: bool = False,
) -> Tensor:
    """float32 kernels of its own, outside autocast (not a torch op); checks values in the library."""
    return cpp_kernels.cpp_fixed(v, mu, sigma, weight, grid_size, out=out, value_checks=value_checks)


def _cpp_steered(
    v: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, grid_size: tuple[int, int], local_tolerance: float,
    out: Tensor | None = None, value_checks: bool = False,
) -> Tensor:
    return cpp_kernels.cpp_steered(v, mu, sigma, weight, grid_size, out=out, value_checks=value_checks)


# ------------------------------------------------------------------------------ can_run
def _can_run_anywhere(
    device: torch.device, dtype: torch.dtype, head_dim: int, steered: bool, requires_grad: bool
) -> bool:
    """``dense`` and ``separable``: any device and float dtype, differentiable, traceable."""
    return True


def _can_run_local(device: torch.device, dtype: torch.dtype, head_dim: int, steered: bool, requires_grad: bool) -> bool:
    """Reads its key windows from the kernels' values: not on ``meta`` nor under graph capture."""
    return device.type != "meta" and not capturing_graph()


def _can_run_cpp(device: torch.device, dtype: torch.dtype, head_dim: int, steered: bool, requires_grad: bool) -> bool:
    """Forward only, where the compiled library takes the values (:func:`ssog.ops.cpp_kernels.takes`)."""
    return not requires_grad and cpp_kernels.takes(device, dtype, head_dim)


def _can_run_fused(device: torch.device, dtype: torch.dtype, head_dim: int, steered: bool, requires_grad: bool) -> bool:
    """Fixed kernels, any device and float dtype, except while ``torch.export`` or
    ``torch.jit.trace`` records (:func:`ssog.ops.capture.exporting_graph`: an exported program
    would need the ops registered wherever it runs, and ONNX has no translation for them)."""
    return not steered and not exporting_graph()


def _can_run_triton(
    device: torch.device, dtype: torch.dtype, head_dim: int, steered: bool, requires_grad: bool
) -> bool:
    """The fused ops where their Triton kernels run: CUDA (or Triton's CPU interpreter), fp32/fp16/bf16."""
    if not _can_run_fused(device, dtype, head_dim, steered, requires_grad):
        return False
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from .triton_kernels import takes  # imports Triton: only when asked about

    return takes(device, dtype)


BACKENDS: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("dense", pytorch_backend(backends.fixed_dense, fixed_kernels=True, tolerance=False),
                _steered_rows(separable=False), _can_run_anywhere),
        Backend("separable", pytorch_backend(backends.fixed_separable, fixed_kernels=True, tolerance=False),
                _steered_rows(separable=True), _can_run_anywhere),
        Backend("local", pytorch_backend(_local_fixed, fixed_kernels=True), _local_steered, _can_run_local),
        Backend("cpp", _cpp_fixed, _cpp_steered, _can_run_cpp),
        Backend("fused", _fused_fixed, None, _can_run_fused),
        Backend("triton", _triton_fixed, None, _can_run_triton),
    )
}
#: Every name ``backend=`` takes: ``auto`` (:func:`ssog.ops.choose_backend`) and the table's.
BACKEND_NAMES = ("auto", *BACKENDS)


def check_backend(name: str) -> None:
    """``ValueError`` unless ``name`` is in :data:`BACKEND_NAMES`."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
