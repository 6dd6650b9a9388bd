"""The recipe tier: every recipe under configs/ and every variant of it that builds another
model or pipeline, at its real model size and image size, through the real pipeline (its
augmentation, mixup/cutmix, schedule, gradient clipping, drop-path, precision, EMA,
checkpoints, transfer) for 2 optimizer steps and an evaluation, on generated data of the
recipe's shape (its image size and number of classes) with a batch of 2.

Variants that change only a number (lr, depth, heads, atoms, steps, radius, sigma_min...)
share the run of the first variant with the same model and pipeline, in their recipe or in
another (the ablation tables repeat ODE-ViT-B's base run): :func:`pipeline_key` says what
makes a run distinct.
A transfer variant starts from the tier's own run of the recipe it names (``init_from``).
``pytest -m recipe`` runs this tier alone; docs/development.md lists it with each run's time.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from ssog.runtime import cpu_has_native_bf16
from ssog.train import TrainConfig, recipe_variants, resolve_config, train

pytestmark = [pytest.mark.recipe, pytest.mark.slow]

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(p for p in CONFIGS.rglob("*.yaml") if "_base" not in p.parts)
#: The classes of each recipe data source, for the generated stand-in (an ImageFolder recipe
#: is ImageNet's layout in configs/imagenet, CIFAR-10's in the CPU recipes).
CLASSES = {"cifar10": 10, "cifar100": 100}
#: Two optimizer steps of two images, an evaluation of two, no loader processes, on the CPU
#: with every core (the other tests' tensors are tiny and take one thread; these are not), or
#: with one when pytest-xdist runs the tier in one worker beside others on the other cores.
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else len(os.sched_getaffinity(0))
TIER = dict(dataset="synthetic", synthetic_size=4, batch_size=2, grad_accum_steps=1, max_steps=2, epochs=1,
            num_workers=0, device="cpu", threads=THREADS, progress=False, log_every=0)
#: On a CPU without native bf16 kernels the recipes' bf16 autocast makes a 224-px run many times
#: slower (docs/development.md, "The recipe tier"), so there the tier runs in fp32; bf16 autocast
#: itself is tested on a tiny model (tests/train/test_train.py, test_mixed_precision_runs).
if not cpu_has_native_bf16():
    TIER["amp"] = "none"


def pipeline_key(cfg: TrainConfig) -> tuple[Any, ...]:
    """What makes a recipe's run another model or pipeline: the architecture, width and image
    size, steering, the augmentation level, mixup/cutmix, the transfer mode, precision, EMA,
    the schedule's kind, clipping and drop-path switched on. Numbers alone do not count."""
    kwargs = cfg.model_kwargs
    return (cfg.model, kwargs.get("embed_dim"), kwargs.get("patch_size"), cfg.img_size, tuple(kwargs.get("steer", ())),
            cfg.augment, cfg.mixup, cfg.cutmix, bool(cfg.init_from), cfg.init_keep_head, cfg.linear_probe, cfg.amp,
            bool(cfg.ema_decay), cfg.sched, bool(cfg.clip_grad), bool(cfg.drop_path),
            CLASSES.get(cfg.dataset, 1000 if cfg.img_size == 224 else 10))


def _all_runs() -> list[tuple[Path, str | None]]:
    return [(path, variant) for path in RECIPES for variant in (recipe_variants(path) or [None])]


def _distinct_runs() -> list[tuple[Path, str | None]]:
    first: dict[tuple[Any, ...], tuple[Path, str | None]] = {}
    for path, variant in _all_runs():
        first.setdefault(pipeline_key(resolve_config(path, variant)), (path, variant))
    return list(first.values())


RUNS = _distinct_runs()


def _id(run: tuple[Path, str | None]) -> str:
    path, variant = run
    return f"{path.relative_to(CONFIGS)}:{variant}"


def tier_config(path: Path, variant: str | None) -> TrainConfig:
    """The recipe's configuration with the tier's data, batch and step limit (and its default
    run folder, relative to the working directory, so that transfers find their sources)."""
    recipe = resolve_config(path, variant)
    classes = CLASSES.get(recipe.dataset, 1000 if recipe.img_size == 224 else 10)
    return resolve_config(path, variant, [*TIER.items(), ("synthetic_classes", classes)])


def tier_run(path: Path, variant: str | None) -> tuple[TrainConfig, dict[str, Any]]:
    """Train the tier of one recipe variant in the working directory (once: a transfer's source
    may have run already), its transfer source first; the config and the run's summary."""
    cfg = tier_config(path, variant)
    summary = Path(cfg.output) / "summary.json"
    if summary.is_file():
        return cfg, json.loads(summary.read_text())
    if cfg.init_from and not Path(cfg.init_from).exists():
        source = Path(cfg.init_from).parent  # runs/<recipe>/<variant>
        tier_run(next(p for p in RECIPES if p.stem == source.parent.name), source.name)
    return cfg, train(cfg)


#: The runs whose best.safetensors a transfer variant starts from.
#: Each run's tier configuration, resolved once for the marks and SOURCES below.
TIER_CONFIGS = {run: tier_config(*run) for run in RUNS}
SOURCES = {cfg.init_from for cfg in TIER_CONFIGS.values()} - {None}


@pytest.fixture(scope="module")
def tier_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One working directory for the tier's runs (runs/<recipe>/<variant>), shared so that a
    transfer variant reuses its source's run; in memory (/dev/shm) where the machine has one,
    since a ViT-B run's checkpoints are 1.7 GB and writing them to disk was a third of its time."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4 * 2**30:
        folder = Path(tempfile.mkdtemp(prefix="ssog-recipe-tier-", dir=shm))
        yield folder
        shutil.rmtree(folder, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("recipe_tier")


def test_the_tier_runs_the_papers_sizes():
    # ViT-S/M/B of the three families at 224 px, with each operator
    assert {(resolve_config(*run).model, resolve_config(*run).img_size) for run in RUNS} >= {
        (f"{op}_{family}_{size}_patch16_224", 224)
        for op in ("mha", "ssog") for family in ("vit", "loopvit", "odevit") for size in ("small", "medium", "base")}


def _param(run: tuple[Path, str | None]) -> Any:
    """One run as a test; with pytest-xdist (``--dist loadgroup``), the transfers and their
    sources in one worker, since a transfer starts from its source's run in that worker's folder."""
    cfg = TIER_CONFIGS[run]
    linked = bool(cfg.init_from) or str(Path(cfg.output) / "best.safetensors") in SOURCES
    return pytest.param(run, id=_id(run), marks=[pytest.mark.xdist_group("recipe_tier_transfer")] if linked else [])


@pytest.mark.parametrize("run", [_param(run) for run in RUNS])
def test_recipe_runs_at_its_real_size(run, tier_folder, monkeypatch, record_property):
    monkeypatch.chdir(tier_folder)
    cfg, summary = tier_run(*run)
    assert summary["steps"] == 2 and summary["epochs"] == 1
    record_property("step_s", summary["train_time_s"] / summary["steps"])  # for docs/development.md's table
    folder = Path(cfg.output)
    assert (folder / "last.safetensors").is_file() and (folder / "summary.json").is_file()
    if str(folder / "best.safetensors") not in SOURCES:
        shutil.rmtree(folder)  # a run's folder holds up to 1.7 GB; keep only what transfers start from
