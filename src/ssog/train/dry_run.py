"""``ssog train --dry-run``: what a recipe costs on this device, before launching it.

Everything a run builds is built (data, model, optimizer, schedule, augmentation, mixup,
EMA), then a few optimizer steps run at the recipe's batch size on batches the loader
produced, timed apart from the loader, which is timed alone. Where a step does not fit in
memory, the largest micro-batch that does is found and the ``grad_accum_steps`` that keeps the
global batch is given. The report projects the time per epoch and for the whole schedule.

Nothing is written: no run folder, no download. A recipe of a known data set (CIFAR-10,
CIFAR-100, ImageNet-1k: :data:`KNOWN_SOURCES`, by its ``dataset`` or the name of its data
folder) whose data is not on this machine is measured on generated images of its shape (size
and classes), and its epoch projected for the real training set's size. For ``devices``
processes (``nodes`` x ``--nproc``) the step is measured at the per-device batch and the epoch
projected for the global one.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import shlex
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ssog.data import build_datasets
from ssog.data.info import stratified_split
from ssog.measure import format_duration, peak_memory, timed
from ssog.models import count_flops
from ssog.runtime import autocast, is_out_of_memory, torch_settings, usable_cpus
from ssog.train.config import TrainConfig
from ssog.train.distributed import DistContext, init_distributed
from ssog.train.engine import Trainer

__all__ = ["KNOWN_SOURCES", "dry_run", "format_dry_run", "torchrun_line"]

logger = logging.getLogger(__name__)

#: Classes, training and test images of the sources a dry run can stand in for without their files.
KNOWN_SOURCES: dict[str, tuple[int, int, int]] = {
    "cifar10": (10, 50_000, 10_000), "cifar100": (100, 50_000, 10_000), "imagenet": (1000, 1_281_167, 50_000)}


def _known_source(cfg: TrainConfig) -> str | None:
    """The :data:`KNOWN_SOURCES` entry ``cfg`` reads: its ``dataset``, or the name of its data
    folder (an ImageFolder tree in ``data/imagenet`` or ``/tmp/data/cifar100``), else None."""
    if cfg.dataset in KNOWN_SOURCES:
        return cfg.dataset
    name = Path(cfg.data_dir).name.lower() if cfg.data_dir else None
    return name if name in KNOWN_SOURCES else None


def _build(cfg: TrainConfig, ctx: DistContext) -> tuple[Trainer, dict[str, Any]]:
    """The run's :class:`Trainer` (nothing written), or one on generated data of the recipe's
    shape when its data source is a known one whose files are not on this machine; with notes
    on the data measured: ``stand_in`` and the real ``train_images`` and ``val_images`` of the
    source. Only the data source failing to load is missing data: for a known source it is read
    alone first (cheap), and every other error, a setting's, is raised as the real run raises it."""
    cfg = dataclasses.replace(cfg, download=False)
    source = _known_source(cfg)
    if source is not None:
        try:
            if cfg.dataset in KNOWN_SOURCES:
                build_datasets(cfg.dataset, cfg.data_dir, download=False)
            # an ImageFolder tree named after its source: the run reads it
            elif cfg.data_dir is not None and not Path(cfg.data_dir).is_dir():
                raise FileNotFoundError(f"data folder {cfg.data_dir} does not exist")
        except (ValueError, OSError) as error:
            return _stand_in(cfg, ctx, source, str(error))
    try:
        trainer = Trainer(cfg, ctx, Path(cfg.output or "dry-run"))
    except (FileNotFoundError, NotADirectoryError) as error:  # files of the data source missing
        raise ValueError(f"{error} (measure without the data: add --dataset synthetic)") from error
    return trainer, {"stand_in": None, "train_images": len(trainer.data.train_loader.dataset),  # type: ignore[arg-type]
                     "val_images": len(trainer.data.val_loader.dataset)}  # type: ignore[arg-type]


