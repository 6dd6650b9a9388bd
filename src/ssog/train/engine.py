"""The training loop (:class:`Trainer`): timm's optimizers (layer-wise lr decay) and
schedules, gradient accumulation, mixup, EMA, AMP, DDP, exact resume.

Run folder (``cfg.output``, locked while the run writes it; what a run writes there is
:data:`~ssog.train.run_folder.RUN_FILES`): ``config.yaml``, ``environment.json``,
``last.safetensors`` (full state, rewritten at every epoch end and every ``checkpoint_every``
steps), ``best.safetensors`` (weights of the best validation Acc@1, the EMA's with EMA), ``log.jsonl`` /
``log.csv`` / ``curves.png`` (one row per epoch, with the mean gradient norm of each parameter
group, :class:`~ssog.train.metrics.GradNormMeter`) and, at the end, ``summary.json``.

Resuming restores weights, optimizer, scheduler, scaler, EMA, the sampler position and every
process's python/numpy/torch RNG state (:mod:`ssog.train.state`), so with ``deterministic`` on
a CPU a resumed run ends with exactly the metrics of an uninterrupted one (unless ``lr`` or
``epochs`` are changed on resume, see :data:`~ssog.train.state.RESUME_CHANGES`).

A run stops cleanly (:mod:`ssog.train.stopping`): on SIGINT, SIGTERM or SIGUSR1 reaching any
of its processes or loader workers, in any order, it finishes the step, saves ``last`` and
raises :class:`TrainingInterrupted`; a non-finite loss or weights raise
:class:`TrainingDiverged` and ``last`` keeps the last finite state (docs/training.md, "When a
run stops"). The library entry that checks the settings and claims the folder is
:func:`ssog.train.api.train`.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.utils import ModelEmaV3
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from ssog.data import get_augmentation
from ssog.files import FolderLock, WriteError, holds_lock, write_atomic
from ssog.models.weights import load_weights_into
from ssog.runtime import autocast, cpu_seconds, is_out_of_memory
from ssog.train.builders import apply_data_config, build_data, build_model, build_scheduler
from ssog.train.checkpoint import MODEL_KEY, save_checkpoints
from ssog.train.config import TIMM_INIT_PREFIX, TrainConfig
from ssog.train.distributed import (
    DistContext, PeerStopped, agreed_stop, all_reduce_sum, barrier, is_peer_failure, peer_stopped_message,
)
from ssog.train.logger import RunLogger, progress_bar
from ssog.train.metrics import GradNormMeter, evaluate
from ssog.train.state import RESUME_CHANGES, Progress, gather_rng_states, seed_all, set_rng_state
from ssog.train.stopping import (
    StopRequest, TrainingDiverged, TrainingInterrupted, TrainingOutOfMemory, diverged_message, interrupted_message,
    resumable_message,
)
from ssog.train.transfer import freeze_backbone, init_from_checkpoint

__all__ = ["Trainer"]

logger = logging.getLogger(__name__)


class Trainer:
    """One training run in this process (rank ``ctx.rank`` of ``ctx.world_size``)."""

    def __init__(self, cfg: TrainConfig, ctx: DistContext, output: Path, resume_state: dict[str, Any] | None = None,
                 datasets: tuple[Dataset, Dataset] | None = None):
        self.cfg, self.ctx, self.output = cfg, ctx, output
        self.main = ctx.is_main
        self.data = build_data(cfg, ctx, datasets)
        self.steps_per_epoch = self.data.steps_per_epoch  # optimizer steps
        info = self.data.info

        seed_all(cfg.seed)  # the same initial weights in every process
        self.model = build_model(cfg, info.num_classes, info.in_chans, self.data.img_size,
                                 load_timm_weights=resume_state is None)
        if cfg.init_from and not cfg.init_from.startswith(TIMM_INIT_PREFIX) and resume_state is None:
            init_from_checkpoint(self.model, cfg.init_from, cfg.init_keep_head)
        apply_data_config(self.model, self.data.data_config, info.classes)
        if cfg.linear_probe:
            trainable = freeze_backbone(self.model)
            self._info(f"linear probe: {trainable:,} trainable parameters (classifier only)")
        self.model.to(ctx.device)
        self.params = sum(p.numel() for p in self.model.parameters())

        self.optimizer = create_optimizer_v2(self.model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                             layer_decay=cfg.layer_decay)
        self.scheduler, self.num_epochs = build_scheduler(self.optimizer, cfg, self.steps_per_epoch)
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=cfg.amp == "fp16")
        self.ema = ModelEmaV3(self.model, decay=cfg.ema_decay) if cfg.ema_decay else None

        aug = get_augmentation(cfg.augment)
        mixup = aug.mixup if cfg.mixup is None else cfg.mixup
        cutmix = aug.cutmix if cfg.cutmix is None else cfg.cutmix
        self.mixup = None
        self.criterion: torch.nn.Module
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
            self.net = torch.compile(self.net)  # type: ignore[assignment]  # torch types the result as a callable

        #: epochs and steps done and the partial epoch's sums (the checkpoint's ``"progress"``)
        self.progress = Progress(GradNormMeter(self.model), self.data.stream)
        #: this process's training loss since the last per-step log: (sum, images, start time)
        self.window: tuple[float, int, float] = (0.0, 0, time.perf_counter())
        #: whether the state came from a checkpoint (W&B then resumes its run)
        self.resumed = resume_state is not None
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"acc1": -1.0, "epoch": 0}
        seed_all(cfg.seed + ctx.rank)  # per-process randomness (mixup, drop-path)
        #: :meth:`Progress.position` of the newest last.safetensors, None before the first save
        self.saved_at: tuple[int, int] | None = None
        #: the signal that asked the run to stop at the next step boundary
        self.stop = StopRequest()
        if resume_state is not None:
            self._restore(resume_state)
            self.saved_at = self.progress.position()
        self.run_log: RunLogger | None = None  # created by run(), once the run folder exists

    @property
    def global_step(self) -> int:
        """Optimizer steps taken."""
        return self.progress.global_step

    def _info(self, message: str) -> None:
        """Log ``message`` (info) from the main process only."""
        if self.main:
            logger.info(message)

    # ------------------------------------------------------------------ checkpoints
    def _state(self) -> dict[str, Any]:
        """The full training state; RNG states are gathered from every process."""
        return {
            "kind": "last",
            "config": self.cfg.to_dict(),
            "classes": list(self.data.info.classes),
            MODEL_KEY: self.model.state_dict(),
            "ema": self.ema.module.state_dict() if self.ema else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": gather_rng_states(self.ctx),
            "world_size": self.ctx.world_size,
            "data_config": self.data.data_config,
            "progress": self.progress.state_dict(self.ctx),
            "history": self.history,
            "best": self.best,
        }

    def save_last(self, best: dict[str, Any] | None = None) -> None:
        """Write ``last.safetensors`` (and, given the ``best`` epoch's metrics, ``best.safetensors``
        with it: both change or neither does), unless the weights are no longer finite (then
        raise :class:`TrainingDiverged`, keeping the previous, finite checkpoint)."""
        self._check_finite_weights()
        state = self._state()  # every process takes part (RNG and stream gathers)
        if self.main:
            self._check_run_folder()
            states: dict[str | Path, dict[str, Any]] = {self.output / "last.safetensors": state}
            if best is not None:
                states = {self.output / "best.safetensors": self._best_state(best), **states}
            save_checkpoints(states)
        self.saved_at = self.progress.position()

    def _check_run_folder(self) -> None:
        """Raise FileNotFoundError when the run folder (or its lock) is gone, or the lock is
        another process's: a checkpoint written now would recreate the folder without its
        config, marker and lock, or write into a folder another run took over."""
        if not holds_lock(self.output):
            lock = self.output / FolderLock.NAME
            what = "was taken over by another process" if lock.is_file() else "was removed"
            raise FileNotFoundError(
                f"the run folder {self.output} (or its lock {FolderLock.NAME}) {what} while the run trained; "
                "stopped without writing there; start the run again")

    def _check_finite_weights(self) -> None:
        bad = next((name for name, p in self.model.named_parameters() if not torch.isfinite(p).all()), None)
        if bad is not None:
            self._diverged(f"parameter {bad} is no longer finite")

    def _diverged(self, what: str) -> None:
        raise TrainingDiverged(diverged_message(what, self.output, self.saved_at, self.progress.epoch + 1,
                                                self.global_step + 1, self.cfg.lr, self.cfg.clip_grad))

    def _stop_if_asked(self) -> None:
        """At a step boundary, after a stop signal reached any process of the run: save ``last``
        here (every process takes part, the main one writes, the others wait for it) and stop."""
        signum = agreed_stop(self.stop.signum, self.ctx)
        if signum is None:
            return
        position = self.progress.position()
        if self.saved_at != position:
            self.save_last()
        barrier(self.ctx)
        raise TrainingInterrupted(interrupted_message(self.output, self.saved_at, position), signum)

    def _best_state(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``best.safetensors``: its model weights are the ones that earned "best", the EMA's
        when the EMA's Acc@1 chose it (``"weights": "ema"``), so that any reader of the model
        weights (timm's ``create_model(checkpoint_path=...)``, ``ssog eval``, ``--init-from``)
        gets them, as timm's ``load_checkpoint`` prefers a checkpoint's EMA."""
        weights = self.ema.module if self.ema is not None else self.model
        return {
            "kind": "best", "config": self.cfg.to_dict(), "classes": list(self.data.info.classes),
            "data_config": self.data.data_config, MODEL_KEY: weights.state_dict(),
            "weights": "ema" if self.ema is not None else "model",
            "progress": {"epoch": self.progress.epoch, "global_step": self.global_step}, "metrics": metrics,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        load_weights_into(self.model, state[MODEL_KEY], "the checkpoint")
        if self.ema is not None:
            if state.get("ema") is None:
                raise ValueError("the checkpoint has no EMA weights but the config enables EMA")
            load_weights_into(self.ema.module, state["ema"], "the checkpoint's EMA")
        self.optimizer.load_state_dict(state["optimizer"])
        saved = state["config"]
        schedule_changed = any(saved.get(key) != getattr(self.cfg, key) for key in RESUME_CHANGES)
        if not schedule_changed:
            self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        progress = self.progress
        stream_continues = progress.load_state_dict(state["progress"])
        self.history, self.best = state["history"], state["best"]
        if progress.step_in_epoch > self.steps_per_epoch:
            raise ValueError(f"checkpoint is at step {progress.step_in_epoch} of an epoch that has only "
                             f"{self.steps_per_epoch} steps: the data or batch size changed")
        if not stream_continues:
            self._info(f"note: the stream of {self.cfg.dataset} cannot continue inside epoch {progress.epoch + 1} "
                       "(another number of processes x loader workers, or a source that restarts its epochs): "
                       "the epoch's remaining steps read its stream from the start")
        if schedule_changed:  # the new schedule's learning rate at the step reached
            self.scheduler.step_update(num_updates=self.global_step)
        if state["world_size"] == self.ctx.world_size:
            set_rng_state(state["rng"][self.ctx.rank])
        else:
            self._info(f"resuming on {self.ctx.world_size} processes from a run on {state['world_size']}: "
                       "the random streams (mixup, drop-path) restart, so results will not match an "
                       "uninterrupted run exactly")

    # ------------------------------------------------------------------ loop
    def forward_backward(self, images: torch.Tensor, targets: torch.Tensor, sync: bool) -> float:
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

    def optimizer_step(self) -> None:
        """Clip, step the optimizer (and the gradient scaler), update the EMA and the schedule."""
        cfg = self.cfg
        self.scaler.unscale_(self.optimizer)  # a no-op without fp16
        self.progress.grad_norms.update()
        if cfg.clip_grad:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.global_step += 1
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)
        self.scheduler.step_update(num_updates=self.global_step)

    def best_metric(self) -> str:
        """The validation metric that chooses ``best.safetensors``: the EMA's Acc@1 with EMA."""
        return "ema_acc1" if self.ema is not None else "acc1"

    def at_step_limit(self) -> bool:
        """Whether ``max_steps`` optimizer steps are done (the run then ends with its partial epoch
        evaluated, checkpointed and summarised)."""
        return self.cfg.max_steps is not None and self.global_step >= self.cfg.max_steps

    def lr(self) -> float:
        """The schedule's learning rate now (with layer_decay, the head's: the largest)."""
        return max(group["lr"] for group in self.optimizer.param_groups)

    def _log_step(self) -> None:
        """Every ``log_every`` steps: the window's mean training loss (this process's), the lr and
        the throughput to TensorBoard / W&B, and a line (information) unless a progress bar on a
        terminal shows them."""
        cfg = self.cfg
        if not (cfg.log_every and self.global_step % cfg.log_every == 0 and self.main):
            return
        loss_sum, count, start = self.window
        elapsed = time.perf_counter() - start
        scalars = {"train/loss": loss_sum / max(count, 1), "train/lr": self.lr(),
                   "train/images_per_s": count * self.ctx.world_size / elapsed if elapsed > 0 else 0.0}
        assert self.run_log is not None  # run() made it on the main process
        self.run_log.log_step(self.global_step, scalars)
        self.window = (0.0, 0, time.perf_counter())
        if not (cfg.progress and sys.stderr.isatty()):  # no progress bar shows it: a batch job's log
            logger.info(f"epoch {self.progress.epoch + 1}/{self.num_epochs} step {self.progress.step_in_epoch}/"
                        f"{self.steps_per_epoch} (step {self.global_step}): loss {scalars['train/loss']:.4f}, "
                        f"lr {scalars['train/lr']:.3g}, {scalars['train/images_per_s']:.1f} images/s")

    def _train_epoch(self) -> None:
        loader, cfg, progress = self.data.train_loader, self.cfg, self.progress
        self.data.start_epoch(progress.epoch, progress.step_in_epoch)
        self.net.train()
        bar = progress_bar(self.main and cfg.progress, total=self.steps_per_epoch, initial=progress.step_in_epoch,
                           desc=f"epoch {progress.epoch + 1}/{self.num_epochs}")
        start = time.perf_counter() - progress.epoch_time
        cpu_start = cpu_seconds() - progress.cpu_time
        self.window = (0.0, 0, time.perf_counter())
        micro = 0
        try:
            for images, targets in loader:
                if self.at_step_limit():
                    break
                micro += 1
                sync = micro % cfg.grad_accum_steps == 0
                step_start = time.process_time()
                loss = self.forward_backward(images, targets, sync)
                progress.loss_sum += loss * len(images)
                progress.loss_count += len(images)
                self.window = (self.window[0] + loss * len(images), self.window[1] + len(images), self.window[2])
                if sync:
                    self.optimizer_step()
                progress.step_cpu_time += time.process_time() - step_start
                if not sync:
                    continue
                progress.step_in_epoch += 1
                bar.update()
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{self.lr():.2e}")
                progress.epoch_time = time.perf_counter() - start
                progress.cpu_time = cpu_seconds() - cpu_start
                self._log_step()
                if cfg.checkpoint_every and self.global_step % cfg.checkpoint_every == 0 \
                        and progress.step_in_epoch < self.steps_per_epoch and not self.at_step_limit():
                    self.save_last()
                self._stop_if_asked()
                if progress.step_in_epoch == self.steps_per_epoch or self.at_step_limit():
                    break  # micro-batches short of a whole step are left for the next epoch's shuffle
        except RuntimeError as error:
            # A loader whose workers died once a stop was asked (workers of a loader built
            # elsewhere, which do not leave the signal to this process): the interruption, not an
            # error. (torchrun's SIGTERM after another process stopped is not: run() reports that.)
            if self.stop.signum is None or is_peer_failure(error, self.ctx):
                raise
            self._stop_if_asked()
        finally:
            bar.close()

    def _end_epoch(self) -> dict[str, Any]:
        cfg, progress = self.cfg, self.progress
        loss_sum, loss_count = all_reduce_sum([progress.loss_sum, progress.loss_count], self.ctx)
        eval_start = cpu_seconds()
        val = evaluate(self.model, self.data.val_loader, self.ctx, cfg.amp)
        record: dict[str, Any] = {
            "epoch": progress.epoch + 1, "step": self.global_step, "lr": self.lr(),
            "train_loss": loss_sum / loss_count, "val_loss": val["loss"],
            "acc1": val["acc1"], "acc3": val["acc3"], "acc5": val["acc5"],
        }
        if self.ema is not None:
            ema = evaluate(self.ema.module, self.data.val_loader, self.ctx, cfg.amp)
            record.update({f"ema_{k}": v for k, v in ema.items()})
        record["epoch_time_s"] = progress.epoch_time
        # This process's CPU seconds (its loader workers' included): training steps, the rest of
        # training (loading, augmentation, logging) and evaluation.
        record["cpu_s"] = {"step": progress.step_cpu_time, "loading": progress.cpu_time - progress.step_cpu_time,
                           "evaluation": cpu_seconds() - eval_start}
        record["grad_norm"] = progress.grad_norms.means()
        progress.end_epoch()
        metric = record["acc1"] if self.cfg.sched_kwargs.get("plateau_mode", "max") == "max" else record["val_loss"]
        self.scheduler.step(progress.epoch, metric)  # schedules stepped per epoch (plateau); the others ignore it
        return record

    def run(self) -> dict[str, Any]:
        """Train to the schedule's end (``cfg.epochs``, plus ``cooldown_epochs``; from where a
        resumed state left off) in the existing run folder. A stop signal stops it at a step
        boundary inside :func:`~ssog.train.stopping.signals_stop_at_step_boundary` on
        :attr:`stop` (which :func:`ssog.train.api.train` holds until the folder is released)."""
        cfg = self.cfg
        if self.main:
            self.run_log = RunLogger(self.output, cfg.to_dict(), cfg.tensorboard, cfg.wandb_project,
                                    resumed_at=self.global_step if self.resumed else None)
        try:
            return self._run()
        except WriteError as error:  # a full disk: one line, the run resumable
            raise WriteError(error.errno, f"{error}; {resumable_message(self.output, self.saved_at)}") \
                from error
        except (RuntimeError, MemoryError) as error:
            if is_peer_failure(error, self.ctx):  # a collective found another process gone: one line
                raise PeerStopped(f"{peer_stopped_message(self.ctx)}; "
                                  f"{resumable_message(self.output, self.saved_at)}") from None
            if not is_out_of_memory(error):
                raise
            raise TrainingOutOfMemory(
                f"out of memory on {self.ctx.device} at epoch {self.progress.epoch + 1} step "
                f"{self.global_step + 1} ({cfg.model}, batch {cfg.batch_size}, {self.data.img_size}px); "
                f"{resumable_message(self.output, self.saved_at)}") from None

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.main:
            logger.info(f"training {cfg.model} ({self.params:,} parameters) on {cfg.dataset} "
                        f"({len(self.data.train_loader.dataset)} train / "  # type: ignore[arg-type]
                        f"{len(self.data.val_loader.dataset)} val, "  # type: ignore[arg-type]
                        f"{self.data.img_size}px) for {self.num_epochs} epochs, {self.steps_per_epoch} steps each, "
                        f"on {self.ctx.world_size} x {self.ctx.device.type}; output {self.output}")
        # (a run interrupted at its step limit inside an epoch still ends that epoch on resume)
        while self.progress.epoch < self.num_epochs and not (self.at_step_limit() and not self.progress.step_in_epoch):
            self._train_epoch()
            record = self._end_epoch()
            # With EMA the checkpoint kept as best is chosen by the EMA's Acc@1, as timm's train.py does.
            metric = self.best_metric()
            improved = record[metric] > self.best["acc1"]
            if improved:
                self.best = {"acc1": record[metric], "epoch": record["epoch"]}
            self.history.append(record)
            # The checkpoints first, then the logs: a failure in between (a full disk) leaves a
            # run resumable at this epoch, and resuming rewrites the logs from the history.
            self.save_last(best=record if improved else None)
            if self.main:
                assert self.run_log is not None  # run() made it on the main process
                self.run_log.log_epoch(self.history,
                                       final=self.progress.epoch == self.num_epochs or self.at_step_limit())
                logger.info(f"epoch {record['epoch']}/{self.num_epochs}: train loss {record['train_loss']:.4f}, "
                            f"val loss {record['val_loss']:.4f}, Acc@1 {record['acc1']:.2f}, "
                            f"Acc@5 {record['acc5']:.2f} ({record['epoch_time_s']:.1f}s)")
            self._stop_if_asked()
        if self.at_step_limit() and self.main:
            logger.info(f"stopped at the step limit: max_steps {cfg.max_steps} (the schedule runs "
                        f"{self.num_epochs * self.steps_per_epoch} steps)")
        summary = self._summary()
        if self.main:
            write_atomic(self.output / "summary.json", json.dumps(summary, indent=2) + "\n")
            assert self.run_log is not None
            self.run_log.close()
            logger.info(_format_summary(summary, self.output))
        return summary

    def _summary(self) -> dict[str, Any]:
        final = self.history[-1]
        times = [r["epoch_time_s"] for r in self.history]
        summary = {
            "acc1": final["acc1"], "acc3": final["acc3"], "acc5": final["acc5"], "loss": final["val_loss"],
            "epochs": final["epoch"], "params": self.params,
            "best_acc1": self.best["acc1"], "best_epoch": self.best["epoch"], "best_metric": self.best_metric(),
            "train_loss": final["train_loss"],
            "model": self.cfg.model, "dataset": self.cfg.dataset, "num_classes": self.data.info.num_classes,
            "img_size": self.data.img_size,
            "steps": self.global_step, "max_steps": self.cfg.max_steps, "world_size": self.ctx.world_size,
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
        f"  best   {'EMA ' if summary['best_metric'] == 'ema_acc1' else ''}Acc@1 {summary['best_acc1']:.2f} "
        f"(epoch {summary['best_epoch']})",
    ]
    if "ema_acc1" in summary:
        lines.append(f"  EMA    Acc@1 {summary['ema_acc1']:.2f}  Acc@5 {summary['ema_acc5']:.2f}")
    curves = " curves.png," if (output / "curves.png").is_file() else ""
    lines.append(f"  files  {output}/summary.json, log.jsonl, log.csv,{curves} last/best.safetensors")
    return "\n".join(lines)
