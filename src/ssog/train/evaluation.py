"""Evaluate a checkpoint on any data source, optionally at another image or patch size."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from timm.data import resolve_model_data_config

from ssog.data.folder import class_difference
from ssog.runtime import is_out_of_memory, torch_settings
from ssog.train.builders import build_eval_data
from ssog.train.checkpoint import load_checkpoint, read_checkpoint_info
from ssog.train.config import TrainConfig, data_source_from_overrides, upgrade_checkpoint_config
from ssog.train.distributed import DistContext, init_distributed
from ssog.train.logger import progress_bar
from ssog.train.metrics import evaluate, paired_difference
from ssog.train.transfer import model_from_checkpoint, model_source, move_to_input_size

__all__ = ["compare_checkpoints", "evaluate_checkpoint"]

# what names the images evaluated: two models compared must have read the same ones
_DATA_KEYS = ("dataset", "data_dir", "split", "val_split", "split_seed", "samples")

logger = logging.getLogger(__name__)


def evaluate_checkpoint(
    checkpoint: str | Path,
    *,
    data: dict[str, Any] | None = None,
    split: str = "val",
    img_size: int | None = None,
    patch_size: int | None = None,
    rescale_kernels: bool | None = None,
    ema: bool = False,
    batch_size: int | None = None,
    device: str = "auto",
    progress: bool = True,
    per_class: bool = False,
    per_sample: bool = False,
) -> dict[str, Any]:
    """Metrics (``loss``, ``acc1``, ``acc3``, ``acc5``) of a run's checkpoint or of a released model.

    ``checkpoint``: a ``.safetensors`` checkpoint or a run folder (its ``best``), or a released
    model in timm's hub layout (a folder with ``config.json`` and ``model.safetensors``, as
    ``ssog export --format hf`` writes it, or ``local-dir:FOLDER`` / ``hf-hub:USER/REPO``).
    A run's model and data come from the checkpoint's config; ``data`` overrides data fields
    (``dataset``, ``data_dir``, ``val_split``, ``split_seed``, ...). A released model has no
    run config: ``data`` must name the data (``dataset`` and/or ``data_dir``), and the data
    config (size, mean, std, crop, interpolation) is its ``pretrained_cfg``'s.
    ``img_size`` / ``patch_size`` evaluate at another input
    (the model's position embedding and patch embedding are resampled by timm), and
    ``rescale_kernels`` also scales SSoG's mu, sigma and steering radius by the grid ratio
    (Table 13; the image-unit rule of docs/operator.md); ``None`` (the default) does so for a
    model with SSoG mixers whenever ``img_size`` or ``patch_size`` is given, so its kernels keep
    covering the image area they were trained on (docs/results/accuracy.md, "Resolution
    transfer"), ``False`` keeps them in tokens.

    For an ImageFolder, a ``data["data_dir"]`` given here is evaluated whole:
    ``DIR/<split>`` if it exists, else ``DIR`` itself as class folders (no ``train`` folder
    needed, no split applied), unless ``data["val_split"]`` is given too: then ``DIR`` is read
    as for training, the validation images split off ``DIR/train`` by ``val_split`` and
    ``split_seed`` (the run's, or ``data["split_seed"]``), so a run's held-out images are
    evaluated again from a copy of its data folder. The folder's classes must be the model's.
    ``per_class`` adds ``per_class``: ``[{"class", "images", "acc1"}, ...]``; ``per_sample``
    adds ``targets`` and ``correct`` (``(N,)`` tensors in the data's order, see
    :func:`ssog.train.metrics.evaluate`). ``val_split`` and ``split_seed`` in the result are
    the split applied, ``None`` where a folder is evaluated whole.
    """
    for name, value in (("img_size", img_size), ("patch_size", patch_size), ("batch_size", batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    data = dict(data or {})
    path = model_source(checkpoint)
    model = model_from_checkpoint(path, ema=ema)  # the trained size, weights checked and loaded
    if isinstance(path, str):  # a released model: the data named here, the data config of its pretrained_cfg
        values = _released_model_values(model, path, data)
        classes = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    else:
        config = read_checkpoint_info(path).get("config")
        if config is None:
            raise ValueError(f"{path} holds weights only; ssog eval needs a checkpoint written by ssog train")
        # A dataset named here beats the run's data source, as on the training command line.
        values = data_source_from_overrides(config, dict(config, **data), set(data))
        if values.get("data_dir") is not None and data.get("data_dir") is None:
            values["data_dir"] = str(_run_data_dir(config["data_dir"], config.get("output"), path))
        classes = load_checkpoint(path, only=("classes",)).get("classes")
    if data.get("data_dir") is not None:
        values["data_dir"] = str(Path(data["data_dir"]).expanduser().resolve())
    values.update(output=None, init_from=None, progress=progress, device=device, overwrite=False)
    if batch_size is not None:  # images at once: a run's gradient accumulation does not divide it
        values.update(batch_size=batch_size, grad_accum_steps=1)
    values["img_size"] = img_size or values.get("img_size")
    cfg = TrainConfig.from_dict(upgrade_checkpoint_config(values))
    ctx = init_distributed(cfg.device)
    # A folder given here is evaluated whole, unless a val_split given here says which part of it.
    given = data.get("data_dir") if cfg.dataset == "imagefolder" else None
    folder = given if data.get("val_split") is None else None
    with _out_of_memory_named(cfg, ctx):  # synthetic images are made in memory at img_size
        loader, info, data_config = build_eval_data(cfg, ctx, split, folder=folder)
    if given is not None:
        _check_classes(classes, info.classes, given, path)

    in_chans = resolve_model_data_config(model)["input_size"][0]  # the run's data config (model_from_checkpoint)
    if (model.num_classes, in_chans) != (info.num_classes, info.in_chans):
        raise ValueError(f"{path} classifies {model.num_classes} classes of {in_chans}-channel "
                         f"images; the data has {info.num_classes} classes, {info.in_chans} channels")
    _check_patch_size(model, img_size, patch_size)
    with _out_of_memory_named(cfg, ctx, info.native_size):
        # from the trained size to the new one the way timm resamples (and ssog export does)
        ratio, rescale_kernels = move_to_input_size(model, img_size, patch_size, rescale_kernels)
        model.to(ctx.device)
        bar = (lambda it: progress_bar(progress, iterable=it, desc="eval")) if progress else None
        with torch_settings(ctx.device, cfg.threads, cfg.deterministic):
            metrics = evaluate(model, loader, ctx, cfg.amp, progress=bar, per_class=per_class, per_sample=per_sample)
    if per_class:
        names = info.classes or tuple(str(i) for i in range(info.num_classes))
        metrics["per_class"] = [
            {"class": name, "images": count, "acc1": acc}
            for name, count, acc in zip(names, metrics.pop("class_counts"), metrics.pop("class_acc1"))
        ]
    patch_embed = getattr(model, "patch_embed", None)  # None: a model without patches (a CNN)
    return {
        **metrics, "checkpoint": str(path), "model": cfg.model, "dataset": cfg.dataset, "split": split,
        "samples": len(loader.dataset), "img_size": data_config["input_size"][-1],  # type: ignore[arg-type]
        "patch_size": list(patch_embed.patch_size) if patch_embed else None,
        "grid": list(patch_embed.grid_size) if patch_embed else None, "grid_ratio": ratio,
        "rescaled_kernels": rescale_kernels, "ema": ema, "data_dir": cfg.data_dir,
        "val_split": None if folder else cfg.val_split, "split_seed": None if folder else cfg.split_seed,
    }


def compare_checkpoints(checkpoint: str | Path, other: str | Path, **options: Any) -> dict[str, Any]:
    """Two models evaluated on the same images, and the paired difference of their Acc@1.

    ``checkpoint``, ``other``: what :func:`evaluate_checkpoint` takes; ``options``: its keyword
    arguments, applied to both (each run reads its own run's data unless ``options["data"]``
    names the data). Returns ``{"a": metrics of checkpoint, "b": metrics of other, "paired":
    paired_difference(a, b)}`` (:func:`ssog.train.metrics.paired_difference`: A - B, its 95%
    interval and McNemar's p). The two must have read the same images in the same order: a
    different data source, split or label sequence is a ValueError naming both.
    """
    if options.get("per_class"):
        raise ValueError("per_class does not combine with a comparison: evaluate each model with per_class")
    a, b = (evaluate_checkpoint(path, **dict(options, per_sample=True)) for path in (checkpoint, other))
    differ = [key for key in _DATA_KEYS if a[key] != b[key]]
    if differ or not torch.equal(a["targets"], b["targets"]):
        shown = ", ".join(f"{key} {a[key]!r} against {b[key]!r}" for key in differ) or "the labels, in order"
        raise ValueError(f"{a['checkpoint']} and {b['checkpoint']} were evaluated on different images ({shown}); "
                         "a paired comparison needs the same images: name the data for both (--dataset, --data-dir, "
                         "--val-split, --split-seed)")
    paired = paired_difference(a.pop("correct"), b.pop("correct"))
    del a["targets"], b["targets"]
    return {"a": a, "b": b, "paired": paired}


@contextmanager
def _out_of_memory_named(cfg: TrainConfig, ctx: DistContext, native_size: int | None = None) -> Iterator[None]:
    """Running out of memory in the block as one line naming the sizes to lower."""
    try:
        yield
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        size = f"{cfg.img_size or native_size}px" if cfg.img_size or native_size else "its image size"
        raise MemoryError(f"out of memory on {ctx.device} evaluating {cfg.model} at {size} (--img-size) with "
                          f"batch_size {cfg.batch_size} (--batch-size); lower them") from None


def _released_model_values(model: Any, reference: str, data: dict[str, Any]) -> dict[str, Any]:
    """The config values that evaluate the released model ``reference``: the data ``data``
    names (it must name some: a released model stores no run config), the architecture and
    the data config of the model's ``pretrained_cfg`` (``config.json``)."""
    if data.get("dataset") is None and data.get("data_dir") is None:
        raise ValueError(
            f"{reference} is a released model, which keeps no training config to take the data from: name the data "
            "with --dataset and --data-dir (for an ImageFolder trained with val_split, add --val-split N and "
            "--split-seed S to evaluate the images that run held out)")
    pretrained = getattr(model, "pretrained_cfg", None) or {}
    values = data_source_from_overrides({}, data, set(data))
    values.update(model=pretrained.get("architecture") or type(model).__name__, img_size=pretrained["input_size"][-1],
                  mean=list(pretrained["mean"]), std=list(pretrained["std"]), crop_pct=pretrained["crop_pct"],
                  interpolation=pretrained["interpolation"])
    return values


def _run_data_dir(data_dir: str, output: str | None, checkpoint: Path) -> Path:
    """A run's ``data_dir`` as an absolute path. Runs store it resolved; an older run's relative
    one is taken relative to the folder that run was started from, found by removing its
    relative ``output`` from the checkpoint's folder, else relative to the current folder."""
    path = Path(data_dir).expanduser()
    if path.is_absolute():
        return path
    folder = checkpoint.resolve().parent
    if output and not Path(output).is_absolute():
        parts = Path(output).parts
        if folder.parts[-len(parts):] == parts:
            return Path(*folder.parts[:-len(parts)]) / path
    return path.resolve()


def _check_patch_size(model, img_size: int | None, patch_size: int | None) -> None:
    """A patch must fit in the image: one line naming the options, not timm's shape error."""
    if getattr(model, "patch_embed", None) is None:
        return  # set_input_size says what such a model cannot do
    size = img_size or model.patch_embed.img_size[0]
    patch = patch_size or model.patch_embed.patch_size[0]
    if patch > size:
        raise ValueError(f"--patch-size {patch} is larger than the {size}px image"
                         f"{' (--img-size)' if img_size else ''}; choose a patch size of at most {size}")


def _check_classes(run_classes: list[str] | None, folder_classes: tuple[str, ...], folder: str,
                   path: Path | str) -> None:
    """The evaluated folder's classes must be the model's, in the same order (same label indices).
    A model that names none (a released ``config.json`` without ``label_names``, a checkpoint
    written before class names were stored) cannot be checked: a warning says so."""
    if not run_classes:
        shown = ", ".join(folder_classes[:5]) + (", ..." if len(folder_classes) > 5 else "")
        why = "its config.json has no label_names" if isinstance(path, str) else \
            "it was written before checkpoints stored class names"
        logger.warning(f"{path} names no classes ({why}), so the class folders of {folder} cannot be checked "
                       f"against the classes it was trained on: they are taken in sorted order as its classes "
                       f"0..{len(folder_classes) - 1} ({shown}), and the metrics are wrong if it learnt other classes "
                       "or another order")
        return
    if list(folder_classes) != list(run_classes):
        raise ValueError(
            f"the class folders of {folder} are not the classes the run of {path} was trained on "
            f"({class_difference(run_classes, folder_classes)}; expected {len(run_classes)} folders: "
            f"{', '.join(run_classes[:10])}{', ...' if len(run_classes) > 10 else ''})"
        )
