"""``ssog analyze sinks|lipschitz|kernels|steering|field``: diagnostics of trained or random models."""
from __future__ import annotations

import argparse
from pathlib import Path

from ssog.cli.train_options import parse_split


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", action="append", default=[], metavar="PATH",
                        help="a checkpoint written by ssog train, or its run folder (its best), or a released "
                             "model (a folder with config.json and model.safetensors, local-dir:FOLDER, "
                             "hf-hub:USER/REPO); repeatable")
    parser.add_argument("--model", action="append", default=[], metavar="NAME",
                        help="a registered model, randomly initialised; repeatable")
    parser.add_argument("--ema", action="store_true", help="use the checkpoints' EMA weights")
    parser.add_argument("--seed", type=int, default=0, help="seed of random models, noise images, power iteration")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    parser.add_argument("--output", type=Path, default=Path("runs/analysis"),
                        help="folder for the JSON results and figures (default runs/analysis); earlier results "
                             "of the same analysis there are refused unless --overwrite")
    parser.add_argument("--overwrite", action="store_true", help="replace the earlier results in --output")


def _data(parser: argparse.ArgumentParser, num_images: int) -> None:
    parser.add_argument("--data", help="noise, or a data set (digits, cifar10, cifar100, imagefolder, synthetic); "
                                       "default: the checkpoint's own, noise for random models")
    parser.add_argument("--data-dir", help="data folder of --data (default: the checkpoint's)")
    parser.add_argument("--val-split", type=parse_split,
                        help="the validation images: this count or fraction split off the training set, as ssog "
                             "train's --val-split (default: the checkpoint's; a released model's run's held-out "
                             "images need it)")
    parser.add_argument("--split-seed", type=int, help="seed of --val-split's stratified split (default: the "
                                                       "checkpoint's, else 0)")
    parser.add_argument("--num-images", type=_positive_int, default=num_images,
                        help=f"validation images to use (default {num_images})")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="attention sinks (Table 5), Lipschitz constants, learned SSoG kernels, steering, ODE field branches",
        description="Diagnostics of checkpoints (--checkpoint) and random models (--model), one row per model.",
    )
    commands = parser.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)

    sinks = commands.add_parser(
        "sinks", help="attention-sink diagnostics (Table 5)",
        description="Sink score (mean, worst layer, residual rollout), same-key %%, CLS %% and high-norm %% "
                    "over every mixer application (blocks, loop iterations, solver steps). Writes sinks.json.",
    )
    _common(sinks)
    _data(sinks, 512)
    sinks.add_argument("--batch-size", type=_positive_int, default=64, help="images per forward pass")
    sinks.set_defaults(func=run_sinks)

    lipschitz = commands.add_parser(
        "lipschitz", help="analytic bounds and empirical Lipschitz estimates vs input scale",
        description="For each model's token mixer and (continuous family) vector field: the analytic "
                    "upper bound where one exists (fixed SSoG, CenterNorm) and power-iteration estimates "
                    "of the Jacobian's norm at the model's own inputs times each scale. "
                    "Writes lipschitz.json and lipschitz.png.",
    )
    _common(lipschitz)
    _data(lipschitz, 8)
    lipschitz.add_argument("--scales", type=_positive_float, nargs="+", metavar="S",
                           help="input scales (default 1 2 5 10 20 50 100 200 500 1000)")
    lipschitz.add_argument("--iters", type=_positive_int, default=20, help="power-iteration steps")
    lipschitz.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                           help="precision of the estimates")
    lipschitz.set_defaults(func=run_lipschitz)

    kernels = commands.add_parser(
        "kernels", help="learned Gaussian mixtures of SSoG mixers (plots, Tables 6 and 9 statistics)",
        description="Per SSoG mixer and head: the kernel of the central query, smallest sigma, mean |mu|, "
                    "mixture weights. Writes kernels.json and one kernels_<i>_<model>.png per model.",
    )
    _common(kernels)
    kernels.set_defaults(func=run_kernels)

    steering = commands.add_parser(
        "steering", help="how far query steering moves the Gaussian mixtures of steered SSoG mixers",
        description="For each steered SSoG mixer, over one forward pass: its gates' open fraction and the mean "
                    "move of the steered centres (tokens), widths (|log ratio|) and weights (total variation) "
                    "from the fixed mixture, with the largest head's. Writes steering.json, .csv, .md "
                    "and steering.png.",
    )
    _common(steering)
    _data(steering, 256)
    steering.set_defaults(func=run_steering)

    field = commands.add_parser(
        "field", help="the continuous (ODE-ViT) vector field's gated branches along the flow",
        description="For each vector-field evaluation of one forward pass: the mean |gate| of the token mixer "
                    "and the MLP and the size (RMS per token) of each gated branch and of the state; with SSoG, "
                    "how far its kernels reach (tokens) at that time. Writes field.json and field.png.",
    )
    _common(field)
    _data(field, 256)
    field.set_defaults(func=run_field)


def _sources(args: argparse.Namespace) -> dict:
    return dict(models=args.model, checkpoints=args.checkpoint, ema=args.ema, seed=args.seed,
                device=args.device, output=args.output, overwrite=args.overwrite)


def _images(args: argparse.Namespace) -> dict:
    return dict(data=args.data, data_dir=args.data_dir, num_images=args.num_images, val_split=args.val_split,
                split_seed=args.split_seed)


def run_sinks(args: argparse.Namespace) -> int:
    from ssog.analysis import run_sinks as analyse, sinks_table

    results = analyse(**_sources(args), **_images(args), batch_size=args.batch_size)
    print(sinks_table(results))
    print(f"\nwrote {args.output / 'sinks.json'}")
    return 0


def run_lipschitz(args: argparse.Namespace) -> int:
    from ssog.analysis import DEFAULT_SCALES, lipschitz_table, run_lipschitz as analyse

    results = analyse(**_sources(args), **_images(args), scales=args.scales or DEFAULT_SCALES, iters=args.iters,
                      dtype=args.dtype)
    print(lipschitz_table(results))
    print("\nbound: analytic upper bound ('-': none exists); s=...: largest estimate at scales <= s")
    print(f"wrote {args.output / 'lipschitz.json'} and {args.output / 'lipschitz.png'}")
    return 0


def run_kernels(args: argparse.Namespace) -> int:
    from ssog.analysis import kernels_table, run_kernels as analyse

    results = analyse(**_sources(args))
    print(kernels_table(results))
    print(f"\nwrote {args.output / 'kernels.json'} and " + ", ".join(r["figure"] for r in results))
    return 0


def run_steering(args: argparse.Namespace) -> int:
    from ssog.analysis import run_steering as analyse, steering_table

    results = analyse(**_sources(args), **_images(args))
    print(steering_table(results))
    print("\nmoves from the fixed mixture: mean over images, queries and heads (largest head's in brackets)")
    print(f"wrote {args.output / 'steering.json'} and {args.output / 'steering.png'}")
    return 0


def run_field(args: argparse.Namespace) -> int:
    from ssog.analysis import field_table, run_field as analyse

    results = analyse(**_sources(args), **_images(args))
    print(field_table(results))
    print("\nmeans over the evaluations; MLP share: MLP RMS / (mixer RMS + MLP RMS)")
    print(f"wrote {args.output / 'field.json'} and {args.output / 'field.png'}")
    return 0
