"""``ssog info MODEL``: parameter counts (total and by part) and architecture."""
from __future__ import annotations

import argparse
import json

from ..models._counting import PARTS, model_info


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help="parameter counts and architecture of a registered model",
        description="Count the parameters of a registered model (built on the meta device, so any size "
        "is instant), in total and by part, and print its architecture.",
    )
    parser.add_argument("model", help="registered model name, e.g. ssog_odevit_base_patch16_224")
    parser.add_argument("--num-classes", type=int, default=None, help="classifier outputs (default: the preset's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def check_num_classes(num_classes: int | None) -> None:
    """``--num-classes`` must be a class count, or 0 for a model without classifier."""
    if num_classes is not None and num_classes < 0:
        raise ValueError(f"--num-classes must be >= 0 (0: no classifier, the model returns features), "
                         f"got {num_classes}")


def run(args: argparse.Namespace) -> int:
    check_num_classes(args.num_classes)
    kwargs = {} if args.num_classes is None else {"num_classes": args.num_classes}
    info = model_info(args.model, **kwargs)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    params = info["params"]
    print(f"{info['model']}: {params['total']:,} parameters ({params['total'] / 1e6:.2f} M)")
    for part in PARTS:
        if params[part]:
            print(f"  {part:<12} {params[part]:>12,}")
    print("config:")
    for key, value in info["config"].items():
        print(f"  {key}: {value!r}" if value == "" else f"  {key}: {value}")  # '' (timm's default init) visible
    return 0
