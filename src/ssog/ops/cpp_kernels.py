"""The ``cpp`` backend: fused CPU kernels (``csrc/ssog_cpu.cpp``) for inference.

Each kernel does a whole mixing in one pass, its running sums in vector registers, where the
``separable`` and ``dense`` paths make many PyTorch calls and write intermediates to memory
(docs/results/operator.md). Fixed kernels: separable mixing, ``R N (Hg + Wg) d``
multiply-adds per head. Steered kernels: every query's row of ``A`` built in L1 from its 1-D
kernels and applied at once, ``N (R + d)`` per query.

The library is compiled on first use with the machine's C++ compiler (``$CXX`` or ``c++``,
``FLAGS``, a few seconds) into ``$SSOG_CACHE_DIR`` (default
``~/.cache/ssog``), keyed by the source, the compiler and the CPU, and loaded with ctypes: a
plain C ABI needs no torch headers, which would make the build take a minute, nor a build
step at install time (an editable or wheel install works the same). Without a compiler, or
with ``SSOG_CPP=0`` (or ``false``, ``no``, ``off``), :func:`available` is ``False`` and ``auto``
uses the PyTorch paths.

The kernels compute forward only (float32, CPU, a head dimension the vector width divides);
``auto`` takes them where no gradient is recorded.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .checks import check_parameter_values
from .capture import capturing_graph

logger = logging.getLogger(__name__)

__all__ = [
    "available", "cpp_fixed", "cpp_steered", "cpp_table_grads", "cpp_tables", "head_dims", "supports", "takes",
    "unavailable_reason",
]

SOURCE = Path(__file__).with_name("csrc") / "ssog_cpu.cpp"
#: Compiler flags. -march=native: the library is built on, and for, the machine that runs it.
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fopenmp")


def available() -> bool:
    """Whether the compiled kernels can run here (compiling them on the first call)."""
    return _library()[0] is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is ``False`` (``None`` when it is ``True``)."""
    return _library()[1]


def supports(v: Tensor) -> bool:
    """Whether the kernels take these values (see :func:`takes`)."""
    return takes(v.device, v.dtype, v.shape[-1])


