"""The training loop: timm's optimizers (layer-wise lr decay) and schedules, gradient
accumulation, mixup, EMA, AMP, DDP, exact resume.

Run folder (``cfg.output``, locked while the run writes it; what a run writes there is
:data:`RUN_FILES`): ``config.yaml``, ``environment.json``, ``last.safetensors`` (full state,
rewritten at every epoch end and every ``checkpoint_every`` steps), ``best.safetensors``
(weights of the best validation Acc@1), ``log.jsonl`` / ``log.csv`` / ``curves.png`` (one row
per epoch, with the mean gradient norm of each parameter group,
:class:`~ssog.train.metrics.GradNormMeter`) and, at the end, ``summary.json``.

Resuming restores weights, optimizer, scheduler, scaler, EMA, the sampler position and every
process's python/numpy/torch RNG state, so with ``deterministic`` on a CPU a resumed run ends
with exactly the metrics of an uninterrupted one (unless ``lr`` or ``epochs`` are changed on
resume, see :data:`RESUME_CHANGES`).

Nothing is written before every setting is checked and the data and model are built. A run
stops cleanly: on SIGINT/SIGTERM it finishes the step, saves ``last`` and raises
:class:`TrainingInterrupted`; a non-finite loss or weights raise :class:`TrainingDiverged`
and ``last`` keeps the last finite state (docs/training.md, "When a run stops").
"""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager, nullcontext, suppress
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch
import torch.distributed as dist
import yaml
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset
from tqdm import tqdm

from ssog.data import get_augmentation
from ssog.data.custom import CUSTOM_DATASET
from ssog.files import FolderLock, WriteError, is_temporary, write_atomic
from ssog.runtime import check_plotting, is_out_of_memory
from ssog.train.builders import apply_data_config, build_data, build_model
from ssog.train.checkpoint import check_state_dict, checkpoint_path, load_checkpoint, save_checkpoints
from ssog.train.config import TIMM_INIT_PREFIX, TrainConfig, upgrade_checkpoint_config
from ssog.train.distributed import DistContext, all_reduce_sum, init_distributed
from ssog.train.environment import record_environment
from ssog.train.logger import RunLogger, logging_backends, progress_bar
from ssog.train.metrics import GradNormMeter, autocast, evaluate
from ssog.train.transfer import check_finite_weights, freeze_backbone, init_from_checkpoint

__all__ = [
    "train", "Trainer", "TrainingDiverged", "TrainingInterrupted", "TrainingOutOfMemory", "RESUME_SETTINGS",
    "RESUME_CHANGES", "RUN_FILES",
]

#: Settings ``--resume`` may change without changing the run's results.
RESUME_SETTINGS = ("progress", "threads", "device", "num_workers")
#: Settings ``--resume`` may change that change the results: the resumed run is then no
#: longer bit-identical to an uninterrupted one (the learning-rate schedule is rebuilt).
RESUME_CHANGES = ("lr", "epochs")
#: What a run writes in its folder, and all it ever replaces or (with ``overwrite``) removes
#: there; every other file is the user's. Its temporaries are named ``.<one of these>.*.ssog-tmp*``.
RUN_FILES = ("config.yaml", "environment.json", "last.safetensors", "best.safetensors", "log.jsonl", "log.csv",
             "curves.png", "summary.json", "tensorboard", "wandb")
#: First line of the config.yaml a run writes: tells it from a user's recipe of that name.
CONFIG_HEADER = "# ssog train: the resolved configuration of the run in this folder\n"


class TrainingDiverged(FloatingPointError):
    """The loss or the weights became non-finite; ``last.safetensors`` keeps the last finite state."""


class TrainingOutOfMemory(MemoryError):
    """The device ran out of memory; ``last.safetensors`` keeps the last completed checkpoint."""


