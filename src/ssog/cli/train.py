"""``ssog train``: train a model from defaults, a recipe, and command-line overrides."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _number(text: str) -> float | int:
    return float(text) if any(c in text for c in ".eE") else int(text)


def _split(text: str) -> float | int | str:
    """A fraction or count, or a split's name."""
    try:
        return _number(text)
    except ValueError:
        return text


# (option, config field, type (None: int or float), help); each overrides the recipe when given
_OPTIONS: list[tuple[str, str, type | None, str]] = [
    ("--model", "model", str, "timm model name (default: the digits preset)"),
    ("--dataset", "dataset", str, "digits | cifar10 | cifar100 | imagefolder | synthetic, or a timm data source: "
                                  "hfds/NAME, hfids/NAME, wds/NAME, tfds/NAME, torch/NAME"),
    ("--data-dir", "data_dir", str, "data folder (CIFAR root, ImageFolder root with train/ and val/ or validation/, "
                                    "WebDataset shard folder, Hugging Face cache folder)"),
    ("--val-split", "val_split", _split, "split this fraction (<1) or count off the training set for validation, or "
                                         "name the validation split of a timm source (default: validation)"),
    ("--train-subset", "train_subset", int, "train on a seeded, stratified subset of N training images"),
    ("--img-size", "img_size", int, "input size in pixels (default: the model's pretrained_cfg, e.g. 32 for "
                                    "*_tiny_patch4_32, 224 for *_patch16_224; so are mean, std, crop_pct, "
                                    "interpolation, each settable with --set)"),
    ("--augment", "augment", str, "augmentation level: strong | moderate | weak | none (Table 15)"),
    ("--epochs", "epochs", int, "training epochs"),
    ("--max-steps", "max_steps", int, "stop after N optimizer steps (evaluated, saved and summarised there); the "
                                      "schedule keeps its epochs: a quick check of a recipe's whole pipeline"),
    ("--batch-size", "batch_size", int, "global batch size (split over processes)"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay"),
    ("--warmup-epochs", "warmup_epochs", float, "linear warmup length in epochs"),
    ("--drop-path", "drop_path", float, "stochastic depth rate"),
    ("--ema-decay", "ema_decay", float, "keep an EMA of the weights with this decay"),
    ("--amp", "amp", str, "mixed precision: none | bf16 | fp16"),
    ("--num-workers", "num_workers", int, "data-loading worker processes per training process"),
    ("--seed", "seed", int, "random seed"),
    ("--device", "device", str, "auto | cpu | cuda"),
    ("--threads", "threads", int, "intra-op threads of a CPU run (default 1)"),
    ("--checkpoint-every", "checkpoint_every", int, "also save last.safetensors every N optimizer steps"),
    ("--init-from", "init_from", str, "start from this checkpoint's (or run folder's best) backbone, with a new "
                                      "head, its attention converted where the model is SSoG; or timm:NAME, "
                                      "timm's ViT NAME converted to SSoG (ssog.convert; "
                                      "pretrained where a hub is reachable), the run's model then being NAME"),
    ("--wandb-project", "wandb_project", str, "log to this Weights & Biases project"),
]
_FLAGS: list[tuple[str, str, str]] = [
    ("--download", "download", "download CIFAR where a network is available"),
    ("--skip-bad-images", "skip_bad_images",
     "leave out ImageFolder files that cannot be read, warning for each (default: refuse them)"),
    ("--deterministic", "deterministic", "deterministic algorithms (exactly reproducible on CPU)"),
    ("--linear-probe", "linear_probe", "train only the classifier on a frozen backbone"),
    ("--tensorboard", "tensorboard", "also log to TensorBoard (OUTPUT/tensorboard)"),
    ("--compile", "compile", "train through torch.compile (first steps slower while it compiles)"),
    ("--overwrite", "overwrite", "replace the files of an earlier run in --output (only those: config.yaml, "
                                 "checkpoints, logs, curves, summary)"),
]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model (default: a small SSoG ViT on the embedded digits)",
        description="Train a model. Settings: defaults <- --config FILE (with --variant) <- options "
                    "<- --set KEY=VALUE. With no options: a small SSoG ViT on scikit-learn's digits.",
    )
    parser.add_argument("--config", help="YAML recipe (see configs/)")
    parser.add_argument("--variant", help="variant of the recipe to run (e.g. one row of an ablation)")
    parser.add_argument("--list-variants", action="store_true", help="print the recipe's variants and exit")
    parser.add_argument("--output", "-o",
                        help="run folder (default: runs/<recipe>/<variant> for a recipe, else runs/<timestamp>-<hex>); "
                             "a folder holding another run is refused unless --overwrite")
    parser.add_argument("--resume", metavar="DIR",
                        help="continue the run in DIR from its last checkpoint; only --no-progress, --threads, "
                             "--device, --num-workers and (no longer bit-identical) --lr, --epochs may change")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config field, e.g. --set model_kwargs.depth=6 (repeatable)")
    for flag, _, kind, text in _OPTIONS:
        parser.add_argument(flag, type=kind or _number, default=None, help=text)
    for flag, _, text in _FLAGS:
        parser.add_argument(flag, action="store_true", default=None, help=text)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--dry-run", nargs="?", type=int, const=3, default=None, metavar="STEPS",
                        help="build everything, time STEPS optimizer steps (default 3) at the recipe's batch and "
                             "the data loader alone, print parameters, GFLOPs, step time, images/s, peak memory "
                             "and the projected time per epoch and for the schedule; writes nothing")
    parser.add_argument("--dry-run-report", metavar="FILE", help="with --dry-run: also write the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ssog.train import TrainingInterrupted, parse_override, recipe_variants, resolve_config, train

    if args.list_variants:
        if not args.config:
            raise ValueError("--list-variants needs --config")
        print("\n".join(recipe_variants(args.config)) or f"{args.config} has no variants")
        return 0
    overrides = [(field, getattr(args, field)) for _, field, *_ in _OPTIONS + _FLAGS
                 if getattr(args, field) is not None]
    if args.output is not None:
        overrides.append(("output", args.output))
    if args.no_progress:
        overrides.append(("progress", False))
    overrides += [parse_override(text) for text in args.set]
    if args.dry_run is not None or args.dry_run_report:
        return _dry_run(args, overrides)
    try:
        if args.resume:
            if args.config or args.variant:
                raise ValueError("--resume DIR continues a run with its saved configuration; give no --config")
            train(resume=args.resume, resume_changes=dict(overrides))
        else:
            train(resolve_config(args.config, args.variant, overrides))
    except TrainingInterrupted as stop:
        print(f"ssog train: {stop}", file=sys.stderr)
        return 128 + stop.signum
    return 0


def _dry_run(args: argparse.Namespace, overrides: list) -> int:
    from ssog.files import write_atomic
    from ssog.train import resolve_config
    from ssog.train.dry_run import dry_run, format_dry_run

    if args.dry_run is None:
        raise ValueError("--dry-run-report FILE goes with --dry-run")
    if args.resume:
        raise ValueError("--dry-run measures a new run's recipe; --resume continues a run: give one")
    report = dry_run(resolve_config(args.config, args.variant, overrides), steps=args.dry_run)
    print(format_dry_run(report))
    if args.dry_run_report:
        write_atomic(Path(args.dry_run_report), json.dumps(report, indent=2) + "\n")
    return 0
