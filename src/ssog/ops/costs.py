"""The cost model of fixed mixing in PyTorch ops: whether one GEMM with the dense ``A`` costs
less than the separable path's contractions (docs/operator.md, "Backends"). ``auto``
(:func:`ssog.ops.choose_backend`) and the CPU kernels of the registered op
(:mod:`ssog.ops.fused`) ask it."""
from __future__ import annotations

import torch

__all__ = [
    "DENSE_BUILD_MACS_PER_ENTRY", "DENSE_MAX_MATRIX_BYTES", "SEPARABLE_OVERHEAD_ACCELERATOR", "SEPARABLE_OVERHEAD_CPU",
    "SEPARABLE_OVERHEAD_CPU_AUTOGRAD", "SEPARABLE_OVERHEAD_CUDA", "dense_costs",
]

# Multiply-adds per call (docs/results/operator.md).
#: Element-wise work of building one entry of the dense ``A``, in multiply-adds.
DENSE_BUILD_MACS_PER_ENTRY = 8
#: Dense is considered only while ``A`` of all heads (fp32) stays within this many bytes.
DENSE_MAX_MATRIX_BYTES = 16 * 2**20
#: Weight of the separable path's many small GEMMs against one large one, fitted to
#: ``ssog bench-op`` on a CPU: forward only, and with autograd (more small GEMMs).
SEPARABLE_OVERHEAD_CPU = 1.9
SEPARABLE_OVERHEAD_CPU_AUTOGRAD = 2.6
#: The same weight on CUDA, fitted to ``ssog bench-op`` there (docs/results/gpu_check.md): the
#: smallest at which the model picks dense at every grid the bench timed, since dense was the
#: faster of the two at each, forward and with autograd.
SEPARABLE_OVERHEAD_CUDA = 9.0
#: The same weight on other accelerators, where launch latency dominates small GEMMs (an estimate).
SEPARABLE_OVERHEAD_ACCELERATOR = 3.0


def dense_costs(
    value_shape: torch.Size | tuple[int, ...],
    grid_size: tuple[int, int],
    num_atoms: int,
    device: torch.device,
    requires_grad: bool = False,
    matrix_cached: bool = False,
) -> tuple[bool, float, float, float]:
    """Whether dense is the cheaper of dense and separable for values of ``value_shape``
    ``(B, H, N, d)``, and the costs it weighed: ``(dense, dense_macs, separable_macs, overhead)``.

    Dense: ``B H N^2 d`` in one GEMM per head, plus building ``A`` (``H R N^2`` entries of
    ``DENSE_BUILD_MACS_PER_ENTRY`` each) unless ``matrix_cached``; considered only while ``A``
    of all heads (fp32) is at most ``DENSE_MAX_MATRIX_BYTES``. Separable: ``B H R N (Hg + Wg) d``
    weighted by the overhead of its many small GEMMs on ``device`` (with ``requires_grad``, its
    backward's too, on a CPU).
    """
    batch, heads, n, dim = value_shape
    rows, cols = grid_size
    if device.type == "cpu":
        overhead = SEPARABLE_OVERHEAD_CPU_AUTOGRAD if requires_grad else SEPARABLE_OVERHEAD_CPU
    elif device.type == "cuda":
        overhead = SEPARABLE_OVERHEAD_CUDA
    else:
        overhead = SEPARABLE_OVERHEAD_ACCELERATOR
    dense_cost = batch * heads * n * n * dim
    if not matrix_cached:
        dense_cost += heads * num_atoms * n * n * DENSE_BUILD_MACS_PER_ENTRY
    separable_cost = batch * heads * num_atoms * n * (rows + cols) * dim * overhead
    dense = dense_cost <= separable_cost and heads * n * n * 4 <= DENSE_MAX_MATRIX_BYTES
    return dense, dense_cost, separable_cost, overhead
