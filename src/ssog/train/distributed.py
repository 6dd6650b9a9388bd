"""Process-group setup for runs launched by ``torchrun`` (gloo on CPU, nccl on CUDA)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ssog.runtime import resolve_device

__all__ = ["DistContext", "init_distributed", "all_reduce_sum", "barrier"]


@dataclass(frozen=True)
class DistContext:
    """This process's place in the run: ``rank`` of ``world_size``, its ``device``."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> DistContext:
    """Join the process group if ``torchrun`` started us (``WORLD_SIZE`` > 1), else run alone.

    ``device``: ``auto`` (CUDA if available), ``cpu`` or ``cuda``. Each process on a CUDA
    node uses GPU ``LOCAL_RANK``.
    """
    use_cuda = resolve_device(device).type == "cuda"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        torch_device = torch.device("cuda", local_rank)
    else:
        torch_device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return DistContext(rank, world_size, local_rank, torch_device)


def all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    """Element-wise sum of ``values`` over all processes (float64, so counts stay exact)."""
    if not ctx.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()
