"""How the operator is being run: recorded into a graph, for every batch, or under a
``torch.func`` transform. The backends and the choice among them ask these before they read
values on the host, size work by the batch or checkpoint activations."""
from __future__ import annotations

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

__all__ = ["any_batch", "any_grid", "capturing_graph", "exporting_graph", "functorch_wrapped", "holds_values"]


def capturing_graph() -> bool:
    """Whether this call is being recorded into a graph rather than run: ``torch.compile``,
    ``torch.export`` (both trace with dynamo or FX) or ``torch.jit.trace``.

    Paths that decide in Python from tensor values (the layer's matrix cache, the steered
    path's key windows), that call outside torch's dispatcher (the ``cpp`` kernels) or that
    a tracer cannot record (an ``autograd.Function``) would be baked into the graph as
    constants or fail there; the plain tensor paths they stand in for are recorded exactly.
    """
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def exporting_graph() -> bool:
    """Whether a graph is being recorded to run without this package's Python: ``torch.export``
    (and the ONNX export built on it) or ``torch.jit.trace``; not ``torch.compile``, whose
    graph runs here (torch before 2.7, which cannot tell export from compile, counts both)."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    exporting = is_exporting() if is_exporting is not None else torch.compiler.is_compiling()
    return exporting or torch.jit.is_tracing()


def any_batch(batch: int | torch.SymInt) -> bool:
    """Whether the graph being captured must hold for every batch size: a symbolic batch
    (``torch.export`` with a dynamic batch dimension, ``torch.compile`` with dynamic shapes)
    or ``torch.jit.trace``, whose graph runs at any input size. Sizing work by the batch
    would then guard on the example's (an export error) or bake it in (a trace that fails,
    or silently computes something else, at another batch)."""
    return isinstance(batch, torch.SymInt) or torch.jit.is_tracing()


def any_grid(grid_size: tuple[int | torch.SymInt, int | torch.SymInt]) -> bool:
    """Whether the graph being captured must hold for every token grid: a symbolic ``(Hg, Wg)``
    (``torch.export`` with dynamic height and width, ``torch.compile`` with dynamic shapes).
    Choosing a backend by cost, or cutting the work into blocks of query rows or chunks of
    queries, from the grid would then guard on the example's grid (an export error, or a
    program that refuses every other image size); the work is then done in one piece, with
    a backend chosen from no size. (``torch.jit.trace`` has no symbolic sizes: it records the
    choices made for the example's grid, and a traced model is meant for that image size.)"""
    return any(isinstance(size, torch.SymInt) for size in grid_size)


def functorch_wrapped(*tensors: Tensor) -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``vjp``, ``jacrev``, ...) wraps any of
    ``tensors`` (never while ``torch.compile`` traces)."""
    if torch.compiler.is_compiling():
        return False
    return any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


def holds_values(tensor: Tensor) -> bool:
    """Whether ``tensor`` has values in memory: not a meta tensor nor a fake one
    (``FakeTensorMode``, which ``torch.compile`` and the dispatch counts use), whose data
    cannot key a cache."""
    return tensor.device.type != "meta" and not is_fake(tensor)
