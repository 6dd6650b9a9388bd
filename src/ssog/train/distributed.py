"""Process-group setup for runs launched by ``torchrun`` (gloo on CPU, nccl on CUDA), and
what a run says when another of its processes stops (:class:`PeerStopped`)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ssog.runtime import resolve_device

__all__ = ["DistContext", "PeerStopped", "agreed_stop", "all_reduce_sum", "barrier", "init_distributed",
           "is_peer_failure", "peer_stopped_message"]

#: What the collective libraries' errors say when the connection to another process broke:
#: gloo names its transport's source files (``gloo/transport/tcp/pair.cc``: "Connection reset
#: by peer", "Connection closed by peer", a receive timing out); torch raises its own errors
#: (``DistBackendError``, NCCL's "remote process exited") as :class:`torch.distributed.DistError`.
_GLOO_ERROR = "/gloo/"


class PeerStopped(ConnectionError):
    """A collective failed because another process of a distributed run stopped (killed, out of
    memory, its machine gone); this process's ``last.safetensors`` is what the run can resume from."""


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
    world_size = _environment_count("WORLD_SIZE", 1, minimum=1)
    rank = _environment_count("RANK", 0)
    local_rank = _environment_count("LOCAL_RANK", 0)
    if rank >= world_size:
        raise ValueError(f"RANK={rank} must be below WORLD_SIZE={world_size} (torchrun sets both; unset them to "
                         "run one process)")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        torch_device = torch.device("cuda", local_rank)
    else:
        torch_device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return DistContext(rank, world_size, local_rank, torch_device)


def _environment_count(name: str, default: int, minimum: int = 0) -> int:
    """The whole number >= ``minimum`` in the environment variable ``name`` (``default`` when
    unset), else a ValueError naming it."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(f"the environment variable {name}={text!r} must be a whole number >= {minimum} (torchrun "
                         "sets it; unset it to run one process)")
    return value


def all_reduce_sum(values: list[float], ctx: DistContext) -> list[float]:
    """Element-wise sum of ``values`` over all processes (float64, so counts stay exact)."""
    if not ctx.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def agreed_stop(signum: int | None, ctx: DistContext) -> int | None:
    """The stop signal any process of the run got (``signum``: this one's, None if none), the
    same in every process, so that all stop at the same step: one small all-reduce (the
    largest signal number) in a distributed run."""
    if not ctx.distributed:
        return signum
    flag = torch.tensor([signum or 0], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) or None


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def is_peer_failure(error: BaseException, ctx: DistContext) -> bool:
    """Whether ``error`` is a collective of a distributed run failing: the process group's error
    (:class:`torch.distributed.DistError`) or gloo's ``RuntimeError`` (a lost connection)."""
    return ctx.distributed and (isinstance(error, dist.DistError) or _GLOO_ERROR in str(error))


def peer_stopped_message(ctx: DistContext) -> str:
    """``"another process of the run stopped (rank R?)"``: R the other rank of a two-process run,
    else the ranks it may be (the collective's error does not say which one stopped)."""
    others = [str(rank) for rank in range(ctx.world_size) if rank != ctx.rank]
    ranks = others[0] if len(others) == 1 else f"{', '.join(others[:-1])} or {others[-1]}"
    return f"another process of the run stopped (rank {ranks}?)"
