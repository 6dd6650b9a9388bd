"""``ssog train``: train a model from defaults, a recipe, and command-line overrides (the
options are :data:`ssog.cli.train_options.TRAIN_FLAGS`, timm's train.py flags among them)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ssog.cli.train_options import add_options, fill_fallbacks, option_settings, unknown_option_hint

__all__ = ["register", "run", "unknown_option_hint"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model (default: a small SSoG ViT on the embedded digits)",
        description="Train a model. Settings: defaults <- --config FILE (with --variant) <- options "
                    "<- --set KEY=VALUE. With no options: a small SSoG ViT on the embedded digits. timm's "
                    "train.py flags set the same settings (docs/training.md, \"timm's flags\").",
    )
    parser.add_argument("--config", help="YAML recipe (see configs/)")
    parser.add_argument("--variant", help="variant of the recipe to run (e.g. one row of an ablation)")
    parser.add_argument("--list-variants", action="store_true", help="print the recipe's variants and exit")
    parser.add_argument("--output", "-o",
                        help="run folder (default: runs/<recipe>/<variant> for a recipe, else runs/<timestamp>-<hex>); "
                             "a folder holding another run is refused unless --overwrite; with --experiment: the "
                             "folder the run's folder is made in")
    parser.add_argument("--experiment", metavar="NAME",
                        help="name the run folder OUTPUT/NAME (default OUTPUT: runs), as timm's --experiment")
    parser.add_argument("--resume", metavar="DIR",
                        help="continue the run in DIR from its last checkpoint; only --no-progress, --threads, "
                             "--device, --num-workers and (no longer bit-identical) --lr, --epochs may change. "
                             "--resume auto: resume the run in --output if it saved a checkpoint (with the same "
                             "settings), else start it: one command for a job's start and its requeues")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config field, e.g. --set model_kwargs.depth=6 (repeatable)")
    add_options(parser)
    parser.add_argument("--dry-run", nargs="?", type=int, const=3, default=None, metavar="STEPS",
                        help="build everything, time STEPS optimizer steps (default 3) at the recipe's batch and "
                             "the data loader alone, print parameters, GFLOPs, step time, images/s, peak memory "
                             "and the projected time per epoch and for the schedule; writes nothing")
    parser.add_argument("--dry-run-report", metavar="FILE",
                        help="with --dry-run: also write the report as JSON (an existing FILE is refused unless "
                             "--overwrite)")
    parser.add_argument("--nproc", type=int, default=1, metavar="N",
                        help="with --dry-run: project for N processes (devices) per machine: the step at the "
                             "per-device batch, the epoch at the global one, and the torchrun line to launch it")
    parser.add_argument("--nnodes", type=int, default=1, metavar="M", help="with --dry-run: on M machines")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ssog.train import TrainingInterrupted, parse_override, recipe_variants, resolve_config, train

    if args.list_variants:
        if not args.config:
            raise ValueError("--list-variants needs --config")
        print("\n".join(recipe_variants(args.config)) or f"{args.config} has no variants")
        return 0
    overrides, fallbacks = option_settings(args)
    output = _output(args)
    if output is not None:
        overrides.append(("output", output))
    settings = [parse_override(text) for text in args.set]
    overrides += settings
    # --set beats the flags: --model-ema --set ema_decay=null keeps no EMA
    fallbacks = [(key, value) for key, value in fallbacks if key not in {k for k, _ in settings}]
    if args.dry_run is not None or args.dry_run_report or args.nproc != 1 or args.nnodes != 1:
        return _dry_run(args, overrides, fallbacks)
    try:
        if args.resume == "auto":
            train(fill_fallbacks(resolve_config(args.config, args.variant, overrides), fallbacks), resume="auto")
        elif args.resume:
            if args.config or args.variant:
                raise ValueError("--resume DIR continues a run with its saved configuration; give no --config")
            train(resume=args.resume, resume_changes=dict(overrides + fallbacks))
        else:
            train(fill_fallbacks(resolve_config(args.config, args.variant, overrides), fallbacks))
    except TrainingInterrupted as stop:
        print(f"ssog train: {stop}", file=sys.stderr)
        return 128 + stop.signum
    return 0


#: The options of a dry run alone (with the number of values each takes, "?" for --dry-run's
#: optional one): what the launch line of the measured run leaves out.
_DRY_RUN_OPTIONS = {"--dry-run": "?", "--dry-run-report": 1, "--nproc": 1, "--nnodes": 1}


def _run_args(argv: list[str]) -> list[str]:
    """``ssog train``'s arguments ``argv`` (from ``train`` on) without the dry run's options."""
    argv = argv[1:] if argv[:1] == ["train"] else list(argv)
    kept, skip = [], 0
    for index, arg in enumerate(argv):
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name not in _DRY_RUN_OPTIONS:
            kept.append(arg)
        elif "=" not in arg:
            count = _DRY_RUN_OPTIONS[name]
            optional_next = index + 1 < len(argv) and argv[index + 1].isdigit()
            skip = 1 if count == 1 or (count == "?" and optional_next) else 0
    return kept


def _output(args: argparse.Namespace) -> str | None:
    """The run folder the command line names: ``--output``, or with ``--experiment NAME``
    ``OUTPUT/NAME`` (``runs/NAME`` without ``--output``), as timm's train.py makes it."""
    if args.experiment is None:
        return args.output
    name = Path(args.experiment)
    if not args.experiment or name.is_absolute() or ".." in name.parts:
        raise ValueError(f"--experiment names a folder inside --output, got {args.experiment!r}")
    return str(Path(args.output or "runs") / name)


def _dry_run(args: argparse.Namespace, overrides: list, fallbacks: list) -> int:
    from ssog.files import check_output_file, write_atomic
    from ssog.train import resolve_config
    from ssog.train.dry_run import dry_run, format_dry_run, torchrun_line
    from ssog.train.run_folder import check_output, refuse_run_file

    if args.dry_run is None:
        raise ValueError("--dry-run-report FILE, --nproc and --nnodes go with --dry-run")
    if args.resume:
        raise ValueError("--dry-run measures a new run's recipe; --resume continues a run: give one")
    cfg = fill_fallbacks(resolve_config(args.config, args.variant, overrides), fallbacks)
    if args.dry_run_report is not None:  # before the measurement, not after it
        if not args.dry_run_report.strip():
            raise ValueError("--dry-run-report is empty: give the JSON file to write the report to")
        refuse_run_file(args.dry_run_report, "--dry-run-report", reading=[args.config] if args.config else [])
        check_output_file(args.dry_run_report, "--dry-run-report", cfg.overwrite)
    report = dry_run(cfg, steps=args.dry_run, nproc=args.nproc, nnodes=args.nnodes)
    if args.nproc * args.nnodes > 1:
        report["launch"] = torchrun_line(_run_args(getattr(args, "argv", [])), args.nproc, args.nnodes)
    print(format_dry_run(report))
    if cfg.output:  # what the real run would refuse at its start, said by the dry run already
        try:
            check_output(Path(cfg.output), resuming=False, overwrite=cfg.overwrite, config_fields=cfg.field_names())
        except ValueError as error:
            print(f"note: the run itself would stop before training: {error}")
    if args.dry_run_report:
        write_atomic(Path(args.dry_run_report), json.dumps(report, indent=2) + "\n", overwrite=cfg.overwrite)
    return 0
