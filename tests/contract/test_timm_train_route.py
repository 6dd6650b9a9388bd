"""timm's own ``train.py`` trains the ssog models: what it calls, called as it calls it.

``train.py --device-modules ssog`` imports ssog after timm (which registers the models;
tests/contract/test_imports.py checks that order in a fresh interpreter), then builds the model with
``timm.create_model`` and its own keyword set, resolves the data config from the model,
builds the optimizer with ``optimizer_kwargs`` (``--layer-decay``), and trains. The script is
not part of the timm wheel, so these are its calls, not the script.
"""
from __future__ import annotations

import argparse
import importlib

import timm
import torch
from timm.data import resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2, optimizer_kwargs
from timm.utils import ParseKwargs


def _train_py_arguments(argv: list[str]) -> argparse.Namespace:
    """The train.py options these calls read, with train.py's defaults."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--device-modules", nargs="+", default=None)
    parser.add_argument("--model-kwargs", nargs="*", default={}, action=ParseKwargs)
    parser.add_argument("--num-classes", type=int, default=None)
    parser.add_argument("--in-chans", type=int, default=None)
    parser.add_argument("--gp", default=None)
    parser.add_argument("--drop", type=float, default=0.0)
    parser.add_argument("--drop-path", type=float, default=None)
    parser.add_argument("--initial-checkpoint", default="")
    parser.add_argument("--opt", default="sgd")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--weight-decay", type=float, default=2e-5)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--layer-decay", type=float, default=None)
    parser.add_argument("--grad-checkpointing", action="store_true")
    parser.add_argument("--input-size", type=int, nargs=3, default=None)
    parser.add_argument("--mean", type=float, nargs="+", default=None)
    parser.add_argument("--std", type=float, nargs="+", default=None)
    parser.add_argument("--crop-pct", type=float, default=None)
    parser.add_argument("--interpolation", default="")
    return parser.parse_args(argv)


def _create_model_as_train_py(args: argparse.Namespace) -> torch.nn.Module:
    for module in args.device_modules or ():
        importlib.import_module(module)
    return timm.create_model(
        args.model, pretrained=False, in_chans=args.in_chans or 3, num_classes=args.num_classes, drop_rate=args.drop,
        drop_path_rate=args.drop_path, drop_block_rate=None, global_pool=args.gp, bn_momentum=None, bn_eps=None,
        scriptable=None, checkpoint_path=args.initial_checkpoint, **args.model_kwargs,
    )


def test_train_py_builds_configures_and_steps_an_ssog_model(tmp_path):
    args = _train_py_arguments([
        "--model", "ssog_vit_micro_patch1_8", "--device-modules", "ssog", "--in-chans", "1", "--num-classes", "4",
        "--model-kwargs", "steer=('mu',)", "num_atoms=2", "embed_dim=16", "num_heads=2",
        "--drop-path", "0.1", "--opt", "adamw", "--lr", "1e-3", "--weight-decay", "0.05", "--layer-decay", "0.75",
        "--grad-checkpointing",
    ])
    torch.manual_seed(0)
    model = _create_model_as_train_py(args)
    assert model.num_classes == 4 and model.mixer_kwargs["steer"] == ("mu",) and model.mixer_kwargs["num_atoms"] == 2
    model.set_grad_checkpointing(enable=args.grad_checkpointing)
    data_config = resolve_data_config(vars(args), model=model)
    assert data_config["input_size"] == (1, 8, 8) and data_config["mean"] == (0.5,)  # the preset's own
    optimizer = create_optimizer_v2(model, **optimizer_kwargs(cfg=args))
    assert sorted({group["lr_scale"] for group in optimizer.param_groups})[0] < 1  # layer decay reached the groups
    images, targets = torch.randn(4, *data_config["input_size"]), torch.tensor([0, 1, 2, 3])
    before = [p.detach().clone() for p in model.parameters()]
    loss = LabelSmoothingCrossEntropy(0.1)(model(images), targets)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

    # Its CheckpointSaver's layout, loaded back as the docs say (--initial-checkpoint / checkpoint_path).
    checkpoint = tmp_path / "last.pth.tar"
    torch.save({"epoch": 0, "arch": args.model, "state_dict": model.state_dict(), "version": 2}, checkpoint)
    reloaded = _create_model_as_train_py(_train_py_arguments([
        "--model", args.model, "--in-chans", "1", "--num-classes", "4", "--initial-checkpoint", str(checkpoint),
        "--model-kwargs", "steer=('mu',)", "num_atoms=2", "embed_dim=16", "num_heads=2",
    ]))
    for (name, trained), loaded in zip(model.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(trained, loaded), name