def takes(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernels take values of this device, dtype and head dimension: float32 on
    the CPU, a head dimension of 1, 2, 3, 4, 6 or 8 vectors (16 floats with AVX-512, else 8),
    outside graph capture (``torch.compile``, ``torch.export``, ``torch.jit.trace``: they are not a
    torch op, a graph would hold their output as a constant). (Callers keep them out of
    autograd: they compute forward only.)"""
    if device.type != "cpu" or dtype != torch.float32 or capturing_graph():
        return False
    return head_dim in head_dims()


@functools.cache
def head_dims() -> tuple[int, ...]:
    """The head dimensions the library takes, ascending: 1, 2, 3, 4, 6 or 8 vectors of this CPU
    (none where the library is not available)."""
    library = _library()[0]
    return () if library is None else tuple(library.ssog_lanes() * k for k in (1, 2, 3, 4, 6, 8))


def cpp_fixed(
    v: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    out: Tensor | None = None,
    value_checks: bool = True,
) -> Tensor:
    """Fixed separable mixing, no gradients; same contract as ``ssog_mix`` with fixed kernels.

    ``v (B, H, N, d)`` float32, any strides with contiguous features (e.g. a transposed view
    of a ``(B, N, H, d)`` projection: read in place); ``mu, sigma (H, R, 2)`` as ``(y, x)`` in
    tokens, ``weight (H, R)``. The library builds the 1-D kernels itself (the
    ``gaussian_rows`` formula). Returns ``(B, H, N, d)``: ``out`` if given (same rules as
    ``v``, written in place), else a new tensor.

    ``value_checks``: the library checks the parameters' values in float32 before it mixes
    (what :func:`ssog.ops.checks.check_parameter_values` checks, and its error on failure);
    without, non-finite parameters give non-finite outputs, as in the other backends.
    """
    return _mix(False, v, mu, sigma, weight, grid_size, out, value_checks)


def cpp_steered(
    v: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    out: Tensor | None = None,
    value_checks: bool = True,
) -> Tensor:
    """Steered mixing, no gradients; same contract as ``ssog_mix`` with steered kernels.

    ``v``, ``out`` and ``value_checks`` as in :func:`cpp_fixed`; ``mu, sigma (B, H, N, R, 2)``
    as ``(y, x)`` in tokens, ``weight (B, H, N, R)``. The library builds each query's 1-D
    kernels itself.
    """
    return _mix(True, v, mu, sigma, weight, grid_size, out, value_checks)


def cpp_tables(v: Tensor, ky: Tensor, kx: Tensor, out: Tensor) -> Tensor:
    """Fixed separable mixing from given 1-D kernels, no gradients: ``out = A v`` with
    ``A = sum_r ky_r (x) kx_r``, written into ``out`` and returned.

    ``v, out (B, H, N, d)`` float32 with contiguous features (any other strides); ``ky (H, R,
    Hg, Hg)`` (mixture weights folded in) and ``kx (H, R, Wg, Wg)`` float32, any strides (a
    transposed table mixes with ``A^T``). The CPU kernel of :func:`ssog.ops.fused.fixed_mix`,
    whose callers check the arguments; keys whose kernel value is below ``2e-14`` in every
    kernel of a block are skipped, as in :func:`cpp_fixed`.
    """
    library = _library()[0]
    assert library is not None and supports(v)  # the op's CPU kernel asks supports() first
    batch, heads, _, dim = v.shape
    atoms, rows, cols = ky.shape[1], ky.shape[-1], kx.shape[-1]
    ky, kx = ky.to(torch.float32), kx.to(torch.float32)
    ky_strides = (ctypes.c_int64 * 4)(*ky.stride())
    kx_strides = (ctypes.c_int64 * 4)(*kx.stride())
    status = library.ssog_mix_tables(
        v.data_ptr(), *v.stride()[:3], ky.data_ptr(), ky_strides, kx.data_ptr(), kx_strides, out.data_ptr(),
        *out.stride()[:3], batch, heads, rows, cols, atoms, dim, torch.get_num_threads(),
    )
    if status != 0:  # supports() admits only what the library takes
        raise RuntimeError(f"ssog_mix_tables rejected its arguments (status {status})")
    return out


def cpp_table_grads(grad: Tensor, v: Tensor, ky: Tensor, kx: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of ``ky (H, R, Hg, Hg)`` and ``kx (H, R, Wg, Wg)`` (float32, any strides) of
    :func:`cpp_tables`' mixing, given its output's gradient ``grad`` and its values ``v``, both
    ``(B, H, N, d)`` float32 with contiguous features: the CPU kernel of
    :func:`ssog.ops.fused.fixed_mix_table_grads` (each task sums its block over the batch in a
    fixed order: deterministic). Returns contiguous float32 tables."""
    library = _library()[0]
    assert library is not None and supports(v) and supports(grad)  # the op's CPU kernel asks supports() first
    batch, heads, _, dim = v.shape
    atoms, rows, cols = ky.shape[1], ky.shape[-1], kx.shape[-1]
    ky, kx = ky.to(torch.float32), kx.to(torch.float32)
    grads = []
    for length, other_length, other, row_step, col_step in ((rows, cols, kx, cols, 1), (cols, rows, ky, 1, cols)):
        out = torch.empty(heads, atoms, length, length, dtype=torch.float32)
        status = library.ssog_table_grad(
            v.data_ptr(), *v.stride()[:3], grad.data_ptr(), *grad.stride()[:3], other.data_ptr(),
            (ctypes.c_int64 * 4)(*other.stride()), out.data_ptr(), batch, heads, length, other_length, row_step,
            col_step, atoms, dim, torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"ssog_table_grad rejected its arguments (status {status})")
        grads.append(out)
    return grads[0], grads[1]


#: ``ssog_mix_forward``'s status for parameters whose values its check refused.
_STATUS_OUT_OF_RANGE = 2


def _mix(
    steered: bool,
    v: Tensor,
    mu: Tensor,
    sigma: Tensor,
    weight: Tensor,
    grid_size: tuple[int, int],
    out: Tensor | None,
    value_checks: bool,
) -> Tensor:
    _check(v, mu, sigma, weight)
    parameters = mu, sigma, weight
    batch, heads, _, dim = v.shape
    rows, cols = grid_size
    if v.stride(-1) != 1:
        v = v.contiguous()
    if out is None:
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    elif out.shape != v.shape or out.dtype != v.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be float32 {tuple(v.shape)} with contiguous features, got {out.dtype} "
                         f"{tuple(out.shape)} with strides {out.stride()}")
    mu, sigma, weight = (t.to(torch.float32).contiguous() for t in (mu, sigma, weight))
    library = _library()[0]
    assert library is not None  # _check found it
    status = library.ssog_mix_forward(
        steered, value_checks, v.data_ptr(), *v.stride()[:3], mu.data_ptr(), sigma.data_ptr(), weight.data_ptr(),
        out.data_ptr(), *out.stride()[:3], batch, heads, rows, cols, mu.shape[-2], dim, torch.get_num_threads(),
    )
    if status == _STATUS_OUT_OF_RANGE:
        check_parameter_values(*parameters, grid_size)  # raises, naming the value
        raise ValueError("mu, sigma or weight are out of float32's range for the cpp kernels (they pass the "
                         f"check in {parameters[0].dtype}); pass float32 parameters that pass ssog.ops.checks")
    if status != 0:  # supports() admits only what the library takes
        raise RuntimeError(f"ssog_mix_forward rejected its arguments (status {status})")
    return out


