"""``ssog bench``: inference or training throughput and peak memory sweeps, and their plots."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ssog.bench.sweep import DTYPES, FAMILIES, MODES, PRESETS
from ssog.models import MIXER_NAMES

SUMMARY_NAME = "summary.md"
_OVERRIDES = (
    "families", "ops", "size", "resolutions", "batch_sizes", "width_sizes", "width_batch_size",
    "warmup", "iters", "device", "dtype", "mode", "compile",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="model throughput and peak memory vs resolution, batch size and width (Fig. 1, 4, 5)",
        description=(
            "Sweep family x op x resolution x batch size with randomly initialised models "
            "and write results.json, results.csv, summary.md and the figures (PNG and PDF); results.json and "
            "results.csv grow point by point, and an interrupted sweep (Ctrl-C) keeps its points and summary. "
            "Options override the chosen preset. The token mixer alone (Table 3) is 'ssog bench-op'."
        ),
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default",
                        help="'default': a CPU sweep, D=384, batch 1 and 2; 'cpu-targets': D=384, batch 4, "
                             "224 and 448 px; 'paper': the paper's GPU sweep")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, help="model families")
    parser.add_argument("--ops", nargs="+", choices=MIXER_NAMES, help="token mixers")
    parser.add_argument("--size", help="width preset of the resolution x batch grid: small, medium, base, "
                                       "or a CPU preset (tiny, micro)")
    parser.add_argument("--resolutions", nargs="+", type=int, metavar="PX", help="image sides in pixels")
    parser.add_argument("--batch-sizes", nargs="+", type=int, metavar="B")
    parser.add_argument("--width-sizes", nargs="*", metavar="SIZE",
                        help="widths of Fig. 1, measured at the largest resolution (none: the option alone; "
                             "with --size and without this option: none)")
    parser.add_argument("--width-batch-size", type=int, metavar="B", help="batch size of the width sweep")
    parser.add_argument("--warmup", type=int, help="untimed iterations per point")
    parser.add_argument("--iters", type=int, help="timed iterations per point")
    parser.add_argument("--device", help="auto (CUDA if available), cpu or cuda[:i]")
    parser.add_argument("--dtype", choices=DTYPES,
                        help="autocast dtype, parameters stay fp32; auto = fp16 on CUDA, fp32 on CPU")
    parser.add_argument("--mode", choices=MODES,
                        help="inference (default): forward passes; train: forward + backward + AdamW step, "
                             "images/s and peak memory of the whole step")
    parser.add_argument("--compile", action="store_true", default=None,
                        help="measure torch.compile'd models (compiled during the warm-up calls)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads before measuring")
    parser.add_argument("--output", type=Path, help="output directory (default runs/bench; with --plot, "
                                                     "the directory of RESULTS)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of an earlier sweep in --output (else refused, before measuring)")
    parser.add_argument("--no-plots", action="store_true", help="write results only")
    parser.add_argument("--error-bars", action="store_true",
                        help="draw each throughput point of the scaling figure with the quartiles of its timed "
                             "iterations as error bars")
    parser.add_argument("--plot", type=Path, metavar="RESULTS",
                        help="redraw the figures from a results.json (or its directory) instead of measuring")
    parser.set_defaults(func=run)


def _print_row(row: dict[str, Any]) -> None:
    where = " ".join(f"{key}={row[key]}" for key in ("family", "op", "size", "resolution", "batch_size") if key in row)
    if row["status"] != "ok":
        print(f"{where}: {row['status']}", flush=True)
        return
    print(f"{where}: {row['images_per_s']:.2f} img/s, {row['peak_memory_mib']:.1f} MiB", flush=True)


def _summarise_interrupted(output: Path, planned: int) -> None:
    """Write ``summary.md`` of the points an interrupted sweep left in ``output``, saying so there and on stderr."""
    from ssog.bench.report import comparison_table, paired_points
    from ssog.bench.results import BenchResults
    from ssog.files import write_atomic

    results = BenchResults.load(output)
    note = (f"Interrupted after {len(paired_points(results.rows))} of {planned} points: summary.md, results.json "
            f"(complete: false) and results.csv hold those measured; 'ssog bench --plot {output}' draws them.")
    write_atomic(output / SUMMARY_NAME, f"{note}\n\n{comparison_table(results.rows)}")
    print(f"ssog bench: {note}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    import torch

    from ssog.bench.report import comparison_table
    from ssog.bench.results import CSV_NAME, FIGURES, JSON_NAME, BenchResults
    from ssog.bench.sweep import planned_points, run_model_sweep
    from ssog.files import clear_results, write_atomic
    from ssog.runtime import check_plotting, cpu_threads

    if not args.no_plots or args.plot is not None:
        check_plotting("ssog bench (without --no-plots)")
        from ssog.bench.plots import plot_results
    if args.plot is not None:  # figures are derived from the results: redrawn in place
        results = BenchResults.load(args.plot)
        output = args.output or (args.plot if args.plot.is_dir() else args.plot.parent)
        for path in plot_results(results, output, args.error_bars):
            print(path)
        return 0

    overrides = {key: getattr(args, key) for key in _OVERRIDES if getattr(args, key) is not None}
    if "size" in overrides and "width_sizes" not in overrides:
        # --size chooses the models of the whole sweep: the preset's width sweep (Fig. 1, other
        # widths) would build models the user did not ask for; --width-sizes adds it back.
        overrides["width_sizes"] = ()
    changes: dict[str, Any] = {
        key: tuple(value) if isinstance(value, list) else value for key, value in overrides.items()
    }
    config = replace(PRESETS[args.preset], **changes)
    config.validate()
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(cpu_threads(args.threads, "--threads"))
    output = args.output or Path("runs/bench")
    figures = [f"{stem}.{ext}" for stem in FIGURES for ext in ("png", "pdf")]
    clear_results(output, [JSON_NAME, CSV_NAME, SUMMARY_NAME, *figures], overwrite=args.overwrite, what="ssog bench")

    try:
        results = run_model_sweep(config, on_row=_print_row, output=output)
    except KeyboardInterrupt:
        if (output / JSON_NAME).is_file():  # the sweep wrote each point as it came
            _summarise_interrupted(output, planned_points(config))
        raise
    paths = [output / JSON_NAME, output / CSV_NAME]
    table = comparison_table(results.rows)
    paths.append(write_atomic(output / SUMMARY_NAME, table))
    print(table)
    if not args.no_plots:
        paths += plot_results(results, output, args.error_bars)
    for path in paths:
        print(path)
    return 0
