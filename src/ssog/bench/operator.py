"""Operator benchmark: ``ssog_mix`` (each backend) against fused SDPA at equal shapes.

Both operators get the same batch, heads, head_dim and tokens: SDPA mixes ``q, k, v``
``(B, H, N, d)``; SSoG mixes ``v`` with ``R`` fixed atoms. Candidates are timed
*interleaved* (one call of each per round), so a slow moment of a shared machine hits
every candidate of that round alike; speed is reported as the median over rounds of the
per-round ratio ``t_sdpa / t_candidate``, with its quartiles.

``compiled`` backends are also timed under ``torch.compile(fullgraph=True)`` (candidates
``compile:<backend>``), called as a compiled model calls the mixing: the layers' entry,
without the value checks of the public ``ssog_mix`` (they read values on the host, which
would break the graph). Each is compiled before the timed rounds.

Peak memory is the allocator's peak during one call (``ssog.measure.peak_memory``),
operands excluded: output, workspace and, with ``backward``, the gradients. The footprint
adds the operands each operator needs materialised: ``q, k, v`` for SDPA, ``v`` for SSoG
(its kernel parameters are a few KiB) — what a layer built on it must hold.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..files import save_figure, write_atomic
from ..layers import MultiHeadAttention, SSoGAttention, multiscale_widths
from ..ops import BACKEND_NAMES, BACKENDS, choose_backend, cpp_kernels, ssog_mix
from ..ops.functional import mix_unchecked
from ..measure import peak_memory
from ..runtime import is_out_of_memory, resolve_device, resolve_dtype
from .results import environment
from .timing import quartiles, time_interleaved

__all__ = [
    "BASELINE", "COMPILABLE", "STEERED_LAYER_BACKENDS", "Measurement", "OperatorConfig", "SteeredLayerConfig",
    "can_time", "fixed_parameters", "markdown_table", "plot_speedups", "run_operator_benchmark",
    "run_steered_layer_benchmark", "save", "steered_layer_table", "steered_memory", "unavailable_backends",
]

BASELINE = "sdpa"
#: Backends whose mixing can also be timed under ``torch.compile(fullgraph=True)``: those whose
#: graph depends on shapes alone, the PyTorch ones and the registered ops (``local`` reads its key
#: spans from the kernels' values; ``cpp`` calls its library outside torch's dispatcher;
#: ``triton`` is ``fused`` on CUDA).
COMPILABLE = ("auto", "dense", "separable", "fused")


def _check_backends(backends: Sequence[str]) -> None:
    """Refuse a backend name that is not one of :data:`ssog.ops.BACKEND_NAMES`."""
    unknown = sorted(set(backends) - set(BACKEND_NAMES))
    if unknown:
        raise ValueError(f"unknown backends {unknown}; expected some of {', '.join(BACKEND_NAMES)}")


def _check_sizes(config: OperatorConfig | SteeredLayerConfig, counts: Sequence[str]) -> None:
    """Refuse a benchmark config whose fields ``counts`` are below 1, whose ``grids`` (sides in
    tokens) are empty or not positive, or whose ``device`` is missing (a one-line error)."""
    for name in counts:
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    if not config.grids or min(config.grids) < 1:
        raise ValueError(f"grids must be positive grid sides, got {list(config.grids)}")
    resolve_device(config.device)


@dataclass
class OperatorConfig:
    grids: Sequence[int] = (14, 16, 24, 32, 48, 64)
    batch: int = 4
    heads: int = 12
    head_dim: int = 64
    atoms: int = 4
    dtype: str = "float32"
    device: str = "cpu"
    backends: Sequence[str] = BACKEND_NAMES
    backward: bool = True
    rounds: int = 5
    warmup: int = 1
    dense_max_grid: int = 32  # dense materialises H*N^2 floats: 805 MB at 64x64
    compiled: Sequence[str] = ()  # also timed under torch.compile: some of COMPILABLE

    def __post_init__(self) -> None:
        _check_backends(self.backends)
        not_compilable = sorted(set(self.compiled) - set(COMPILABLE))
        if not_compilable:
            raise ValueError(f"cannot time {not_compilable} under torch.compile; expected some of "
                             f"{', '.join(COMPILABLE)}")
        resolve_dtype(self.dtype)
        _check_sizes(self, ("batch", "heads", "head_dim", "atoms", "rounds"))


def unavailable_backends(config: OperatorConfig) -> dict[str, str]:
    """``{backend: why}`` for the backends of ``config`` that cannot run on its device and dtype."""
    device, dtype = torch.device(config.device), resolve_dtype(config.dtype)
    cannot = {name for name in config.backends if not can_time(name, device, dtype, config.head_dim)}
    reasons = {}
    if "triton" in cannot:
        reasons["triton"] = f"it needs a CUDA device and the triton package (device {config.device})"
    if "cpp" in cannot:
        reasons["cpp"] = cpp_kernels.unavailable_reason() or (
            "it takes float32 values on the CPU with a head dimension of "
            f"{', '.join(map(str, cpp_kernels.head_dims()))} "
            f"(device {config.device}, dtype {config.dtype}, head_dim {config.head_dim})")
    return reasons


def can_time(
    backend: str, device: torch.device, dtype: torch.dtype, head_dim: int, steered: bool = False,
    backward: bool = False,
) -> bool:
    """Whether ``backend`` (or ``auto``, which picks one that can) can run here: the registry's
    ``can_run`` (:mod:`ssog.ops.registry`)."""
    return backend == "auto" or BACKENDS[backend].can_run(device, dtype, head_dim, steered, backward)


@dataclass
class Measurement:
    grid: int
    tokens: int
    pass_: str  # "forward" or "forward+backward"
    candidate: str
    median_ms: float
    speedup_median: float | None = None  # t_sdpa / t_candidate, median over rounds
    speedup_q1: float | None = None
    speedup_q3: float | None = None
    peak_mib: float | None = None
    peak_ratio: float | None = None  # candidate peak / SDPA peak
    footprint_ratio: float | None = None  # (operands + peak) / SDPA's
    note: str = ""
    extra: dict = field(default_factory=dict)


def fixed_parameters(heads: int, atoms: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Atoms as the layer initialises them, with centres spread over a few tokens."""
    generator = torch.Generator().manual_seed(0)
    widths = multiscale_widths(heads, atoms)
    sigma = widths.unsqueeze(-1).repeat(1, 1, 2)
    mu = torch.randn(heads, atoms, 2, generator=generator)
    weight = torch.randn(heads, atoms, generator=generator).softmax(-1)
    return mu.to(device), sigma.to(device), weight.to(device)


