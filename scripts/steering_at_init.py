"""How far steering moves the mixtures before training: ``ssog analyze steering`` on a fresh
model of each run's recipe, on that run's own validation images.

    python scripts/steering_at_init.py RUN [RUN ...] [--num-images N] [--seed S]

``RUN`` is a run folder of ``ssog train`` (its ``config.yaml`` gives the model and its
options; its checkpoint, the data and validation split). Set beside the trained run's
``ssog analyze steering`` table, this tells what a start (closed or half-open gates) moves
from what training learned to move.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import yaml

from ssog.analysis import image_batches, load_model, steering_moves, steering_table
from ssog.models import create_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders of ssog train")
    parser.add_argument("--num-images", type=int, default=256, help="validation images (default 256)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fresh models (default 0)")
    args = parser.parse_args()
    results = []
    for run in args.runs:
        config = yaml.safe_load((run / "config.yaml").read_text())
        trained = load_model(checkpoint=run)  # for its data and validation split
        images = torch.cat(list(image_batches(trained, None, num_images=args.num_images, seed=args.seed)))
        torch.manual_seed(args.seed)
        patch_embed: Any = trained.model.patch_embed  # timm's PatchEmbed, sized by the run's data
        sized = dict(num_classes=trained.model.num_classes, in_chans=patch_embed.proj.in_channels,
                     img_size=patch_embed.img_size)
        fresh = create_model(config["model"], **sized, **config["model_kwargs"]).eval()
        results.append({"model": f"{config['model']} ({run.name} at init)", "source": f"random init (seed {args.seed})",
                        **steering_moves(fresh, images)})
    print(steering_table(results))


if __name__ == "__main__":
    main()