def _stand_in(cfg: TrainConfig, ctx: DistContext, source: str, reason: str) -> tuple[Trainer, dict[str, Any]]:
    """A :class:`Trainer` on generated images of the known ``source``'s shape, its ``val_split``
    checked against the source's real size as the real run checks it."""
    classes, train_images, val_images = KNOWN_SOURCES[source]
    if cfg.val_split is not None and not isinstance(cfg.val_split, str):  # a name picks a folder, splits nothing
        # the real run's split of the real training set (its message names the setting)
        train_part, val_part = stratified_split(np.arange(train_images) % classes, cfg.val_split, cfg.split_seed)
        train_images, val_images = len(train_part), len(val_part)
    stand_in = dataclasses.replace(cfg, dataset="synthetic", data_dir=None, val_split=None,
                                   synthetic_size=cfg.batch_size, synthetic_classes=classes)
    logger.warning(f"{source} is not readable here ({reason}); measuring on generated images of its shape "
                   f"({classes} classes), the epoch projected for its {train_images:,} training images")
    return Trainer(stand_in, ctx, Path(cfg.output or "dry-run")), {
        "stand_in": source, "train_images": train_images, "val_images": val_images}


def _time_loader(trainer: Trainer, micro_batches: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], float]:
    """``micro_batches`` batches of the training loader (started again as often as needed) and
    its images per second, the first batch (worker start-up) left out of the rate. Its worker
    processes are stopped before returning: prefetching on, they would share the cores with the
    model steps timed next."""
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    images, start, epoch = 0, 0.0, 0
    while len(batches) < micro_batches:
        trainer.data.start_epoch(epoch)
        epoch_batches = iter(trainer.data.train_loader)
        for batch in epoch_batches:
            batches.append(batch)
            if len(batches) == 1:
                start = time.perf_counter()
            else:
                images += len(batch[0])
            if len(batches) == micro_batches:
                break
        del epoch_batches  # shuts the workers down
        epoch += 1
    elapsed = time.perf_counter() - start
    return batches, images / elapsed if images and elapsed > 0 else math.nan