def _calls(config: OperatorConfig, grid: int, backward: bool) -> dict[str, Callable[[], None]]:
    device = torch.device(config.device)
    dtype = resolve_dtype(config.dtype)
    n = grid * grid
    shape = (config.batch, config.heads, n, config.head_dim)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(shape, generator=generator).to(device, dtype) for _ in range(3))
    params = fixed_parameters(config.heads, config.atoms, device)
    grad_out = torch.randn(shape, generator=generator).to(device, dtype)
    if backward:
        for t in (q, k, v, *params):
            t.requires_grad_()

    def run(fn: Callable[[], torch.Tensor], inputs: Sequence[torch.Tensor]) -> Callable[[], None]:
        def call() -> None:
            out = fn()
            if backward:
                out.backward(grad_out)
                for t in inputs:
                    t.grad = None

        return call

    calls = {BASELINE: run(lambda: F.scaled_dot_product_attention(q, k, v), (q, k, v))}
    for backend in config.backends:
        if backend == "dense" and grid > config.dense_max_grid:
            continue
        if not can_time(backend, device, dtype, config.head_dim, backward=backward):
            continue  # triton: CUDA only; cpp: forward only, float32 on a CPU where it could be built
        calls[backend] = run(functools.partial(ssog_mix, v, *params, (grid, grid), backend=backend), (v, *params))
    if config.compiled:
        # Every grid and pass recompiles the same code; past torch's recompile limit (8),
        # fullgraph=True fails. The earlier grids' graphs are not needed any more.
        torch.compiler.reset()
    for backend in config.compiled:
        mix = torch.compile(_mixing(grid, backend), fullgraph=True, dynamic=False)
        calls[f"compile:{backend}"] = run(functools.partial(mix, v, *params), (v, *params))
        calls[f"compile:{backend}"]()  # compiles here, not in the timed rounds
    return calls