class TrainingInterrupted(Exception):
    """SIGINT/SIGTERM stopped the run at a step boundary; ``signum`` is the signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def torch_settings(cfg: TrainConfig, ctx: DistContext):
    """CPU threads and determinism for the run, restored afterwards (training is also a library call)."""
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    if ctx.device.type == "cpu" and cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by deterministic cuBLAS
    torch.use_deterministic_algorithms(cfg.deterministic)
    torch.backends.cudnn.benchmark = not cfg.deterministic
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1])
        torch.backends.cudnn.benchmark = saved[2]


def _scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, steps_per_epoch: int) -> tuple[Any, int]:
    """timm's ``create_scheduler_v2`` for ``cfg.sched`` and its options, stepped every optimizer
    step (plateau, which watches validation metrics, every epoch); with the number of epochs the
    schedule runs (``epochs`` + ``cooldown_epochs``, or more with warmup_prefix / cycles)."""
    per_epoch = cfg.sched == "plateau"
    try:
        return create_scheduler_v2(
            optimizer, sched=cfg.sched, num_epochs=cfg.epochs, decay_epochs=cfg.decay_epochs,
            decay_milestones=cfg.decay_milestones, decay_rate=cfg.decay_rate, patience_epochs=cfg.patience_epochs,
            cooldown_epochs=cfg.cooldown_epochs, warmup_epochs=cfg.warmup_epochs, warmup_lr=cfg.warmup_lr,
            min_lr=cfg.min_lr, step_on_epochs=per_epoch, updates_per_epoch=steps_per_epoch, **cfg.sched_kwargs,
        )
    except TypeError as error:  # an option create_scheduler_v2 does not take
        raise ValueError(f"sched_kwargs {cfg.sched_kwargs}: {error}") from None


class Trainer:
    """One training run in this process (rank ``ctx.rank`` of ``ctx.world_size``)."""

    def __init__(self, cfg: TrainConfig, ctx: DistContext, output: Path, resume_state: dict[str, Any] | None = None,
                 datasets: tuple[Dataset, Dataset] | None = None):
        self.cfg, self.ctx, self.output = cfg, ctx, output
        self.main = ctx.is_main
        self.data = build_data(cfg, ctx, datasets)
        self.steps_per_epoch = self.data.steps_per_epoch  # optimizer steps
        info = self.data.info

        _seed_all(cfg.seed)  # the same initial weights in every process
        self.model = build_model(cfg, info.num_classes, info.in_chans, self.data.img_size,
                                 load_timm_weights=resume_state is None)
        if cfg.init_from and not cfg.init_from.startswith(TIMM_INIT_PREFIX) and resume_state is None:
            init_from_checkpoint(self.model, cfg.init_from, cfg.init_keep_head, log=self.log)
        apply_data_config(self.model, self.data.data_config, info.classes)
        if cfg.linear_probe:
            trainable = freeze_backbone(self.model)
            self.log(f"linear probe: {trainable:,} trainable parameters (classifier only)")
        self.model.to(ctx.device)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.grad_norms = GradNormMeter(self.model)  # the partial epoch's, like the loss sums

        self.optimizer = create_optimizer_v2(self.model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                             layer_decay=cfg.layer_decay)
        self.scheduler, self.num_epochs = _scheduler(self.optimizer, cfg, self.steps_per_epoch)
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=cfg.amp == "fp16")
        self.ema = ModelEmaV3(self.model, decay=cfg.ema_decay) if cfg.ema_decay else None

        aug = get_augmentation(cfg.augment)
        mixup = aug.mixup if cfg.mixup is None else cfg.mixup
        cutmix = aug.cutmix if cfg.cutmix is None else cfg.cutmix
        self.mixup = None
        if mixup > 0 or cutmix > 0:
            if self.data.micro_batch % 2:
                raise ValueError("mixup/cutmix pair samples within a batch: the per-process batch size must be even "
                                 f"(batch_size / processes / grad_accum_steps = {self.data.micro_batch})")
            self.mixup = Mixup(mixup_alpha=mixup, cutmix_alpha=cutmix, label_smoothing=cfg.label_smoothing,
                               num_classes=info.num_classes)
            self.criterion = SoftTargetCrossEntropy()
        elif cfg.label_smoothing > 0:
            self.criterion = LabelSmoothingCrossEntropy(cfg.label_smoothing)
        else:
            self.criterion = torch.nn.CrossEntropyLoss()

        self.net = self.model
        #: DistributedDataParallel around the model (its no_sync skips the all-reduce of a micro-batch)
        self.ddp: DistributedDataParallel | None = None
        if ctx.distributed:
            self.net = self.ddp = DistributedDataParallel(
                self.model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
        if cfg.compile:
            self.net = torch.compile(self.net)

        # progress: epochs completed, optimizer steps taken, and the partial epoch's loss sums
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.loss_sum, self.loss_count, self.epoch_time = 0.0, 0, 0.0
        #: this process's training loss since the last per-step log: (sum, images, start time)
        self.window: tuple[float, int, float] = (0.0, 0, time.perf_counter())
        #: whether the state came from a checkpoint (W&B then resumes its run)
        self.resumed = resume_state is not None
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"acc1": -1.0, "epoch": 0}
        _seed_all(cfg.seed + ctx.rank)  # per-process randomness (mixup, drop-path)
        #: :meth:`position` of the newest last.safetensors, None before the first save
        self.saved_at: tuple[int, int] | None = None
        #: the signal that asked the run to stop at the next step boundary
        self.stop_signal: int | None = None
        if resume_state is not None:
            self._restore(resume_state)
            self.saved_at = self.position()
        self.logger: RunLogger | None = None  # created by run(), once the run folder exists

    def position(self) -> tuple[int, int]:
        """``(epoch, step)``: the epoch in progress (or just completed, 1-based) and the
        optimizer steps taken."""
        return self.epoch + (1 if self.step_in_epoch else 0), self.global_step

    def log(self, message: str) -> None:
        if self.main:
            tqdm.write(message)

    # ------------------------------------------------------------------ checkpoints
    def _state(self) -> dict[str, Any]:
        """The full training state; RNG states are gathered from every process."""
        rng = [_rng_state()]
        if self.ctx.distributed:
            rng = [None] * self.ctx.world_size
            dist.all_gather_object(rng, _rng_state())
        progress = {
            "epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
            "loss_sum": self.loss_sum, "loss_count": self.loss_count, "epoch_time": self.epoch_time,
            "grad_norm": self.grad_norms.state_dict(),
        }
        if self.data.stream is not None:
            progress["stream"] = self._stream_state()
        return {
            "kind": "last",
            "config": self.cfg.to_dict(),
            "classes": list(self.data.info.classes),
            "model": self.model.state_dict(),
            "ema": self.ema.module.state_dict() if self.ema else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng,
            "world_size": self.ctx.world_size,
            "data_config": self.data.data_config,
            "progress": progress,
            "history": self.history,
            "best": self.best,
        }

    def _stream_state(self) -> dict[str, Any]:
        """Every reader's shard position in the epoch (each process knows its own readers)."""
        parts = [self.data.stream.state_dict()]
        if self.ctx.distributed:
            parts = [None] * self.ctx.world_size
            dist.all_gather_object(parts, self.data.stream.state_dict())
        return {"readers": parts[0]["readers"],
                "finished": {reader: done for part in parts for reader, done in part["finished"].items()}}

    def save_last(self, best: dict[str, Any] | None = None) -> None:
        """Write ``last.safetensors`` (and, given the ``best`` epoch's metrics, ``best.safetensors``
        with it: both change or neither does), unless the weights are no longer finite (then
        raise :class:`TrainingDiverged`, keeping the previous, finite checkpoint)."""
        self._check_finite_weights()
        state = self._state()  # every process takes part (RNG gather)
        if self.main:
            states = {self.output / "last.safetensors": state}
            if best is not None:
                states = {self.output / "best.safetensors": self._best_state(best), **states}
            save_checkpoints(states)
        self.saved_at = self.position()

    def _check_finite_weights(self) -> None:
        bad = next((name for name, p in self.model.named_parameters() if not torch.isfinite(p).all()), None)
        if bad is not None:
            self._diverged(f"parameter {bad} is no longer finite")

    def _diverged(self, what: str) -> None:
        cfg = self.cfg
        if self.saved_at is None:
            kept = "no checkpoint had been saved yet"
            hint = "lower lr" + ("" if cfg.clip_grad else " or set clip_grad")
        else:
            epoch, step = self.saved_at
            kept = f"the last finite checkpoint {self.output / 'last.safetensors'} (epoch {epoch}, step {step}) is kept"
            hint = (f"resume it with a lower learning rate: ssog train --resume {self.output} --lr {cfg.lr / 10:g}"
                    + ("" if cfg.clip_grad else " (or start again with clip_grad set)"))
        raise TrainingDiverged(f"training diverged at epoch {self.epoch + 1} step {self.global_step + 1}: "
                               f"{what} (lr {cfg.lr:g}); {kept}; {hint}")

    def _stop_if_asked(self) -> None:
        """At a step boundary, after a SIGINT/SIGTERM: save (one process) and stop."""
        if self.stop_signal is None:
            return
        if not self.ctx.distributed and self.saved_at != self.position():
            self.save_last()
        # Several processes could not agree on one step to save without a collective per
        # step, so a distributed run keeps its newest checkpoint.
        epoch, step = self.position()
        kept = "" if self.saved_at in (None, self.position()) else \
            f" (its last checkpoint, kept, is at epoch {self.saved_at[0]} step {self.saved_at[1]})"
        resume = f"resume with ssog train --resume {self.output}" if self.saved_at else "no checkpoint was saved"
        raise TrainingInterrupted(f"interrupted at epoch {epoch} step {step}{kept}; {resume}", self.stop_signal)

    @contextmanager
    def _signals_stop_at_step_boundary(self) -> Iterator[None]:
        """SIGINT/SIGTERM set :attr:`stop_signal`; a second one stops at once (KeyboardInterrupt)."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be installed from the main thread
            return

        def handler(signum: int, frame: Any) -> None:
            if self.stop_signal is not None:
                raise KeyboardInterrupt
            self.stop_signal = signum

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def _best_state(self, metrics: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": "best", "config": self.cfg.to_dict(), "classes": list(self.data.info.classes),
            "data_config": self.data.data_config, "model": self.model.state_dict(),
            "ema": self.ema.module.state_dict() if self.ema else None,
            "progress": {"epoch": self.epoch, "global_step": self.global_step}, "metrics": metrics,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        check_state_dict(self.model, state["model"], "the checkpoint")
        check_finite_weights(state["model"], "the checkpoint")
        self.model.load_state_dict(state["model"])
        if self.ema is not None:
            if state.get("ema") is None:
                raise ValueError("the checkpoint has no EMA weights but the config enables EMA")
            self.ema.module.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        saved = state["config"]
        schedule_changed = any(saved.get(key) != getattr(self.cfg, key) for key in RESUME_CHANGES)
        if not schedule_changed:
            self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        progress = state["progress"]
        self.epoch, self.step_in_epoch = progress["epoch"], progress["step_in_epoch"]
        self.global_step = progress["global_step"]
        self.loss_sum, self.loss_count = progress["loss_sum"], progress["loss_count"]
        self.epoch_time = progress["epoch_time"]
        self.grad_norms.load_state_dict(progress.get("grad_norm", {}))  # absent in older checkpoints
        self.history, self.best = state["history"], state["best"]
        if self.step_in_epoch > self.steps_per_epoch:
            raise ValueError(f"checkpoint is at step {self.step_in_epoch} of an epoch that has only "
                             f"{self.steps_per_epoch} steps: the data or batch size changed")
        stream = self.data.stream
        if stream is not None and self.step_in_epoch and not stream.load_state_dict(progress.get("stream") or {}):
            self.log(f"note: the stream of {self.cfg.dataset} cannot continue inside epoch {self.epoch + 1} "
                     "(another number of processes x loader workers, or a source that restarts its epochs): "
                     "the epoch's remaining steps read its stream from the start")
        if schedule_changed:  # the new schedule's learning rate at the step reached
            self.scheduler.step_update(num_updates=self.global_step)
        if state["world_size"] == self.ctx.world_size:
            _set_rng_state(state["rng"][self.ctx.rank])
        else:
            self.log(f"resuming on {self.ctx.world_size} processes from a run on {state['world_size']}: "
                     "the random streams (mixup, drop-path) restart, so results will not match an "
                     "uninterrupted run exactly")
        self.log(f"resumed at epoch {self.epoch + 1}, step {self.global_step}")

    # ------------------------------------------------------------------ loop
    def _forward_backward(self, images: torch.Tensor, targets: torch.Tensor, sync: bool) -> float:
        """One micro-batch: forward, and backward of its loss / ``grad_accum_steps``, adding to the
        gradients (under DDP all-reduced only when ``sync``, the step's last micro-batch)."""
        cfg = self.cfg
        images = images.to(self.ctx.device, non_blocking=True)
        targets = targets.to(self.ctx.device, non_blocking=True)
        if self.mixup is not None:
            images, targets = self.mixup(images, targets)
        with self.ddp.no_sync() if self.ddp is not None and not sync else nullcontext():
            with autocast(self.ctx.device, cfg.amp):
                loss = self.criterion(self.net(images), targets)
            value = loss.item()
            if not np.isfinite(value):
                self._diverged(f"the loss is {value}")
            self.scaler.scale(loss / cfg.grad_accum_steps).backward()
        return value

    def _optimizer_step(self) -> None:
        cfg = self.cfg
        self.scaler.unscale_(self.optimizer)  # a no-op without fp16
        self.grad_norms.update()
        if cfg.clip_grad:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)
        self.scheduler.step_update(num_updates=self.global_step)

    def lr(self) -> float:
        """The schedule's learning rate now (with layer_decay, the head's: the largest)."""
        return max(group["lr"] for group in self.optimizer.param_groups)

    def _log_step(self) -> None:
        """Every ``log_every`` steps: the window's mean training loss (this process's), the lr and
        the throughput to TensorBoard / W&B, and a line when stderr is not a terminal."""
        cfg = self.cfg
        if not (cfg.log_every and self.global_step % cfg.log_every == 0 and self.main):
            return
        loss_sum, count, start = self.window
        elapsed = time.perf_counter() - start
        scalars = {"train/loss": loss_sum / max(count, 1), "train/lr": self.lr(),
                   "train/images_per_s": count * self.ctx.world_size / elapsed if elapsed > 0 else 0.0}
        self.logger.log_step(self.global_step, scalars)
        self.window = (0.0, 0, time.perf_counter())
        if cfg.progress and not sys.stderr.isatty():
            self.log(f"epoch {self.epoch + 1}/{self.num_epochs} step {self.step_in_epoch}/{self.steps_per_epoch} "
                     f"(step {self.global_step}): loss {scalars['train/loss']:.4f}, lr {scalars['train/lr']:.3g}, "
                     f"{scalars['train/images_per_s']:.1f} images/s")

    def _train_epoch(self) -> None:
        loader, cfg = self.data.train_loader, self.cfg
        self.data.start_epoch(self.epoch, self.step_in_epoch)
        self.net.train()
        bar = progress_bar(self.main and cfg.progress, total=self.steps_per_epoch, initial=self.step_in_epoch,
                           desc=f"epoch {self.epoch + 1}/{self.num_epochs}")
        start = time.perf_counter() - self.epoch_time
        self.window = (0.0, 0, time.perf_counter())
        micro = 0
        try:
            for images, targets in loader:
                micro += 1
                sync = micro % cfg.grad_accum_steps == 0
                loss = self._forward_backward(images, targets, sync)
                self.loss_sum += loss * len(images)
                self.loss_count += len(images)
                self.window = (self.window[0] + loss * len(images), self.window[1] + len(images), self.window[2])
                if not sync:
                    continue
                self._optimizer_step()
                self.step_in_epoch += 1
                bar.update()
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{self.lr():.2e}")
                self.epoch_time = time.perf_counter() - start
                self._log_step()
                if cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0 \
                        and self.step_in_epoch < self.steps_per_epoch:
                    self.save_last()
                self._stop_if_asked()
                if self.step_in_epoch == self.steps_per_epoch:
                    break  # micro-batches short of a whole step are left for the next epoch's shuffle
        except RuntimeError:
            # A terminal's Ctrl-C also reaches the loader's workers, which then exit: the
            # loader's complaint about that is the interruption, not an error.
            if self.stop_signal is None:
                raise
            self._stop_if_asked()
        finally:
            bar.close()

    def _end_epoch(self) -> dict[str, Any]:
        cfg = self.cfg
        loss_sum, loss_count = all_reduce_sum([self.loss_sum, self.loss_count], self.ctx)
        val = evaluate(self.model, self.data.val_loader, self.ctx, cfg.amp)
        record: dict[str, Any] = {
            "epoch": self.epoch + 1, "step": self.global_step, "lr": self.lr(),
            "train_loss": loss_sum / loss_count, "val_loss": val["loss"],
            "acc1": val["acc1"], "acc3": val["acc3"], "acc5": val["acc5"],
        }
        if self.ema is not None:
            ema = evaluate(self.ema.module, self.data.val_loader, self.ctx, cfg.amp)
            record.update({f"ema_{k}": v for k, v in ema.items()})
        record["epoch_time_s"] = self.epoch_time
        record["grad_norm"] = self.grad_norms.means()
        self.epoch += 1
        self.step_in_epoch, self.loss_sum, self.loss_count, self.epoch_time = 0, 0.0, 0, 0.0
        self.grad_norms.reset()
        metric = record["acc1"] if self.cfg.sched_kwargs.get("plateau_mode", "max") == "max" else record["val_loss"]
        self.scheduler.step(self.epoch, metric)  # schedules stepped per epoch (plateau); the others ignore it
        return record

    def run(self) -> dict[str, Any]:
        """Train to the schedule's end (``cfg.epochs``, plus ``cooldown_epochs``; from where a
        resumed state left off) in the existing run folder."""
        cfg = self.cfg
        if self.main:
            self.logger = RunLogger(self.output, cfg.to_dict(), cfg.tensorboard, cfg.wandb_project,
                                    resumed_at=self.global_step if self.resumed else None)
        with self._signals_stop_at_step_boundary():
            try:
                return self._run()
            except WriteError as error:  # a full disk: one line, the run resumable
                raise WriteError(error.errno, f"{error}; {self._resumable()}") from error
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                raise TrainingOutOfMemory(
                    f"out of memory on {self.ctx.device} at epoch {self.epoch + 1} step {self.global_step + 1} "
                    f"({cfg.model}, batch {cfg.batch_size}, {self.data.img_size}px); {self._resumable()}") from None

    def _resumable(self) -> str:
        """Where a failed run can be resumed from."""
        if self.saved_at is None:
            return "no checkpoint had been saved yet"
        epoch, step = self.saved_at
        return (f"the last checkpoint {self.output / 'last.safetensors'} (epoch {epoch}, step {step}) is kept; "
                f"resume it with ssog train --resume {self.output}")

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.main:
            self.log(f"training {cfg.model} ({self.params:,} parameters) on {cfg.dataset} "
                     f"({len(self.data.train_loader.dataset)} train / {len(self.data.val_loader.dataset)} val, "
                     f"{self.data.img_size}px) for {self.num_epochs} epochs, {self.steps_per_epoch} steps each, "
                     f"on {self.ctx.world_size} x {self.ctx.device.type}; output {self.output}")
        while self.epoch < self.num_epochs:
            self._train_epoch()
            record = self._end_epoch()
            improved = record["acc1"] > self.best["acc1"]
            if improved:
                self.best = {"acc1": record["acc1"], "epoch": record["epoch"]}
            self.history.append(record)
            # The checkpoints first, then the logs: a failure in between (a full disk) leaves a
            # run resumable at this epoch, and resuming rewrites the logs from the history.
            self.save_last(best=record if improved else None)
            if self.main:
                self.logger.log_epoch(self.history, final=self.epoch == self.num_epochs)
                self.log(f"epoch {record['epoch']}/{self.num_epochs}: train loss {record['train_loss']:.4f}, "
                         f"val loss {record['val_loss']:.4f}, Acc@1 {record['acc1']:.2f}, "
                         f"Acc@5 {record['acc5']:.2f} ({record['epoch_time_s']:.1f}s)")
            self._stop_if_asked()
        summary = self._summary()
        if self.main:
            write_atomic(self.output / "summary.json", json.dumps(summary, indent=2) + "\n")
            self.logger.close()
            self.log(_format_summary(summary, self.output))
        return summary

    def _summary(self) -> dict[str, Any]:
        final = self.history[-1]
        times = [r["epoch_time_s"] for r in self.history]
        summary = {
            "acc1": final["acc1"], "acc3": final["acc3"], "acc5": final["acc5"], "loss": final["val_loss"],
            "epochs": final["epoch"], "params": self.params,
            "best_acc1": self.best["acc1"], "best_epoch": self.best["epoch"], "train_loss": final["train_loss"],
            "model": self.cfg.model, "dataset": self.cfg.dataset, "img_size": self.data.img_size,
            "steps": self.global_step, "world_size": self.ctx.world_size,
            "train_time_s": sum(times), "time_per_epoch_s": sum(times) / len(times),
        }
        summary.update({k: v for k, v in final.items() if k.startswith("ema_")})
        return summary


