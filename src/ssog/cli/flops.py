"""``ssog flops MODEL --img-size S``: forward GFLOPs of one image (Table 4's accounting)."""
from __future__ import annotations

import argparse
import json

from ..models._counting import model_flops


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "flops",
        help="forward GFLOPs (total and attention) of a registered model",
        description="Count forward FLOPs of one image with torch.utils.flop_counter on the meta device "
        "(2 per multiply-add; matmuls, linears and convolutions). SSoG mixing is counted in its separable "
        "form whatever the backend; attention includes the projections.",
    )
    parser.add_argument("model", help="registered model name, e.g. mha_vit_base_patch16_224")
    parser.add_argument("--img-size", type=int, default=None,
                        help="square input side in pixels (default: the preset's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        result = model_flops(args.model, img_size=args.img_size)
    except RuntimeError as error:  # counted on the meta device: only a size beyond int64 fails
        if "overflow" not in str(error):
            raise
        raise ValueError(f"--img-size {args.img_size}: a tensor of {args.model} at this size has more elements "
                         "than PyTorch can count (int64; attention holds tokens^2 scores per head); choose a "
                         "smaller --img-size") from None
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    size = result["img_size"]
    print(
        f"{result['model']} at {size}x{size} ({result['tokens']} tokens): "
        f"{result['total_gflops']:.2f} GFLOPs total, {result['attention_gflops']:.2f} GFLOPs attention"
    )
    return 0
