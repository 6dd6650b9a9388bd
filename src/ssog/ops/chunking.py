"""Chunks of the backends' work: where each chunk starts, and activation checkpointing of a
chunk when it is one of several that need gradients (so only one chunk's intermediate is
alive at a time)."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .capture import functorch_wrapped


def chunk_starts(length: int | torch.SymInt, step: int | torch.SymInt) -> range | tuple[int]:
    """``range(0, length, step)``, and ``(0,)`` for one step (``range`` fixes a symbolic ``length``)."""
    return (0,) if step >= length else range(0, length, step)


def recompute_in_backward(*tensors: Tensor) -> bool:
    """Whether activation checkpointing applies to work on ``tensors``: autograd records it,
    and no ``torch.func`` transform (``vjp``, ``jacrev``, ...; the Lipschitz analysis uses
    them) is active, since those do not support the saved-tensor hooks checkpointing uses."""
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return False
    return not functorch_wrapped(*tensors)


def checkpointed(fn: Callable[..., Tensor], *args, several: bool) -> Tensor:
    """``fn(*args)``, recomputed in the backward pass when it is one of several chunks that
    need gradients (activation checkpointing: only one chunk's rows are alive at a time)."""
    if several and recompute_in_backward(*(a for a in args if isinstance(a, Tensor))):
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


__all__ = ["checkpointed", "chunk_starts", "recompute_in_backward"]