def _check(v: Tensor, *parameters: Tensor) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in (v, *parameters)):
        raise RuntimeError("the cpp backend computes forward only (no gradients); use 'auto', which takes it "
                           "where no gradient is recorded, or 'separable' / 'dense' for training")
    if not supports(v):
        library, reason = _library()
        if library is not None:
            reason = (
                f"it takes float32 CPU values whose head dimension is one of {', '.join(map(str, head_dims()))}; "
                f"got {v.dtype} on {v.device}, head dimension {v.shape[-1]}"
            )
        raise RuntimeError(f"the cpp backend cannot run here: {reason}; use 'auto' or 'separable'")


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str | None]:
    """The loaded library and ``None``, or ``None`` and why it is not there."""
    switch = os.environ.get("SSOG_CPP", "1").strip().lower()
    if switch in ("0", "false", "no", "off"):
        return None, f"disabled by SSOG_CPP={os.environ['SSOG_CPP']}"
    if switch not in ("", "1", "true", "yes", "on"):
        reason = f"SSOG_CPP={os.environ['SSOG_CPP']!r} is not 0/1, false/true, no/yes or off/on; taken as off"
        logger.warning(reason)
        return None, reason
    try:
        path = _build()
        library = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError, RuntimeError) as error:
        logger.info("ssog: the cpp backend is not available (%s); auto uses the PyTorch backends", error)
        return None, str(error)
    int32, int64, pointer = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
    library.ssog_lanes.restype = int32
    library.ssog_lanes.argtypes = []
    strided: list[type[ctypes._SimpleCData[Any]]] = [pointer, int64, int64, int64]  # data, batch / head / token strides
    library.ssog_mix_forward.restype = int32
    # steered, check; v; mu, sigma, weight; out; batch; heads, rows, cols, atoms, dim, threads
    library.ssog_mix_forward.argtypes = [int32, int32] + strided + [pointer] * 3 + strided + [int64] + [int32] * 6
    library.ssog_mix_tables.restype = int32
    # v; ky, its strides; kx, its strides; out; batch; heads, rows, cols, atoms, dim, threads
    library.ssog_mix_tables.argtypes = strided + [pointer] * 4 + strided + [int64] + [int32] * 6
    library.ssog_table_grad.restype = int32
    # v; g; other, its strides; grad; batch; heads, rows, cols; row_step, col_step; atoms, dim, threads
    library.ssog_table_grad.argtypes = strided + strided + [pointer] * 3 + [int64] + [int32] * 3 + [int64] * 2 + \
        [int32] * 3
    return library, None


def _build() -> Path:
    """Compile the library unless the cache holds it; returns its path."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source)
    for part in (compiler, " ".join(FLAGS), platform.machine(), _cpu_signature()):
        key.update(part.encode())
    cache = Path(os.environ.get("SSOG_CACHE_DIR") or Path.home() / ".cache" / "ssog")
    target = cache / f"ssog_cpu-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # Compile to a private name and rename: processes building at once (torchrun ranks)
    # never load a half-written library.
    handle, partial = tempfile.mkstemp(dir=cache, suffix=".so.partial")
    os.close(handle)
    try:
        result = subprocess.run(
            [compiler, *FLAGS, str(SOURCE), "-o", partial], capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    logger.info("ssog: built the cpp backend's kernels into %s", target)
    return target


def _cpu_signature() -> str:
    """The CPU's feature flags (``-march=native`` compiles for them), where Linux lists them."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return platform.processor()
