"""``ssog export``: a registered model or a run's checkpoint as an ONNX file, verified."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .info import check_num_classes

if TYPE_CHECKING:
    from torch import nn


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a model or a run's checkpoint to ONNX (verified with onnxruntime)",
        description="Export to ONNX with torch.onnx.export(dynamo=True) and a dynamic batch dimension "
                    "(--dynamic-size: and a dynamic height and width), then run the file in onnxruntime on "
                    "another batch size (and image size) and compare it with PyTorch "
                    "(max abs difference <= --atol) before reporting success. Needs the export extra: "
                    "pip install 'ssog[export]'. Fixed and steered SSoG, MHA, all three families; "
                    "the continuous family with a fixed-step solver. A file that fails the check is never "
                    "written (an existing --output is kept).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a registered model name (random weights), e.g. ssog_vit_tiny_patch4_32")
    source.add_argument("--checkpoint", help="a run folder (its best) or a .safetensors checkpoint; for ONNX also a "
                                             "released model (a folder with config.json and model.safetensors)")
    parser.add_argument("--output", required=True, help="the .onnx file to write, an existing one refused unless "
                                                        "--overwrite (--format hf: a new folder)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing .onnx --output file (not with --format hf: it writes a new folder)")
    parser.add_argument("--format", choices=("onnx", "hf"), default="onnx",
                        help="onnx (default), or hf: timm's Hugging Face layout (config.json with the data config, "
                             "model.safetensors) through timm.models.save_for_hf, which "
                             "timm.create_model('local-dir:DIR', pretrained=True) loads")
    parser.add_argument("--ema", action="store_true", help="export the run's EMA weights (trained with ema_decay)")
    parser.add_argument("--hub-id", metavar="USER/REPO",
                        help="--format hf: the Hugging Face hub repository the folder will be uploaded to, named in "
                             "its model card (README.md) as timm.create_model('hf-hub:USER/REPO')")
    parser.add_argument("--num-classes", type=int, help="classifier outputs of --model (default: the preset's)")
    parser.add_argument("--batch-size", type=int, default=2, help="batch size traced (the batch is dynamic)")
    parser.add_argument("--img-size", type=int,
                        help="image side traced, in pixels, a multiple of the patch (default: the model's); "
                             "without --dynamic-size the file takes this size only. SSoG kernels are rescaled to "
                             "its grid, as ssog eval --img-size does (see --rescale-kernels)")
    parser.add_argument("--rescale-kernels", action=argparse.BooleanOptionalAction, default=None,
                        help="scale SSoG mu, sigma and steering radius by the grid ratio of --img-size to the "
                             "model's size, as ssog eval does (default: yes for SSoG models when --img-size is "
                             "given; with --dynamic-size the kernels keep those lengths, in tokens, at other sizes); "
                             "--no-rescale-kernels keeps them as trained, in tokens")
    parser.add_argument("--dynamic-size", action="store_true",
                        help="any height and width that are multiples of the patch, of at least 2 patches "
                             "(checked at --img-size and at a size 2 patches higher and 1 wider)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest accepted |onnxruntime - PyTorch|")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_num_classes(args.num_classes)
    if args.checkpoint and args.num_classes is not None:
        raise ValueError("--num-classes sets the classifier of a --model; a run's checkpoint keeps the classes it "
                         "trained on: leave --num-classes out")
    if args.ema and not args.checkpoint:
        raise ValueError("--ema exports a run's EMA weights: give --checkpoint RUN")
    if not (math.isfinite(args.atol) and args.atol >= 0):
        raise ValueError(f"--atol must be a finite number >= 0 (the largest accepted |onnxruntime - PyTorch|), "
                         f"got {args.atol}")
    if not args.output.strip():
        raise ValueError("--output is empty: give the .onnx file (--format hf: the new folder) to write")
    if args.format == "hf":
        return _run_hf(args)
    if args.hub_id:
        raise ValueError("--hub-id names the hub repository in the model card of --format hf; an ONNX file has none")
    from ssog.export import MIN_PATCHES, ExportMismatch, check_export_memory, export_onnx, missing_export_packages
    from ssog.files import refuse_existing
    from ssog.train.run_folder import refuse_run_file

    refuse_run_file(args.output, "--output", reading=_checkpoint_files(args.checkpoint) if args.checkpoint else [])
    if not args.overwrite:
        refuse_existing([args.output], "--output")
    missing = missing_export_packages()
    if missing:
        raise ValueError(f"ONNX export needs {', '.join(missing)}: pip install 'ssog[export]'")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.model:
        from ssog.models import create_model

        kwargs = {} if args.num_classes is None else {"num_classes": args.num_classes}
        model, name = create_model(args.model, **kwargs), args.model
    else:
        from ssog.train.transfer import model_from_checkpoint

        model, name = model_from_checkpoint(args.checkpoint, ema=args.ema), args.checkpoint
    input_size = _input_size(model, args.img_size)
    check_export_memory(model, input_size, [input_size[1:]], args.batch_size)  # before moving to that size
    ratio, rescaled = _move_to(model, input_size, args.img_size, args.rescale_kernels)
    try:
        result = export_onnx(model, args.output, input_size, batch_size=args.batch_size,
                             dynamic_size=args.dynamic_size, atol=args.atol, overwrite=args.overwrite)
    except ExportMismatch as error:  # the file was not written: one line, as for bad input
        raise ValueError(f"the export does not compute the model: {error}") from None
    if args.json:
        print(json.dumps({"source": name, **result, "grid_ratio": ratio, "rescaled_kernels": rescaled}, indent=2))
    else:
        channels, height, width = input_size
        if args.dynamic_size:
            patch_embed: Any = model.patch_embed  # timm's PatchEmbed
            rows, cols = patch_embed.patch_size
            multiples = f"multiples of {rows}" if rows == cols else f"multiples of {rows} and {cols}"
            shape = f"(batch, {channels}, height, width), height and width {multiples}, {MIN_PATCHES} patches or more"
        else:
            shape = f"(batch, {channels}, {height}, {width})"
        sizes = " and ".join("x".join(map(str, size)) for size in result["verified_sizes"])
        kernels = f", kernels rescaled x{ratio:.3g}" if rescaled else ""
        print(f"exported {name} to {result['path']} (input {shape}, dynamic batch{kernels}); onnxruntime on batch "
              f"{result['verified_batch_size']} at {sizes} matches PyTorch "
              f"(max |diff| {result['max_abs_diff']:.2e} <= {args.atol:g})")
    return 0


def _move_to(model: nn.Module, input_size: tuple[int, int, int], img_size: int | None,
             rescale_kernels: bool | None) -> tuple[float, bool]:
    """``model`` at ``--img-size`` as ``ssog eval`` moves it
    (:func:`~ssog.train.transfer.move_to_input_size`: SSoG kernels rescaled unless
    ``--no-rescale-kernels``); a model at its own size, or kept in tokens, is left as it is
    (it takes any size divisible by its patch). Returns ``(grid ratio, whether rescaled)``."""
    from ssog.train.transfer import move_to_input_size

    patch_embed = getattr(model, "patch_embed", None)
    if rescale_kernels and img_size is None:
        raise ValueError("--rescale-kernels needs --img-size (a new grid to rescale to)")
    if img_size is None or patch_embed is None or tuple(patch_embed.img_size) == tuple(input_size[1:]):
        return 1.0, False
    if rescale_kernels is False:
        return input_size[1] / patch_embed.img_size[0], False
    return move_to_input_size(model, img_size, None, rescale_kernels)


def _checkpoint_files(checkpoint: str) -> list[Path]:
    """The files ``--checkpoint`` reads (a run folder's best, a released folder's files)."""
    from ssog.train.transfer import model_source, source_files

    return source_files(model_source(checkpoint))


def _input_size(model: nn.Module, img_size: int | None) -> tuple[int, int, int]:
    """``(C, H, W)`` to trace: ``img_size`` square (a multiple of the patch), else the model's
    own size; a model without patches (a timm CNN run) at the input size it trained at."""
    from ssog.data.data_config import model_data_config

    patch_embed = getattr(model, "patch_embed", None)
    channels, height, width = (model.in_chans, *patch_embed.img_size) if patch_embed is not None else \
        tuple(model_data_config(model)["input_size"])
    if img_size is None:
        return channels, height, width
    patch = tuple(patch_embed.patch_size) if patch_embed is not None else (1, 1)
    if img_size < 1 or img_size % patch[0] or img_size % patch[1]:
        raise ValueError(f"--img-size must be a positive multiple of the patch size {'x'.join(map(str, patch))}, "
                         f"got {img_size}")
    return channels, img_size, img_size


def _run_hf(args: argparse.Namespace) -> int:
    from ssog.export import save_for_hf, save_run_for_hf

    if args.overwrite:  # said, not ignored: a folder of the user's is never replaced
        raise ValueError("--overwrite replaces an .onnx file; --format hf writes a new folder and never replaces "
                         "one: choose a new --output")
    if args.hub_id is not None:
        from ssog.export import check_hub_id

        check_hub_id(args.hub_id)  # before the work
    if args.img_size is not None or args.dynamic_size:
        raise ValueError("--img-size and --dynamic-size shape an ONNX file; --format hf writes the weights, which "
                         "take any size divisible by the patch")
    if args.model:
        from ssog.export import model_card
        from ssog.models import create_model

        kwargs = {} if args.num_classes is None else {"num_classes": args.num_classes}
        model = create_model(args.model, **kwargs)
        directory = save_for_hf(model, args.output, readme=model_card(model, hub_id=args.hub_id))
    else:
        directory = save_run_for_hf(args.checkpoint, args.output, ema=args.ema, hub_id=args.hub_id)
    files = ", ".join(sorted(p.name for p in directory.iterdir()))
    if args.json:
        print(json.dumps({"source": args.model or args.checkpoint, "path": str(directory), "format": "hf"}, indent=2))
    else:
        print(f"exported {args.model or args.checkpoint} to {directory} ({files}); load it with "
              f"timm.create_model('local-dir:{directory}', pretrained=True)")
    return 0
