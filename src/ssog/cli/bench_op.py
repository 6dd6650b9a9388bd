"""``ssog bench-op``: the SSoG operator (each backend) against fused SDPA."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from ..bench.operator import (
    COMPILABLE,
    OperatorConfig,
    SteeredLayerConfig,
    markdown_table,
    run_operator_benchmark,
    run_steered_layer_benchmark,
    save,
    steered_layer_table,
    steered_memory,
    unavailable_backends,
)
from ..files import clear_results, write_atomic
from ..ops import BACKEND_NAMES
from ..runtime import DTYPES, check_plotting


def register(subparsers: argparse._SubParsersAction) -> None:
    defaults = OperatorConfig()
    parser = subparsers.add_parser(
        "bench-op",
        help="time ssog_mix backends against SDPA over grid sizes",
        description="Time ssog_mix (each backend and auto) against scaled_dot_product_attention at equal "
        "batch, heads, head_dim and tokens, interleaved, and report median speedups, their quartiles and "
        "peak memory.",
    )
    parser.add_argument("--grids", type=int, nargs="+", default=list(defaults.grids), help="grid sides (tokens)")
    parser.add_argument("--batch", type=int, help=f"batch size (default {defaults.batch}; 2 with --steered-layer)")
    parser.add_argument("--heads", type=int, default=defaults.heads)
    parser.add_argument("--head-dim", type=int, default=defaults.head_dim)
    parser.add_argument("--atoms", type=int, default=defaults.atoms)
    parser.add_argument("--dtype", default=defaults.dtype, choices=list(DTYPES))
    parser.add_argument("--device", default=defaults.device, help="cpu or cuda[:i]")
    parser.add_argument("--backends", nargs="+", choices=BACKEND_NAMES,
                        help="backends to time (default: every one that can run on --device; one given here "
                             "that cannot is an error)")
    parser.add_argument("--compile", nargs="+", default=[], choices=COMPILABLE, metavar="BACKEND",
                        help=f"also time these backends ({', '.join(COMPILABLE)}) under torch.compile(fullgraph=True), "
                             "as a compiled model mixes (compiled before the timed rounds)")
    parser.add_argument("--forward-only", action="store_true", help="skip the forward+backward pass")
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="measured rounds per point")
    parser.add_argument("--warmup", type=int, default=defaults.warmup, help="untimed rounds per point")
    parser.add_argument("--dense-max-grid", type=int, default=defaults.dense_max_grid,
                        help="skip the dense backend above this grid side")
    parser.add_argument("--steered-grid", type=int, default=64,
                        help="grid side of the steered (mu only) memory check; 0 skips it")
    parser.add_argument("--output", type=Path, default=Path("runs/bench-op"),
                        help="folder for JSON, table and plot (earlier results there are refused unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace the earlier results in --output")
    parser.add_argument("--steered-layer", type=int, nargs="+", metavar="GRID",
                        help="instead: time one steered SSoG layer (mu+sigma, gates open; backends auto, dense, "
                             "local) against one MHA layer, forward, at these grid sides; uses --batch (default "
                             "here 2), --rounds, --warmup, --device; D=384, 6 heads")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.steered_layer:
        return _run_steered_layer(args)
    config = OperatorConfig(
        grids=args.grids, batch=OperatorConfig.batch if args.batch is None else args.batch,
        heads=args.heads, head_dim=args.head_dim, atoms=args.atoms,
        dtype=args.dtype, device=args.device, backends=args.backends or BACKEND_NAMES, backward=not args.forward_only,
        rounds=args.rounds, warmup=args.warmup, dense_max_grid=args.dense_max_grid, compiled=args.compile,
    )
    unavailable = unavailable_backends(config)
    if unavailable and args.backends:
        raise ValueError("; ".join(f"--backends {name} cannot run here: {why}" for name, why in unavailable.items()))
    if unavailable:
        config.backends = [name for name in config.backends if name not in unavailable]
        for name, why in unavailable.items():
            print(f"note: not timing {name}: {why}")
    check_plotting("ssog bench-op")
    if "cpp" in config.backends and config.backward:
        print("note: cpp computes forward only: it is timed in the forward pass")
    clear_results(args.output, ["operator.json", "operator.md", "operator_speedup.png"], overwrite=args.overwrite,
                  what="ssog bench-op")
    results = run_operator_benchmark(config)
    steered = steered_memory(config, grid=args.steered_grid) if args.steered_grid else None
    save(results, steered, config, args.output)
    print(markdown_table(results))
    if steered:
        print(
            f"steered (mu) at {steered['grid']}x{steered['grid']}: forward peak {steered['forward_peak_mib']:.0f} MiB, "
            f"forward+backward peak {steered['forward_backward_peak_mib']:.0f} MiB"
        )
    print(f"wrote {args.output}/operator.json, operator.md, operator_speedup.png")
    return 0


def _run_steered_layer(args: argparse.Namespace) -> int:
    import torch

    from ..bench.results import environment

    config = SteeredLayerConfig(
        grids=args.steered_layer, batch=SteeredLayerConfig.batch if args.batch is None else args.batch,
        device=args.device, rounds=args.rounds, warmup=args.warmup,
    )
    clear_results(args.output, ["steered_layer.json", "steered_layer.md"], overwrite=args.overwrite,
                  what="ssog bench-op --steered-layer")
    rows = run_steered_layer_benchmark(config)
    args.output.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": asdict(config),
        "environment": environment(torch.device(config.device), "float32"),
        "rows": rows,
    }
    write_atomic(args.output / "steered_layer.json", json.dumps(payload, indent=2, default=list))
    table = steered_layer_table(rows)
    write_atomic(args.output / "steered_layer.md", table + "\n")
    print(table)
    print(f"wrote {args.output}/steered_layer.json, steered_layer.md")
    return 0