def _format_summary(summary: dict[str, Any], output: Path) -> str:
    lines = [
        f"done: {summary['model']} on {summary['dataset']}, {summary['epochs']} epochs, "
        f"{summary['params']:,} parameters, {summary['train_time_s']:.0f}s "
        f"({summary['time_per_epoch_s']:.1f}s per epoch)",
        f"  final  Acc@1 {summary['acc1']:.2f}  Acc@3 {summary['acc3']:.2f}  Acc@5 {summary['acc5']:.2f}  "
        f"val loss {summary['loss']:.4f}",
        f"  best   Acc@1 {summary['best_acc1']:.2f} (epoch {summary['best_epoch']})",
    ]
    if "ema_acc1" in summary:
        lines.append(f"  EMA    Acc@1 {summary['ema_acc1']:.2f}  Acc@5 {summary['ema_acc5']:.2f}")
    lines.append(f"  files  {output}/summary.json, log.jsonl, log.csv, curves.png, last/best.safetensors")
    return "\n".join(lines)


def _output_dir(cfg: TrainConfig, ctx: DistContext) -> Path:
    """``cfg.output`` or ``runs/<timestamp>-<6 random hex digits>`` (chosen by rank 0 and shared):
    runs started in the same second never share a folder."""
    default = Path("runs") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    name = [cfg.output or str(default)]
    if ctx.distributed:
        dist.broadcast_object_list(name, src=0)
    return Path(name[0])