def _step(trainer: Trainer, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """One optimizer step over ``micro`` (its micro-batches); seconds."""
    def step() -> None:
        for i, (images, targets) in enumerate(micro):
            trainer.forward_backward(images, targets, sync=i == len(micro) - 1)
        trainer.optimizer_step()

    return timed(step, trainer.ctx.device)


def _fitting_micro_batch(trainer: Trainer, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """The largest micro-batch (the loader's, halved until it fits; even under mixup) whose
    step does not run out of memory."""
    size, smallest = len(batch[0]), 2 if trainer.mixup is not None else 1
    while True:
        try:
            _step(trainer, [(batch[0][:size], batch[1][:size])])
            return size
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error) or size <= smallest:
                raise
            trainer.optimizer.zero_grad(set_to_none=True)
            if trainer.ctx.device.type == "cuda":
                torch.cuda.empty_cache()
            size = max(smallest, size // 2)


def _step_peak_memory(trainer: Trainer, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    """Peak bytes of one more optimizer step over ``micro``, as ``ssog bench --mode train``
    counts them (:func:`ssog.measure.peak_memory`): the weights (the EMA's too), the optimizer
    state and the step's own peak allocation."""
    resident = [*trainer.model.state_dict().values(),
                *(trainer.ema.module.state_dict().values() if trainer.ema is not None else ()),
                *(value for state in trainer.optimizer.state.values() for value in state.values()
                  if isinstance(value, torch.Tensor))]
    return peak_memory(lambda: _step(trainer, micro), device=trainer.ctx.device, resident=resident)


def _eval_seconds_per_image(trainer: Trainer) -> float:
    """Seconds per image of the evaluation's forward pass, on one validation batch."""
    images, _ = next(iter(trainer.data.val_loader))
    images = images.to(trainer.ctx.device)
    trainer.model.eval()
    with torch.no_grad(), autocast(trainer.ctx.device, trainer.cfg.amp):
        trainer.model(images)  # warm-up
        seconds = timed(lambda: trainer.model(images), trainer.ctx.device)
    trainer.model.train()
    return seconds / len(images)


def _flops(trainer: Trainer) -> float | None:
    """Forward GFLOPs of one image, where the model is one :func:`~ssog.models.count_flops` reads."""
    trainer.model.eval()  # one image: BatchNorm cannot train on it
    try:
        return count_flops(trainer.model, trainer.data.img_size)["total_gflops"]
    except (AttributeError, TypeError):  # a timm model without ssog's patch_embed / in_chans
        return None
    finally:
        trainer.model.train()


def dry_run(cfg: TrainConfig, steps: int = 3, nproc: int = 1, nnodes: int = 1) -> dict[str, Any]:
    """Build the run of ``cfg``, time ``steps`` optimizer steps (after one warm-up step) and the
    loader, and project the schedule's time on this device. Writes nothing.

    ``nproc`` processes (devices) on each of ``nnodes`` machines: the step is measured at the
    per-device batch (``batch_size`` over all devices) and the epoch projected for the global
    batch, each device evaluating its share; the time of the gradient all-reduce is not in it.

    Returns the report: ``params``, ``gflops_per_image`` (forward), ``step_s`` (median) and
    ``step_s_range``, ``model_images_per_s``, ``loader_images_per_s``, ``peak_memory_bytes``
    (per device), ``micro_batch`` and ``fits_micro_batch`` (with ``grad_accum_steps_needed``
    when smaller), ``eval_s_per_image``, ``steps_per_epoch``, ``epoch_s``, ``schedule_s``,
    ``epochs``, ``devices``, ``global_batch``, ``workers_over_cpus``, ...
    """
    if steps < 1:
        raise ValueError(f"--dry-run STEPS must be >= 1, got {steps}")
    if nproc < 1 or nnodes < 1:
        raise ValueError(f"--nproc and --nnodes must be >= 1, got {nproc} and {nnodes}")
    devices, global_batch = nproc * nnodes, cfg.batch_size
    if devices > 1 and global_batch % (devices * cfg.grad_accum_steps):  # one device: the real run's own check
        raise ValueError(f"batch_size {global_batch} must be divisible by the {devices} devices (--nproc {nproc} x "
                         f"--nnodes {nnodes}) x grad_accum_steps {cfg.grad_accum_steps}")
    cfg = dataclasses.replace(cfg, batch_size=global_batch // devices)  # one device's share
    ctx = init_distributed(cfg.device)
    if ctx.distributed:
        raise ValueError("--dry-run measures one process: run it without torchrun (--nproc N projects for N)")
    cpus = usable_cpus()
    # torch warns at every loader it starts when num_workers exceeds this machine's CPUs (a
    # cluster recipe's count measured on a laptop): said once, in the report, instead.
    with torch_settings(ctx.device, cfg.threads, cfg.deterministic), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        trainer, data = _build(cfg, ctx)
        accum = trainer.data.grad_accum_steps
        batches, loader_rate = _time_loader(trainer, accum * (steps + 1))
        fits = _fitting_micro_batch(trainer, batches[0])  # also the warm-up step
        micro = trainer.data.micro_batch
        needed = accum * math.ceil(micro / fits)
        while trainer.data.local_batch % needed:
            needed += 1
        chunks = needed // accum  # micro-batches of at most `fits` images per loader micro-batch
        times = []
        for step in range(steps):
            step_batches = batches[(step + 1) * accum:(step + 2) * accum]
            split = [(i.tensor_split(chunks)[c], t.tensor_split(chunks)[c]) for i, t in step_batches
                     for c in range(chunks)]
            times.append(_step(trainer, split))
        peak = _step_peak_memory(trainer, split)
        eval_per_image = _eval_seconds_per_image(trainer)
        gflops = _flops(trainer)
        threads = torch.get_num_threads() if ctx.device.type == "cpu" else None
    step_s = statistics.median(times)
    batch = trainer.data.local_batch
    loader_step_s = 0.0 if math.isnan(loader_rate) else batch / loader_rate
    # On a GPU, loader workers prepare the next batches while the model steps; on a CPU they
    # share its cores (and without workers, loading and steps alternate).
    overlapped = cfg.num_workers and ctx.device.type == "cuda"
    step_with_data = max(step_s, loader_step_s) if overlapped else step_s + loader_step_s
    steps_per_epoch = trainer.steps_per_epoch if data["stand_in"] is None and devices == 1 else \
        data["train_images"] // global_batch
    val_images = data["val_images"]
    eval_s = math.ceil(val_images / devices) * eval_per_image * (2 if trainer.ema is not None else 1)
    epoch_s = steps_per_epoch * step_with_data + eval_s
    return {
        "model": cfg.model, "dataset": cfg.dataset, "stand_in": data["stand_in"], "img_size": trainer.data.img_size,
        "device": str(ctx.device), "amp": cfg.amp, "threads": threads, "params": trainer.params,
        "gflops_per_image": gflops, "batch_size": batch, "grad_accum_steps": accum, "micro_batch": micro,
        "fits_micro_batch": fits, "grad_accum_steps_needed": needed if fits < micro else None,
        "steps_timed": steps, "step_s": step_s, "step_s_range": (min(times), max(times)),
        "model_images_per_s": batch / step_s, "loader_images_per_s": loader_rate, "num_workers": cfg.num_workers,
        "bottleneck": "data loader" if loader_step_s > step_s else "model", "peak_memory_bytes": peak,
        "eval_s_per_image": eval_per_image, "val_images": val_images,
        "train_images": data["train_images"], "steps_per_epoch": steps_per_epoch, "epoch_s": epoch_s,
        "epochs": trainer.num_epochs, "schedule_s": epoch_s * trainer.num_epochs,
        "devices": devices, "nproc": nproc, "nnodes": nnodes, "global_batch": global_batch,
        "workers_over_cpus": cfg.num_workers > cpus and cpus, "launch": None,
    }


def torchrun_line(train_args: Sequence[str], nproc: int, nnodes: int) -> str:
    """The command that launches the run a dry run measured: ``ssog train TRAIN_ARGS`` under
    torchrun on ``nproc`` processes per machine and ``nnodes`` machines (with the rendezvous
    of several machines to fill in)."""
    nodes = "--standalone" if nnodes == 1 else \
        f"--nnodes {nnodes} --rdzv-backend c10d --rdzv-endpoint HEAD_NODE:29500 --rdzv-id RUN_NAME"
    return f"torchrun {nodes} --nproc-per-node {nproc} -m ssog train {shlex.join(train_args)}".rstrip()


def format_dry_run(report: dict[str, Any]) -> str:
    """The report of :func:`dry_run` as the lines ``ssog train --dry-run`` prints."""
    r = report
    data = f"{r['dataset']}" + (f" (generated stand-in for {r['stand_in']})" if r["stand_in"] else "")
    threads = f", {r['threads']} thread{'s' if r['threads'] > 1 else ''}" if r["threads"] else ""
    flops = "n/a" if r["gflops_per_image"] is None else \
        f"{r['gflops_per_image']:.3g} forward (about {3 * r['gflops_per_image']:.3g} per training image)"
    low, high = r["step_s_range"]
    devices = "" if r["devices"] == 1 else \
        f" per device of {r['devices']} ({r['nnodes']} x {r['nproc']}: global batch {r['global_batch']})"
    lines = [
        f"dry run: {r['model']} on {data}, {r['img_size']} px, batch {r['batch_size']}{devices} "
        f"({r['grad_accum_steps']} x {r['micro_batch']}), amp {r['amp']}, on {r['device']}{threads}",
        f"  parameters       {r['params']:,}",
        f"  GFLOPs / image   {flops}",
        f"  step time        {r['step_s']:.3g} s (median of {r['steps_timed']}, {low:.3g}-{high:.3g})",
        f"  model            {r['model_images_per_s']:.1f} images/s",
        f"  data loader      {r['loader_images_per_s']:.1f} images/s alone ({r['num_workers']} workers"
        + (f", more than this machine's {r['workers_over_cpus']} CPUs: its rate, not the run's"
           if r["workers_over_cpus"] else "") + f"); the {r['bottleneck']} sets the pace",
        f"  peak memory      {r['peak_memory_bytes'] / 2**30:.2f} GiB (weights, optimizer state and a step's "
        "tensors)",
    ]
    if r["grad_accum_steps_needed"]:
        lines.append(f"  does not fit     a micro-batch of {r['micro_batch']} runs out of memory; "
                     f"{r['fits_micro_batch']} fits: keep batch {r['batch_size']} with "
                     f"--set grad_accum_steps={r['grad_accum_steps_needed']} (timed so)")
    lines += [
        f"  evaluation       {1000 * r['eval_s_per_image']:.3g} ms per image, {r['val_images']:,} images per epoch",
        f"  per epoch        {format_duration(r['epoch_s'])} ({r['steps_per_epoch']:,} steps of {r['train_images']:,} "
        "training images, evaluation included)",
        f"  whole schedule   {format_duration(r['schedule_s'])} ({r['epochs']} epochs"
        + (f", on each of {r['devices']} devices, the gradient all-reduce not included" if r["devices"] > 1 else "")
        + ")",
    ]
    if r["launch"]:
        lines.append(f"  launch           {r['launch']}")
    return "\n".join(lines)
