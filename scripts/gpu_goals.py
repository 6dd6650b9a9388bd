"""The GPU goals of the fused path (issue 56), measured and set against their targets: the
goal phase of scripts/gpu_check.sh.

    python scripts/gpu_goals.py operator OUTPUT_DIR [--device cuda] [--grids 14 32 64] [--rounds 20]
    python scripts/gpu_goals.py report OUTPUT_DIR

``operator``: SSoG (``ssog_mix``, ``auto``: the registered ops) against fused attention
(``F.scaled_dot_product_attention``) at fp16, batch 4, 12 heads, head_dim 64, 4 atoms, per grid:
forward and forward+backward, eager (interleaved rounds, median) and replayed from a CUDA
graph, kernels per call (the profiler's CUDA kernels on a GPU; ``ssog.bench.dispatch``'s
count on a CPU), peak memory of forward+backward; then one layer's training step under
``torch.compile(fullgraph=True, mode="reduce-overhead")`` (CUDA graphs) against eager. Writes
``OUTPUT_DIR/operator_goals.json``.

``report``: that file and the model sweeps ``ssog bench`` wrote into
``OUTPUT_DIR/goals_inference`` and ``OUTPUT_DIR/goals_train`` (D=768, batch 32, fp16, 224, 512
and 1024 px, the three families), each goal with its figure and whether it holds, as
``OUTPUT_DIR/goals.md`` (also printed).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ssog.bench.dispatch import count_dispatches
from ssog.bench.timing import time_interleaved
from ssog.files import write_atomic
from ssog.measure import peak_memory
from ssog.ops import ssog_mix

BATCH, HEADS, HEAD_DIM, ATOMS = 4, 12, 64, 4
#: Op: SSoG's speed over SDPA's at least this, per grid side (forward and forward+backward).
OP_SPEEDUP = {14: 1.0, 32: 3.0, 64: 10.0}
#: Op: forward+backward peak memory at most this fraction of SDPA's.
OP_MEMORY = 0.6
#: Models: inference images/s over MHA's at least this, per resolution.
INFERENCE_SPEEDUP = {224: 1.1, 512: 1.3, 1024: 1.8}
#: Models: training step images/s over MHA's at least this, per resolution.
TRAINING_SPEEDUP = {224: 1.1, 1024: 1.9}
#: Models: training peak memory at most this fraction of MHA's.
TRAINING_MEMORY = 0.9


def operator_calls(grid: int, device: torch.device, dtype: torch.dtype) -> dict[str, dict[str, Callable[[], Any]]]:
    """Per pass (``forward``, ``forward+backward``), the calls of SDPA and SSoG on one grid."""
    n = grid * grid
    generator = torch.Generator().manual_seed(grid)

    def tensor(*shape: int, grad: bool = False, value_dtype: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device, value_dtype).requires_grad_(grad)

    q, k, v = (tensor(BATCH, HEADS, n, HEAD_DIM, grad=True) for _ in range(3))
    values = tensor(BATCH, HEADS, n, HEAD_DIM, grad=True)
    mu = tensor(HEADS, ATOMS, 2, grad=True, value_dtype=torch.float32)
    sigma = (tensor(HEADS, ATOMS, 2, value_dtype=torch.float32).abs() + 1.0).requires_grad_()
    weight = tensor(HEADS, ATOMS, value_dtype=torch.float32).softmax(-1).detach().requires_grad_()
    probe = tensor(BATCH, HEADS, n, HEAD_DIM)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)

    def ssog() -> torch.Tensor:
        return ssog_mix(values, mu, sigma, weight, (grid, grid))

    def with_backward(call: Callable[[], torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
        return lambda: torch.autograd.grad(call(), inputs, probe)

    return {
        "forward": {"sdpa": sdpa, "ssog": ssog},
        "forward+backward": {"sdpa": with_backward(sdpa, (q, k, v)),
                             "ssog": with_backward(ssog, (values, mu, sigma, weight))},
    }


def replayed(call: Callable[[], Any], device: torch.device) -> Callable[[], Any] | None:
    """``call`` captured once into a CUDA graph and replayed (``None`` off CUDA): what a step
    costs without the host's dispatch."""
    if device.type != "cuda":
        return None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up on a side stream, as torch.cuda.graphs asks
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def kernels_per_call(call: Callable[[], Any], device: torch.device) -> int:
    """CUDA kernels one call launches (the profiler's), or on a CPU what it would dispatch."""
    if device.type != "cuda":
        return count_dispatches(call)[1].kernels
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        call()
        torch.cuda.synchronize(device)
    return sum(1 for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def compiled_layer(grid: int, device: torch.device, dtype: torch.dtype, backend: str, mode: str | None,
                   rounds: int) -> dict[str, Any]:
    """A training step (forward and backward) of one ``SSoGAttention`` (D=768, 12 heads, a class
    token) under ``torch.compile(fullgraph=True)`` with ``mode`` (``reduce-overhead``: CUDA graphs)
    against eager: whether it compiles and runs, and the median step time of each."""
    from ssog.layers import SSoGAttention

    layer = SSoGAttention(HEADS * HEAD_DIM, HEADS).to(device, dtype)
    x = torch.randn(BATCH, 1 + grid * grid, HEADS * HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend=backend, mode=mode)

    def step(module: Callable[..., torch.Tensor]) -> Callable[[], Any]:
        return lambda: module(x, (grid, grid)).sum().backward()

    result: dict[str, Any] = {"grid": grid, "backend": backend, "mode": mode}
    try:
        for _ in range(3):  # compiles, then records and replays its graphs
            step(compiled)()
        times = time_interleaved({"eager": step(layer), "compiled": step(compiled)}, device=device, warmup=1,
                                 iters=rounds)
    except Exception as error:  # noqa: BLE001  (what failed is the result)
        return {**result, "works": False, "error": f"{type(error).__name__}: {error}"[:500]}
    return {**result, "works": True, **{f"{name}_ms": stats.median * 1e3 for name, stats in times.items()}}


def measure_operator(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    rows = []
    for grid in args.grids:
        for pass_, calls in operator_calls(grid, device, dtype).items():
            candidates = dict(calls)
            for name, call in calls.items():
                graph = replayed(call, device)
                if graph is not None:
                    candidates[f"{name} (graph)"] = graph
            times = time_interleaved(candidates, device=device, warmup=args.warmup, iters=args.rounds)
            row: dict[str, Any] = {"grid": grid, "pass": pass_, "dtype": str(dtype).removeprefix("torch."),
                                   "ms": {name: stats.median * 1e3 for name, stats in times.items()},
                                   "kernels": {name: kernels_per_call(call, device) for name, call in calls.items()}}
            if pass_ == "forward+backward":
                row["peak_bytes"] = {name: peak_memory(call, device=device) for name, call in calls.items()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    compile_check = compiled_layer(min(args.grids), device, dtype, args.compile_backend, args.compile_mode,
                                   args.rounds)
    print(json.dumps(compile_check), flush=True)
    payload = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "shape": {"batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM, "atoms": ATOMS}, "rows": rows,
               "compile": compile_check}
    write_atomic(args.output / "operator_goals.json", json.dumps(payload, indent=2) + "\n")
    return payload


def _verdict(value: float, target: float, at_least: bool) -> str:
    held = value >= target if at_least else value <= target
    return f"{value:.2f}x ({'met' if held else 'not met'}, {'>=' if at_least else '<='} {target}x)"


def operator_lines(payload: dict[str, Any]) -> list[str]:
    lines = [f"## The operator ({payload['device']}; batch {BATCH}, {HEADS} heads, head_dim {HEAD_DIM}, "
             f"{ATOMS} atoms)", "",
             "| grid | pass | SDPA ms | SSoG ms | SSoG over SDPA, eager | graph-replayed | kernels SDPA / SSoG "
             "| peak memory SSoG / SDPA |", "|---|---|---|---|---|---|---|---|"]
    for row in payload["rows"]:
        ms, target = row["ms"], OP_SPEEDUP.get(row["grid"])
        eager = ms["sdpa"] / ms["ssog"]
        eager_text = _verdict(eager, target, True) if target else f"{eager:.2f}x"
        graph = (f"{ms['sdpa (graph)'] / ms['ssog (graph)']:.2f}x" if "ssog (graph)" in ms else "n/a (no CUDA)")
        memory = ""
        if "peak_bytes" in row:
            memory = _verdict(row["peak_bytes"]["ssog"] / row["peak_bytes"]["sdpa"], OP_MEMORY, False)
        lines.append(f"| {row['grid']} | {row['pass']} | {ms['sdpa']:.3f} | {ms['ssog']:.3f} | {eager_text} | {graph} "
                     f"| {row['kernels']['sdpa']} / {row['kernels']['ssog']} | {memory} |")
    check = payload["compile"]
    how = f"torch.compile(fullgraph=True, backend={check['backend']!r}, mode={check['mode']!r})"
    if check["works"]:
        lines += ["", f"A training step of one layer at {check['grid']}x{check['grid']} under {how}: works, "
                      f"{check['compiled_ms']:.3f} ms against {check['eager_ms']:.3f} ms eager."]
    else:
        lines += ["", f"A training step of one layer at {check['grid']}x{check['grid']} under {how}: "
                      f"**fails**: {check['error']}"]
    return lines


def model_lines(folder: Path, mode: str) -> list[str]:
    path = folder / "results.json"
    if not path.is_file():
        return [f"## Models, {mode}: no results ({path} missing)"]
    results = json.loads(path.read_text())
    config, rows = results["config"], results["rows"]
    points = {(r["family"], r["resolution"], r["op"]): r for r in rows if r.get("status") == "ok"}
    speedups = INFERENCE_SPEEDUP if mode == "inference" else TRAINING_SPEEDUP
    lines = [f"## Models, {mode} ({config['size']}, batch {', '.join(map(str, config['batch_sizes']))}, "
             f"{config['dtype']}, {config['device']})", "",
             "| family | px | MHA images/s | SSoG images/s | SSoG over MHA | peak memory SSoG / MHA |",
             "|---|---|---|---|---|---|"]
    for family, resolution in sorted({key[:2] for key in points}):
        mha, ssog = points.get((family, resolution, "mha")), points.get((family, resolution, "ssog"))
        if mha is None or ssog is None:
            lines.append(f"| {family} | {resolution} | missing | | | |")
            continue
        speed = ssog["images_per_s"] / mha["images_per_s"]
        target = speedups.get(resolution)
        speed_text = _verdict(speed, target, True) if target else f"{speed:.2f}x"
        memory = ssog["peak_memory_mib"] / mha["peak_memory_mib"]
        memory_text = _verdict(memory, TRAINING_MEMORY, False) if mode == "train" else f"{memory:.2f}x"
        lines.append(f"| {family} | {resolution} | {mha['images_per_s']:.1f} | {ssog['images_per_s']:.1f} | "
                     f"{speed_text} | {memory_text} |")
    return lines


def report(output: Path) -> str:
    lines = [f"# The fused path's GPU goals: {output}", ""]
    operator = output / "operator_goals.json"
    lines += operator_lines(json.loads(operator.read_text())) if operator.is_file() else [
        f"## The operator: no results ({operator} missing)"]
    for mode in ("inference", "train"):
        lines += [""] + model_lines(output / f"goals_{mode}", mode)
    text = "\n".join(lines) + "\n"
    write_atomic(output / "goals.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("operator", help="measure the operator's goals")
    measure.add_argument("output", type=Path)
    measure.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    measure.add_argument("--grids", type=int, nargs="+", default=sorted(OP_SPEEDUP))
    measure.add_argument("--rounds", type=int, default=20)
    measure.add_argument("--warmup", type=int, default=3)
    measure.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the layer check")
    measure.add_argument("--compile-mode", default="reduce-overhead",
                         help="torch.compile mode of the layer check ('none': the backend's default)")
    summary = commands.add_parser("report", help="write goals.md from the measurements")
    summary.add_argument("output", type=Path)
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    if args.command == "operator":
        args.compile_mode = None if args.compile_mode == "none" else args.compile_mode
        measure_operator(args)
    else:
        print(report(args.output), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