def _is_run_config(path: Path) -> bool:
    """Whether ``path`` is the config.yaml of a run (this version's header, or an older run's
    full dump naming this folder), not a user's recipe that a run would replace."""
    try:
        text = path.read_text()
        if text.startswith(CONFIG_HEADER):
            return True
        values = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return (isinstance(values, dict) and not {"base", "variants"} & set(values)
            and set(values) <= set(TrainConfig.__dataclass_fields__) and len(values) >= 30
            and values.get("output") is not None and Path(values["output"]).resolve() == path.parent.resolve())


def _check_output(output: Path, resuming: bool, overwrite: bool = False) -> None:
    """Raise ValueError unless a new run (or the resumed one) can be written to ``output``.

    A new run refuses a folder that holds files of another run (:data:`RUN_FILES`) unless
    ``overwrite``, and a ``config.yaml`` that is not a run's (a recipe) always.
    """
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is an existing file, not a folder; choose another --output")
    if not resuming and output.is_dir():
        config = output / "config.yaml"
        if config.is_file() and not _is_run_config(config):
            raise ValueError(f"--output {output} holds a config.yaml that is not a run's (a recipe?), which the run "
                             "would replace; choose another --output")
        found = [name for name in RUN_FILES if (output / name).exists()]
        if found and not overwrite:
            hint = f"continue it with --resume {output}, " if "last.safetensors" in found else ""
            raise ValueError(f"{output} already holds a run ({', '.join(found)}): {hint}choose another --output, "
                             "or pass --overwrite to replace that run's files")
    existing = next(parent for parent in (output, *output.parents) if parent.exists())
    if not existing.is_dir():
        raise ValueError(f"--output {output}: {existing} is a file, not a folder; choose another --output")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--output {output}: {existing} is not writable; choose another --output")


