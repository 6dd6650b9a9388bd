"""The library entry :func:`train`: check every setting, build the data and the model, then
claim the run folder (:mod:`ssog.train.run_folder`) and run the :class:`~ssog.train.engine.Trainer`;
with the datasets given in Python and the changes ``--resume`` allows."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import torch.distributed as dist
from torch.utils.data import Dataset

from ssog.data.custom import CUSTOM_DATASET
from ssog.runtime import PLOT_EXTRA, check_plotting, is_out_of_memory, torch_settings
from ssog.train.checkpoint import checkpoint_path, load_checkpoint, read_checkpoint_info
from ssog.train.config import TrainConfig, upgrade_checkpoint_config
from ssog.train.distributed import DistContext, barrier, init_distributed
from ssog.train.engine import Trainer
from ssog.train.environment import record_environment
from ssog.train.logger import logging_backends
from ssog.train.run_folder import (
    check_output, check_resumable, claim_run_folder, default_output, saved_no_checkpoint,
)
from ssog.train.state import RESUME_CHANGES, RESUME_SETTINGS
from ssog.train.stopping import TrainingInterrupted, TrainingOutOfMemory, signals_stop_at_step_boundary

__all__ = ["AUTO_RESUME", "train", "apply_resume_changes", "given_datasets", "output_dir", "start_or_resume"]

#: ``resume=AUTO_RESUME`` (``--resume auto``): resume the run in ``cfg.output`` if it saved a
#: checkpoint, else start it there.
AUTO_RESUME = "auto"

logger = logging.getLogger(__name__)


def output_dir(cfg: TrainConfig, ctx: DistContext) -> Path:
    """``cfg.output`` or a new :func:`~ssog.train.run_folder.default_output` (chosen by rank 0
    and shared with the other processes)."""
    name = [cfg.output or str(default_output())]
    if ctx.distributed:
        dist.broadcast_object_list(name, src=0)
    return Path(name[0])


def apply_resume_changes(cfg: TrainConfig, changes: Mapping[str, Any], epochs_done: int) -> list[str]:
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


def given_datasets(cfg: TrainConfig, train_dataset: Dataset | None, val_dataset: Dataset | None,
                    resuming: bool) -> tuple[Dataset, Dataset] | None:
    """``(train_dataset, val_dataset)`` if given (both or neither), with ``cfg.dataset`` set to
    ``custom``; a custom run resumed without them is an error."""
    if (train_dataset is None) != (val_dataset is None):
        raise ValueError("give both train_dataset and val_dataset, or neither")
    if train_dataset is None or val_dataset is None:
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


def start_or_resume(cfg: TrainConfig) -> tuple[TrainConfig | None, Path | None, dict[str, Any]]:
    """What ``--resume auto`` does with ``cfg``: ``(None, folder, changes)`` to resume the run
    in ``cfg.output`` (it saved ``last.safetensors``; ``changes``: the settings of
    :data:`RESUME_SETTINGS` / :data:`RESUME_CHANGES` that ``cfg`` gives otherwise), else
    ``(cfg, None, {})`` to start it there (over a run of the folder that saved no checkpoint).

    Raises ValueError without ``cfg.output``, with ``overwrite``, or when the folder's run has
    other settings than ``cfg`` beyond those a resume may change: a requeued job that runs the
    same command resumes its run, a changed command is not silently continued as the old run.
    """
    if not cfg.output:
        raise ValueError("--resume auto starts the run in --output or resumes it there: give --output")
    if cfg.overwrite:
        raise ValueError("--overwrite starts a new run in place of another; --resume auto continues the run: give one")
    output = Path(cfg.output)
    last = output / "last.safetensors"
    if not last.is_file():
        if saved_no_checkpoint(output, cfg.field_names()):  # stopped before its first checkpoint: nothing to lose
            cfg.overwrite = True
        return cfg, None, {}
    stored = upgrade_checkpoint_config(read_checkpoint_info(last)["config"])
    given = cfg.to_dict()
    if given.get("data_dir") is not None:  # stored resolved
        given["data_dir"] = str(Path(given["data_dir"]).expanduser().resolve())
    differ = [key for key in given if key not in ("output", "overwrite") and given[key] != stored.get(key)]
    changes = {key: given[key] for key in differ if key in RESUME_SETTINGS + RESUME_CHANGES}
    refused = [key for key in differ if key not in changes]
    if refused:
        shown = "; ".join(f"{key}: {stored.get(key)!r} there, {given[key]!r} here" for key in refused[:5])
        raise ValueError(f"--resume auto: {output} holds a run with other settings ({shown}); resume it with "
                         f"--resume {output}, or give another --output")
    return None, output, changes


def train(cfg: TrainConfig | None = None, *, resume: str | Path | None = None,
          resume_changes: Mapping[str, Any] | None = None, train_dataset: Dataset | None = None,
          val_dataset: Dataset | None = None) -> dict[str, Any]:
    """Train and return the summary (also written to ``<output>/summary.json``).

    ``train_dataset``, ``val_dataset``: map-style datasets of ``(PIL image, class index)`` to
    train on instead of ``cfg.dataset`` (which the run then records as ``custom``); the run's
    augmentation and data config transform them (:func:`ssog.data.custom.custom_datasets`:
    every sample checked as every source's, their first samples and the labels they list before
    anything is written). A run trained on them resumes with the same two datasets passed again.

    ``resume``: a run folder (or a checkpoint file) to continue; the configuration then
    comes from the checkpoint, and ``cfg`` must be None. ``resume="auto"``: resume the run in
    ``cfg.output`` if it saved a checkpoint and has ``cfg``'s settings, else start it
    (:func:`start_or_resume`): one command for a job's first start and its requeues.
    ``resume_changes`` may set the fields of :data:`RESUME_SETTINGS` and :data:`RESUME_CHANGES`
    on resume. Launch under ``torchrun``
    for DDP.

    Every setting is checked, and the data and model built, before the run folder is created.
    Raises :class:`TrainingInterrupted` after a stop signal (SIGINT, SIGTERM, SIGUSR1) and
    :class:`TrainingDiverged` on a non-finite loss or weights, both with ``last.safetensors``
    saved or kept.
    """
    if resume == AUTO_RESUME:
        if cfg is None:
            raise ValueError("resume='auto' starts or resumes the run of cfg in cfg.output: give cfg")
        if resume_changes:
            raise ValueError("resume='auto' takes its settings from cfg, not resume_changes")
        cfg, resume, resume_changes = start_or_resume(cfg)
    if resume is not None and cfg is not None:
        raise ValueError("--resume continues a run with its saved configuration: give no other config")
    if resume_changes and resume is None:
        raise ValueError("resume_changes apply to a resumed run only")
    if resume_changes and resume_changes.get("overwrite"):
        raise ValueError("--overwrite starts a new run in place of another; --resume continues the run: give one")
    state, notes = None, []
    if resume is not None:
        check_resumable(Path(resume))
        path = checkpoint_path(resume, "last")
        state = load_checkpoint(path)
        if state.get("kind") != "last":
            raise ValueError(f"{path} is a {state.get('kind')!r} checkpoint; resume needs a run's last.safetensors")
        cfg = TrainConfig.from_dict(upgrade_checkpoint_config(state["config"]))
        cfg.output = str(path.parent)
        notes = apply_resume_changes(cfg, resume_changes or {}, state["progress"]["epoch"])
    cfg = cfg or TrainConfig()
    if state is None and cfg.data_dir is not None:
        # Stored resolved: evaluating the run from another folder must read the same data.
        cfg.data_dir = str(Path(cfg.data_dir).expanduser().resolve())
    datasets = given_datasets(cfg, train_dataset, val_dataset, resuming=state is not None)
    logging_backends(cfg.tensorboard, cfg.wandb_project)  # a missing package is a setting error
    if not check_plotting():
        notes.append(f"curves.png is not drawn: matplotlib is not installed ({PLOT_EXTRA})")
    ctx = init_distributed(cfg.device)
    lock = None
    try:
        output = output_dir(cfg, ctx)
        cfg.output = str(output)
        if ctx.is_main:
            check_output(output, resuming=state is not None, overwrite=cfg.overwrite,
                         config_fields=cfg.field_names())
            if cfg.linear_probe and not cfg.init_from:
                logger.warning("--linear-probe without --init-from trains a classifier on a randomly initialised, "
                               "frozen backbone; give --init-from CKPT to probe a trained one")
        with torch_settings(ctx.device, cfg.threads, cfg.deterministic):
            trainer = _build_trainer(cfg, ctx, output, state, datasets)
            # From the claim to the folder's release: a stop signal ends the run at a step
            # boundary, and its repeats (torchrun forwarding it) cannot cut the release short.
            with signals_stop_at_step_boundary(trainer.stop):
                try:
                    if ctx.is_main:
                        lock = claim_run_folder(output, cfg.to_dict(), resuming=state is not None,
                                                overwrite=cfg.overwrite)
                        record_environment(output, resumed=state is not None)
                        # said once the folder is this run's: a resume refused by another's lock resumed nothing
                        if state is not None:
                            notes.append(f"resumed at epoch {trainer.progress.epoch + 1}, step {trainer.global_step}")
                        for note in ([lock.note] if lock.note else []) + notes:
                            logger.info(note)
                    return trainer.run()
                except TrainingInterrupted:
                    if lock is not None:
                        lock.release()
                        lock = None
                    barrier(ctx)  # no process ends (and has torchrun stop the others) before the release
                    raise
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
