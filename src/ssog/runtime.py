"""Where and in which precision code runs: the device and dtype names every command accepts."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Iterator

import torch

__all__ = [
    "DTYPES", "PLOT_EXTRA", "STOP_SIGNALS", "autocast", "check_plotting", "cpu_seconds", "cpu_threads",
    "is_out_of_memory", "resolve_device", "resolve_dtype", "torch_settings", "usable_cpus",
]

logger = logging.getLogger(__name__)

# torch reports a failed CPU allocation as a plain RuntimeError (torch 2.14: torch.empty(2**50)
# raises "RuntimeError: [enforce fail at alloc_cpu.cpp] ... DefaultCPUAllocator: can't allocate
# memory"), not as torch.OutOfMemoryError, which only the CUDA allocator raises: its message is
# all that tells it from other RuntimeErrors.
_CPU_OOM_MESSAGES = ("can't allocate memory", "not enough memory", "out of memory")

#: The dtype vocabulary of every command and config: short names (also mixed-precision
#: ``amp`` levels) and torch's own names for the same dtypes.
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
}


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"fp32"``/``"float32"``, ``"bf16"``/``"bfloat16"``, ``"fp16"``/``"float16"`` (or a dtype) -> dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; ``"cpu"``/``"cuda[:i]"`` as given.

    Raises ValueError for other device types or a CUDA request on a machine without one.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"unknown device {device!r}; expected 'auto', 'cpu' or 'cuda[:i]'") from error
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {str(device)!r}; expected 'auto', 'cpu' or 'cuda[:i]'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available on this machine; use --device cpu")
    return device


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision on ``device``: none for ``"none"`` or a float32 name, else
    ``torch.autocast`` to that dtype (``"bf16"``, ``"fp16"`` or torch's names)."""
    if precision == "none" or resolve_dtype(precision) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=resolve_dtype(precision))


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bfloat16 matmuls and convolutions natively (oneDNN's bf16 kernels:
    AVX-512 or AMX). Without them (an AVX2-only CPU) bf16 autocast falls back to reference
    kernels: a 512x512 bf16 matmul ran at 0.8 GFLOP/s against fp32's 50 on one thread of an
    AVX2 AMD EPYC."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


#: How to install what the figures need (matplotlib, an extra of the package).
PLOT_EXTRA = "pip install 'ssog[plot]'"


def check_plotting(needed_by: str | None = None) -> bool:
    """Whether figures can be drawn: matplotlib (the ``plot`` extra) is installed.

    Commands call this before their work, so that what stops them does so at once, not after
    an epoch or a sweep. ``needed_by`` (e.g. ``"ssog bench-op"``) is a command whose output
    includes figures: without matplotlib it cannot run, and a ``ValueError`` says which extra
    to install; without ``needed_by`` the caller goes on without figures. ssog draws on bare
    ``Figure`` objects into files and needs no backend, but matplotlib checks ``MPLBACKEND``
    when it is imported: a value that keeps it from importing is a ``ValueError`` naming it.
    """
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name != "matplotlib":
            raise
        if needed_by is not None:
            raise ValueError(f"{needed_by} draws figures with matplotlib, which is not installed: {PLOT_EXTRA}") \
                from None
        return False
    except ValueError as error:
        backend = os.environ.get("MPLBACKEND")
        if backend is None or "backend" not in str(error):
            raise
        raise ValueError(f"MPLBACKEND={backend!r} is not a matplotlib backend, and matplotlib does not import "
                         "with it; unset MPLBACKEND (ssog draws its figures into files and needs no backend) "
                         "or set MPLBACKEND=Agg") from None
    return True


def cpu_seconds() -> float:
    """CPU seconds (user and system) used so far by this process, its child processes that have
    ended and, where Linux's ``/proc`` lists them, those still running (data-loader workers)."""
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    try:
        pids = children.read_text().split()
    except OSError:  # not Linux, or a kernel without the list
        return total
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended since the list was read: its time is in children_* next time
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15 of stat)
    return total


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure: ``torch.OutOfMemoryError`` (CUDA),
    ``MemoryError``, or the RuntimeError of torch's CPU allocator (see ``_CPU_OOM_MESSAGES``)."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(message in str(error).lower() for message in _CPU_OOM_MESSAGES)


def available_memory_bytes() -> int | None:
    """Bytes of memory this machine can still give (Linux's ``MemAvailable``; elsewhere its
    physical memory), or None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the system tells it (a batch
    job's share of a machine), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_threads(threads: int, setting: str = "threads") -> int:
    """``threads`` (the user's ``setting``) capped at :func:`usable_cpus`, with a warning when
    capped: a thread beyond the cores only waits for one, and torch's parallel regions wait
    for every thread (1000 threads on 2 cores turned a 5 s dry run into minutes)."""
    cpus = usable_cpus()
    if threads > cpus:
        logger.warning(f"{setting} {threads} is more than the {cpus} CPU{'s' if cpus > 1 else ''} this process may "
                       f"use, where the extra threads could only wait for a core; using {cpus}")
        return cpus
    return threads


@contextlib.contextmanager
def torch_settings(device: torch.device, threads: int | None = None, deterministic: bool = False) -> Iterator[None]:
    """CPU ``threads`` (on a CPU ``device``, when given; capped by :func:`cpu_threads`) and
    ``deterministic`` algorithms for the block, restored afterwards (training and evaluation
    are also library calls)."""
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    if device.type == "cpu" and threads:
        torch.set_num_threads(cpu_threads(threads))
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = not deterministic
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1])
        torch.backends.cudnn.benchmark = saved[2]


#: The signals that ask a run to stop at its next step boundary: a terminal's Ctrl-C, the
#: SIGTERM of a scheduler, a launcher or ``kill``, and SIGUSR1, which clusters send ahead of a
#: deadline or a preemption (SLURM's ``--signal``).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