def _claim_run_folder(output: Path, cfg: TrainConfig, resuming: bool) -> FolderLock:
    """Create and lock the run folder, check it again under the lock (another run may have
    used it meanwhile), clear this run's leftovers and write ``config.yaml``."""
    created = not output.exists()
    try:
        output.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(output, "training run")
    except FileExistsError as error:
        raise ValueError(str(error)) from None
    except OSError as error:  # e.g. a read-only file system, which os.access may not tell
        raise ValueError(f"cannot write the run folder {output}: {error.strerror or error}") from error
    try:
        _check_output(output, resuming, cfg.overwrite)
        ours = tuple(f".{name}." for name in RUN_FILES)
        for entry in output.iterdir():
            if is_temporary(entry) and entry.name.startswith(ours):  # left by a run killed while saving
                entry.unlink()
            elif cfg.overwrite and not resuming and entry.name in RUN_FILES:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        write_atomic(output / "config.yaml", CONFIG_HEADER + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    except BaseException:
        lock.release()
        if created:
            with suppress(OSError):
                output.rmdir()  # only if empty: it was created for this run
        raise
    return lock


def _apply_resume_changes(cfg: TrainConfig, changes: Mapping[str, Any], epochs_done: int) -> list[str]:
    """Set ``changes`` on a resumed run's ``cfg``; return notes for the ones that change its results."""
    allowed = RESUME_SETTINGS + RESUME_CHANGES
    refused = sorted(set(changes) - set(allowed))
    if refused:
        raise ValueError(f"--resume continues a run with its saved settings; {', '.join(refused)} cannot "
                         f"change (allowed: {', '.join(allowed)})")
    notes = []
    for key, value in changes.items():
        if key in RESUME_CHANGES and value != getattr(cfg, key):
            notes.append(f"note: {key} changed from {getattr(cfg, key)} to {value} on resume: the run is "
                         "no longer bit-identical to an uninterrupted one")
        setattr(cfg, key, value)
    cfg.validate()
    if cfg.epochs + cfg.cooldown_epochs < epochs_done:
        cooldown = f" + cooldown_epochs={cfg.cooldown_epochs}" if cfg.cooldown_epochs else ""
        raise ValueError(f"epochs={cfg.epochs}{cooldown} is fewer than the {epochs_done} epochs this run has done")
    return notes


def _given_datasets(cfg: TrainConfig, train_dataset: Dataset | None, val_dataset: Dataset | None,
                    resuming: bool) -> tuple[Dataset, Dataset] | None:
    """``(train_dataset, val_dataset)`` if given (both or neither), with ``cfg.dataset`` set to
    ``custom``; a custom run resumed without them is an error."""
    if (train_dataset is None) != (val_dataset is None):
        raise ValueError("give both train_dataset and val_dataset, or neither")
    if train_dataset is None:
        if cfg.dataset == CUSTOM_DATASET:
            raise ValueError("this run trained on datasets given in Python: pass them again, "
                             "train(resume=DIR, train_dataset=..., val_dataset=...)" if resuming else
                             f"dataset {CUSTOM_DATASET!r} needs train_dataset and val_dataset")
        return None
    if resuming and cfg.dataset != CUSTOM_DATASET:
        raise ValueError(f"this run trained on dataset {cfg.dataset!r}; resume it without train_dataset/val_dataset")
    if cfg.data_dir is not None:
        raise ValueError("data_dir is set but the datasets are given in Python; leave data_dir unset")
    cfg.dataset = CUSTOM_DATASET
    return train_dataset, val_dataset


def train(cfg: TrainConfig | None = None, *, resume: str | Path | None = None,
          resume_changes: Mapping[str, Any] | None = None, train_dataset: Dataset | None = None,
          val_dataset: Dataset | None = None) -> dict[str, Any]:
    """Train and return the summary (also written to ``<output>/summary.json``).

    ``train_dataset``, ``val_dataset``: map-style datasets of ``(PIL image, class index)`` to
    train on instead of ``cfg.dataset`` (which the run then records as ``custom``); the run's
    augmentation and data config transform them (:func:`ssog.data.custom.custom_datasets`).
    A run trained on them resumes with the same two datasets passed again.

    ``resume``: a run folder (or a checkpoint file) to continue; the configuration then
    comes from the checkpoint, and ``cfg`` must be None. ``resume_changes`` may set the fields
    of :data:`RESUME_SETTINGS` and :data:`RESUME_CHANGES` on resume. Launch under ``torchrun``
    for DDP.

    Every setting is checked, and the data and model built, before the run folder is created.
    Raises :class:`TrainingInterrupted` after SIGINT/SIGTERM and :class:`TrainingDiverged` on a
    non-finite loss or weights, both with ``last.safetensors`` saved or kept.
    """
    if resume is not None and cfg is not None:
        raise ValueError("--resume continues a run with its saved configuration: give no other config")
    if resume_changes and resume is None:
        raise ValueError("resume_changes apply to a resumed run only")
    if resume_changes and resume_changes.get("overwrite"):
        raise ValueError("--overwrite starts a new run in place of another; --resume continues the run: give one")
    state, notes = None, []
    if resume is not None:
        path = checkpoint_path(resume, "last")
        state = load_checkpoint(path)
        if state.get("kind") != "last":
            raise ValueError(f"{path} is a {state.get('kind')!r} checkpoint; resume needs a run's last.safetensors")
        cfg = TrainConfig.from_dict(upgrade_checkpoint_config(state["config"]))
        cfg.output = str(path.parent)
        notes = _apply_resume_changes(cfg, resume_changes or {}, state["progress"]["epoch"])
    cfg = cfg or TrainConfig()
    if state is None and cfg.data_dir is not None:
        # Stored resolved: evaluating the run from another folder must read the same data.
        cfg.data_dir = str(Path(cfg.data_dir).expanduser().resolve())
    datasets = _given_datasets(cfg, train_dataset, val_dataset, resuming=state is not None)
    logging_backends(cfg.tensorboard, cfg.wandb_project)  # a missing package is a setting error
    check_plotting()
    ctx = init_distributed(cfg.device)
    lock = None
    try:
        output = _output_dir(cfg, ctx)
        cfg.output = str(output)
        if ctx.is_main:
            _check_output(output, resuming=state is not None, overwrite=cfg.overwrite)
            if cfg.linear_probe and not cfg.init_from:
                print("warning: --linear-probe without --init-from trains a classifier on a randomly initialised, "
                      "frozen backbone; give --init-from CKPT to probe a trained one", file=sys.stderr)
        with torch_settings(cfg, ctx):
            trainer = _build_trainer(cfg, ctx, output, state, datasets)
            if ctx.is_main:
                lock = _claim_run_folder(output, cfg, resuming=state is not None)
                record_environment(output, resumed=state is not None)
                for note in ([lock.note] if lock.note else []) + notes:
                    trainer.log(note)
            return trainer.run()
    finally:
        if lock is not None:
            lock.release()
        if ctx.distributed and dist.is_initialized():
            dist.destroy_process_group()


def _build_trainer(cfg: TrainConfig, ctx: DistContext, output: Path, state: dict[str, Any] | None,
                   datasets: Any = None) -> Trainer:
    """:class:`Trainer`, with running out of memory while building it (a model too large for the
    device at this ``img_size``) as one line."""
    try:
        return Trainer(cfg, ctx, output, state, datasets)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        size = f"img_size {cfg.img_size}" if cfg.img_size else "the data's image size"
        raise TrainingOutOfMemory(f"out of memory on {ctx.device} preparing {cfg.model} and its data at {size} with "
                                  f"batch_size {cfg.batch_size}; lower --img-size or --batch-size") from None