def _mixing(grid: int, backend: str) -> Callable[..., torch.Tensor]:
    """``(v, mu, sigma, weight) -> out`` on a ``grid x grid`` grid, as the layers mix."""

    def mix(v: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return mix_unchecked(v, mu, sigma, weight, (grid, grid), backend)

    return mix


def run_operator_benchmark(config: OperatorConfig, progress: Callable[[str], None] = print) -> list[Measurement]:
    """Time and measure every candidate at every grid; see the module docstring."""
    device = torch.device(config.device)
    passes = [False, True] if config.backward else [False]
    results: list[Measurement] = []
    for grid in config.grids:
        for backward in passes:
            label = "forward+backward" if backward else "forward"
            calls = _calls(config, grid, backward)
            try:
                stats = time_interleaved(calls, device=device, warmup=config.warmup, iters=config.rounds)
                samples = {name: list(stat.samples) for name, stat in stats.items()}
                peaks = {name: peak_memory(call, device=device) for name, call in calls.items()}
            except RuntimeError as error:
                if not is_out_of_memory(error):
                    raise
                results.append(Measurement(grid, grid * grid, label, "all", math.nan, note="out of memory"))
                progress(f"grid {grid}x{grid} {label}: out of memory")
                continue
            base = samples[BASELINE]
            operand = config.batch * config.heads * grid * grid * config.head_dim * resolve_dtype(config.dtype).itemsize
            footprints = {name: peak + (3 if name == BASELINE else 1) * operand for name, peak in peaks.items()}
            for name, times in samples.items():
                ratios = [b / t for b, t in zip(base, times)]
                q1, median, q3 = quartiles(ratios)
                extra = {}
                if name == "auto":
                    shape = (config.batch, config.heads, grid * grid, config.head_dim)
                    extra["picked"] = choose_backend(
                        shape, (grid, grid), config.atoms, False, device, backward, dtype=resolve_dtype(config.dtype)
                    )
                results.append(
                    Measurement(
                        grid, grid * grid, label, name, 1e3 * statistics.median(times),
                        speedup_median=median, speedup_q1=q1, speedup_q3=q3,
                        peak_mib=peaks[name] / 2**20, peak_ratio=peaks[name] / peaks[BASELINE],
                        footprint_ratio=footprints[name] / footprints[BASELINE],
                        extra=extra,
                    )
                )
            summary = ", ".join(
                f"{m.candidate} {m.speedup_median:.2f}x" for m in results[-len(samples):] if m.candidate != BASELINE
            )
            progress(f"grid {grid}x{grid} {label}: SDPA {1e3 * statistics.median(base):.1f} ms; {summary}")
    return results


def steered_memory(config: OperatorConfig, grid: int = 64, steer_atoms: int | None = None) -> dict[str, float]:
    """Peak memory (MiB) of centre-steered mixing at ``grid x grid``, forward and backward."""
    device = torch.device(config.device)
    dtype = resolve_dtype(config.dtype)
    atoms = steer_atoms or config.atoms
    n = grid * grid
    shape = (config.batch, config.heads, n, config.head_dim)
    v = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    mu0, sigma0, weight0 = fixed_parameters(config.heads, atoms, device)
    offsets = torch.randn(config.batch, config.heads, n, atoms, 2, device=device, requires_grad=True)

    def forward() -> torch.Tensor:
        mu = mu0.unsqueeze(1) + offsets
        sigma = sigma0.unsqueeze(1).expand_as(mu)
        weight = weight0.unsqueeze(1).expand(mu.shape[:-1])
        return ssog_mix(v, mu, sigma, weight, (grid, grid))

    def forward_no_grad() -> None:
        with torch.no_grad():
            forward()

    def forward_backward() -> None:
        forward().sum().backward()
        v.grad = offsets.grad = None

    return {
        "grid": grid,
        "forward_peak_mib": peak_memory(forward_no_grad, device=device) / 2**20,
        "forward_backward_peak_mib": peak_memory(forward_backward, device=device) / 2**20,
    }


def markdown_table(results: list[Measurement]) -> str:
    lines = [
        "| grid | tokens | pass | candidate | median ms | speedup vs SDPA (median [q1, q3]) "
        "| peak MiB | peak / SDPA | footprint / SDPA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in results:
        if m.note:
            lines.append(f"| {m.grid} | {m.tokens} | {m.pass_} | {m.candidate} | - | {m.note} | - | - | - |")
            continue
        picked = f" ({m.extra['picked']})" if "picked" in m.extra else ""
        lines.append(
            f"| {m.grid} | {m.tokens} | {m.pass_} | {m.candidate}{picked} | {m.median_ms:.2f} | "
            f"{m.speedup_median:.2f} [{m.speedup_q1:.2f}, {m.speedup_q3:.2f}] | {m.peak_mib:.1f} | {m.peak_ratio:.2f} "
            f"| {m.footprint_ratio:.2f} |"
        )
    return "\n".join(lines)


def plot_speedups(results: list[Measurement], path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no display or backend is touched

    passes = sorted({m.pass_ for m in results if not m.note}, key=len)
    figure = Figure(figsize=(5.5 * len(passes), 4))
    axes = figure.subplots(1, len(passes), squeeze=False)
    for axis, label in zip(axes[0], passes):
        for candidate in sorted({m.candidate for m in results if m.candidate != BASELINE and not m.note}):
            points = [m for m in results if m.pass_ == label and m.candidate == candidate]
            axis.errorbar(
                [m.grid for m in points],
                [m.speedup_median for m in points],
                yerr=_speedup_errors(points),
                marker="o", capsize=3, label=candidate,
            )
        axis.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        axis.set(xscale="log", yscale="log", xlabel="grid side (tokens)", ylabel="speedup over SDPA", title=label)
        grids = sorted({m.grid for m in results})
        axis.set_xticks(grids, [str(g) for g in grids])
        axis.minorticks_off()
        axis.legend()
    figure.tight_layout()
    save_figure(figure, path, dpi=120)


def save(results: list[Measurement], steered: dict | None, config: OperatorConfig, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": asdict(config),
        "environment": environment(torch.device(config.device), config.dtype),
        "results": [asdict(m) for m in results],
        "steered_memory": steered,
    }
    write_atomic(output / "operator.json", json.dumps(payload, indent=2, default=list))
    write_atomic(output / "operator.md", markdown_table(results) + "\n")
    plot_speedups(results, output / "operator_speedup.png")


#: Backends timed by the steered-layer comparison (``separable`` is never faster when steered;
#: ``cpp`` is timed where it can run).
STEERED_LAYER_BACKENDS = ("auto", "dense", "local", "cpp")


@dataclass
class SteeredLayerConfig:
    """One steered SSoG layer against one MHA layer, forward, at equal shapes.

    The SSoG layer steers ``steer`` with its gates open (``steer_gate_init = 8``, gate
    ``sigmoid(8) = 0.9997``), so centres move up to ``steer_radius`` tokens and widths
    vary per query: the case the windowed steered path is for.
    """

    grids: Sequence[int] = (32, 48)
    batch: int = 2
    dim: int = 384
    heads: int = 6
    atoms: int = 4
    steer: Sequence[str] = ("mu", "sigma")
    backends: Sequence[str] = STEERED_LAYER_BACKENDS
    device: str = "cpu"
    rounds: int = 10
    warmup: int = 2

    def __post_init__(self) -> None:
        _check_backends(self.backends)
        _check_sizes(self, ("batch", "dim", "heads", "atoms", "rounds"))


def run_steered_layer_benchmark(
    config: SteeredLayerConfig, progress: Callable[[str], None] = print
) -> list[dict[str, float | int | str]]:
    """Time the MHA layer and the steered SSoG layer (one per backend, same weights),
    interleaved, under ``torch.inference_mode``; one row per (grid, candidate) with the
    median over rounds of ``t_mha / t_candidate`` and its quartiles."""
    device = torch.device(config.device)
    torch.manual_seed(0)
    mha = MultiHeadAttention(config.dim, config.heads).to(device).eval()
    ssog = SSoGAttention(
        config.dim, config.heads, config.atoms, steer=tuple(config.steer), steer_gate_init=8.0
    ).to(device).eval()
    rows: list[dict[str, float | int | str]] = []
    for grid in config.grids:
        x = torch.randn(config.batch, 1 + grid * grid, config.dim, device=device)
        calls: dict[str, Callable[[], torch.Tensor]] = {"mha": _layer_call(mha, x, grid)}
        for backend in config.backends:
            if not can_time(backend, device, x.dtype, config.dim // config.heads, steered=True):
                continue
            calls[f"ssog-{backend}"] = _layer_call(ssog, x, grid, backend)
        with torch.inference_mode():
            stats = time_interleaved(calls, device=device, warmup=config.warmup, iters=config.rounds)
        base = stats["mha"].samples
        for name, stat in stats.items():
            q1, median, q3 = quartiles([b / t for b, t in zip(base, stat.samples)])
            rows.append({
                "grid": grid, "tokens": grid * grid, "candidate": name, "median_ms": 1e3 * stat.median,
                "speedup_median": median, "speedup_q1": q1, "speedup_q3": q3,
            })
        summary = ", ".join(f"{r['candidate']} {r['speedup_median']:.2f}x" for r in rows[-len(stats):][1:])
        progress(f"steered layer {grid}x{grid}: MHA {1e3 * stats['mha'].median:.1f} ms; {summary}")
    return rows


def _speedup_errors(points: list[Measurement]) -> list[list[float]]:
    """Error bars of measured speedups: the distances of the median to the lower and upper quartile."""
    below, above = [], []
    for m in points:
        assert m.speedup_median is not None and m.speedup_q1 is not None and m.speedup_q3 is not None
        below.append(m.speedup_median - m.speedup_q1)
        above.append(m.speedup_q3 - m.speedup_median)
    return [below, above]


def _layer_call(
    layer: torch.nn.Module, x: torch.Tensor, grid: int, backend: str | None = None
) -> Callable[[], torch.Tensor]:
    """``layer(x, (grid, grid))``, with ``layer.backend`` set to ``backend`` for the call."""

    def call() -> torch.Tensor:
        if backend is not None:
            layer.backend = backend  # type: ignore[assignment]  # torch types module attributes as tensors, modules
        return layer(x, (grid, grid))

    return call


def steered_layer_table(rows: list[dict[str, float | int | str]]) -> str:
    lines = ["| grid | tokens | candidate | median ms | speedup vs MHA (median [q1, q3]) |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['grid']} | {r['tokens']} | {r['candidate']} | {r['median_ms']:.2f} | "
        f"{r['speedup_median']:.2f} [{r['speedup_q1']:.2f}, {r['speedup_q3']:.2f}] |"
        for r in rows
    ]
    return "\n".join(lines)
