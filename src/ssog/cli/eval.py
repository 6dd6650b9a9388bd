"""``ssog eval``: evaluate a checkpoint, optionally at another image or patch size."""
from __future__ import annotations

import argparse
import json

from ssog.cli.train_options import parse_split


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a checkpoint (also at another image or patch size)",
        description="Evaluate a checkpoint written by ssog train on its validation data or another "
                    "data source, or a released model (timm's hub layout, as ssog export --format hf writes it) "
                    "on the data --dataset / --data-dir name. --img-size / --patch-size evaluate at another "
                    "input: the patch embedding is PI-resized and the position embedding resampled bicubically "
                    "(timm), and SSoG's kernels (mu, sigma, steering radius) are scaled by the grid ratio so "
                    "they keep covering the same image area (--no-rescale-kernels keeps them in tokens).",
    )
    parser.add_argument("--checkpoint", required=True,
                        help="a .safetensors checkpoint or a run folder (its best), or a released model: a folder "
                             "with config.json and model.safetensors, local-dir:FOLDER or hf-hub:USER/REPO")
    parser.add_argument("--dataset", help="data source (default: the one the run was trained on; a released model "
                                          "needs it or --data-dir)")
    parser.add_argument("--data-dir", help="data folder for --dataset; for an ImageFolder, a folder of class "
                                           "folders (or with a val/ folder) evaluated whole unless --val-split")
    parser.add_argument("--val-split", type=parse_split,
                        help="with --data-dir: split this count or fraction off DIR/train as training does and "
                             "evaluate it (an ImageFolder run's held-out images), or name the validation folder")
    parser.add_argument("--split-seed", type=int, help="seed of --val-split's stratified split (default: the run's, "
                                                       "else 0)")
    parser.add_argument("--download", action="store_true", default=None, help="download CIFAR if missing")
    parser.add_argument("--split", default="val", choices=("val", "train"), help="which split to evaluate")
    parser.add_argument("--img-size", type=int, help="evaluate at this image size (pixels)")
    parser.add_argument("--patch-size", type=int, help="evaluate at this patch size (pixels)")
    parser.add_argument("--rescale-kernels", action=argparse.BooleanOptionalAction, default=None,
                        help="scale SSoG mu, sigma and steering radius by the grid ratio new/old (default: yes "
                             "for SSoG models when --img-size or --patch-size is given)")
    parser.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    parser.add_argument("--batch-size", type=int, help="batch size")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--per-class", action="store_true", help="also report Acc@1 of every class")
    parser.add_argument("--compare", metavar="CHECKPOINT",
                        help="also evaluate this model (what --checkpoint takes) on the same images and report "
                             "the Acc@1 difference --checkpoint minus it, paired over the images: its 95%% "
                             "interval and McNemar's exact p (the noise of the images evaluated, not of training)")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.add_argument("--output", help="also write the metrics to this JSON file (an existing one is refused "
                                         "unless --overwrite; a link is written through, a device or pipe into)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ssog.files import check_output_file, write_atomic
    from ssog.train import compare_checkpoints, evaluate_checkpoint

    if args.compare is not None and args.per_class:
        raise ValueError("--per-class and --compare do not combine: evaluate each model with --per-class")
    if args.output is not None and not args.output.strip():
        raise ValueError("--output is empty: give the JSON file to write the metrics to, or leave --output out")
    if args.output:
        from ssog.train.run_folder import refuse_run_file
        from ssog.train.transfer import model_source, source_files

        reading = [file for path in (args.checkpoint, args.compare) if path
                   for file in source_files(model_source(path))]
        refuse_run_file(args.output, "--output", reading=reading)
        check_output_file(args.output, "--output", args.overwrite)  # before the evaluation, not after it
    data = {k: getattr(args, k) for k in ("dataset", "data_dir", "download", "val_split", "split_seed")
            if getattr(args, k) is not None}
    options = dict(data=data, split=args.split, img_size=args.img_size, patch_size=args.patch_size,
                   rescale_kernels=args.rescale_kernels, ema=args.ema, batch_size=args.batch_size,
                   device=args.device, progress=not args.json)
    if args.compare is not None:
        result = compare_checkpoints(args.checkpoint, args.compare, **options)
    else:
        result = evaluate_checkpoint(args.checkpoint, per_class=args.per_class, **options)
    if args.output:
        write_atomic(args.output, json.dumps(result, indent=2) + "\n", overwrite=args.overwrite)
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.compare is not None:
        paired = result["paired"]
        low, high = paired["ci95"]
        print(f"A: {result['a']['checkpoint']}\n   {_describe(result['a'])}")
        print(f"B: {result['b']['checkpoint']}\n   {_describe(result['b'])}")
        print(f"A - B: {paired['difference']:+.2f} Acc@1 on the same {paired['images']} images (95% interval "
              f"{low:+.2f} to {high:+.2f}, McNemar p = {paired['p_value']:.3g}; {paired['only_a']} images only A "
              f"gets right, {paired['only_b']} only B)")
    else:
        print(_describe(result))
        if args.per_class:
            width = max(len("class"), *(len(row["class"]) for row in result["per_class"]))
            print(f"{'class':<{width}}  images   Acc@1")
            for row in result["per_class"]:
                print(f"{row['class']:<{width}}  {row['images']:>6}  {row['acc1']:6.2f}")
    return 0


def _describe(result: dict) -> str:
    """One model's metrics as one line naming the data and the input it was evaluated at."""
    source = f" from {result['data_dir']}" if result["data_dir"] else ""
    grid = result["grid"]
    patches = f", patch {result['patch_size'][0]}, grid {grid[0]}x{grid[1]}" if grid else ""
    rescaled = f", kernels rescaled x{result['grid_ratio']:.3g}" if result["rescaled_kernels"] else ""
    return (f"{result['model']} on {result['dataset']} {result['split']}{source} ({result['samples']} images, "
            f"{result['img_size']}px{patches}{rescaled}): Acc@1 {result['acc1']:.2f}  Acc@3 {result['acc3']:.2f}  "
            f"Acc@5 {result['acc5']:.2f}  loss {result['loss']:.4f}")
