"""What a call dispatches: the ops, the device kernels they would launch and the host
synchronisations, counted without timing anything (so on a CPU, over real or fake tensors).

A call of a small operator on a GPU costs what it dispatches more than what it computes
(docs/results/gpu_check.md): :func:`count_dispatches` is how the budgets of the fused path
are checked on a machine without one. Run over fake CUDA tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``) a forward pass takes the CUDA path's
decisions; PyTorch's autograd engine cannot run a backward pass over fake CUDA tensors on a
machine without CUDA, so backward passes are counted over real CPU tensors, which take the
same registered ops and autograd formulas.

Kernels: every op but views, allocations and metadata (:data:`NO_KERNEL`), one each; the
registered ops of :mod:`ssog.ops.fused` by the launches their CUDA kernels make
(:data:`ssog.ops.fused.CUDA_LAUNCHES`). Host synchronisations: the ops that read a device value
on the host (:data:`HOST_SYNCS`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from ..ops.fused import CUDA_LAUNCHES

__all__ = ["HOST_SYNCS", "NO_KERNEL", "DispatchCount", "count_dispatches"]

#: Ops that launch no kernel: allocations (their memory is not touched) and metadata.
NO_KERNEL = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::detach", "aten::lift_fresh", "aten::promote_types", "aten::result_type", "aten::_unsafe_view",
    "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset", "aten::is_same_size",
    "prim::device", "prim::layout", "prim::dtype",
})
#: Ops that copy a device value to the host and wait for it.
HOST_SYNCS = frozenset({
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::equal",
    "aten::allclose", "aten::masked_select", "aten::unique_consecutive", "aten::_unique2", "aten::to_padded_tensor",
})


@dataclass
class DispatchCount:
    """The ops one call dispatched, in order, and what they add up to."""

    ops: list[str] = field(default_factory=list)
    kernels: int = 0
    host_syncs: int = 0

    def summary(self) -> str:
        return f"{len(self.ops)} ops, {self.kernels} kernels, {self.host_syncs} host syncs"


class _Counter(TorchDispatchMode):
    def __init__(self, count: DispatchCount) -> None:
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func._schema.name
        self.count.ops.append(f"{name}.{func._overloadname}")
        if name in HOST_SYNCS:
            self.count.host_syncs += 1
        elif name.startswith("ssog::"):
            self.count.kernels += CUDA_LAUNCHES[name.removeprefix("ssog::")]
        elif not func.is_view and name not in NO_KERNEL:
            self.count.kernels += 1
        return func(*args, **(kwargs or {}))


def count_dispatches(call: Callable[[], Any]) -> tuple[Any, DispatchCount]:
    """``call()``'s result and what it dispatched (the module docstring says what is counted).
    Modes active around it (a ``FakeTensorMode``) see every op after the counter."""
    count = DispatchCount()
    with _Counter(count):
        result = call()
    return result, count
