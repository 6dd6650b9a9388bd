"""Model sweep, inference or training: family x op x width x resolution x batch size.

A point is one (family, op, size, resolution, batch size). For each (family, size,
resolution) the registered timm models ``{op}_{family}_{size}_patch*`` of every op are
built at that resolution with random weights, and for each batch size:

1. each model runs ``warmup`` untimed forward passes on its own (so an out-of-memory error
   is attributed to the model that raised it);
2. the models' ``iters`` timed forward passes are interleaved, MHA then SSoG in every
   round (:func:`ssog.bench.timing.time_interleaved`): on a shared CPU whose speed drifts
   with other processes' load, both sides of a ratio see the same conditions. The SSoG
   row's ``speedup`` is the median over rounds of ``t_mha / t_ssog`` (with quartiles);
3. one more pass per model measures peak memory (:func:`ssog.measure.peak_memory`;
   parameters, buffers and the input batch count as resident).

Inference (``mode="inference"``) runs forward passes under ``torch.inference_mode``, models
in ``eval()``. Training (``mode="train"``) times whole optimisation steps, models in
``train()``: forward, cross-entropy on random labels, backward and an AdamW step (gradients
set to ``None`` after each step, so their memory counts in the step's peak; the optimizer's
state counts as resident). Both use autocast for fp16/bf16 (parameters and inputs stay
fp32, as in the paper; no loss scaling).

Progress: after each (family, size, resolution, batch size), its rows of every op are
passed to ``on_row``, written to ``output`` (``results.json`` and ``results.csv`` rewritten
whole, atomically, with ``complete: false`` until the last one), and an information line
counts ``k/N`` of them with the time left, estimated from those done. An interrupted sweep
(Ctrl-C) thus leaves every finished one on disk.

Out of memory (Fig. 5 semantics): a curve is one (family, op, size, batch size) over
increasing resolution. The first resolution that runs out of memory is recorded with
status ``"oom"``; every larger resolution of that curve is recorded as ``"skipped"`` and
not run.
"""
from __future__ import annotations

import gc
import logging
import os
import re
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any, Callable, Iterator, Mapping

import timm
import torch
from torch import nn

from ssog.bench.results import BenchResults, environment
from ssog.bench.timing import quartiles, time_interleaved
from ssog.models import MIXER_NAMES, count_flops
from ssog.measure import format_duration, peak_memory
from ssog.runtime import autocast, is_out_of_memory, resolve_device

__all__ = [
    "DTYPES",
    "FAMILIES",
    "MODES",
    "PRESETS",
    "SweepConfig",
    "model_name",
    "planned_points",
    "run_model_sweep",
]

logger = logging.getLogger(__name__)

# Paper order of Fig. 5's rows: continuous (ODE-ViT), discrete (ViT), looped (bViT).
FAMILIES = ("odevit", "vit", "loopvit")
MODES = ("inference", "train")
DTYPES = ("auto", "fp32", "bf16", "fp16")
MiB = 2**20
# The paper's models are its CIFAR-100 classifiers (Table 10); the head is negligible.
NUM_CLASSES = 100


@dataclass(frozen=True)
class SweepConfig:
    """What to measure. Resolutions are image sides in pixels (square images).

    ``size`` is the width preset of the resolution x batch-size grid (Fig. 4 and 5);
    ``width_sizes`` are the widths of Fig. 1, measured only at the largest resolution with
    ``width_batch_size`` images (the grid's points are reused where they match).
    ``dtype="auto"`` is fp16 autocast on CUDA (as in the paper) and fp32 on CPU.
    """

    families: tuple[str, ...] = FAMILIES
    ops: tuple[str, ...] = MIXER_NAMES
    size: str = "small"
    resolutions: tuple[int, ...] = (224, 448)
    batch_sizes: tuple[int, ...] = (1, 2)
    width_sizes: tuple[str, ...] = ("small", "medium")
    width_batch_size: int | None = 1
    warmup: int = 1
    iters: int = 3
    device: str = "auto"
    dtype: str = "auto"
    mode: str = "inference"
    #: Measure ``torch.compile``d models (compilation happens in the warm-up calls).
    compile: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        _check_choices("families", self.families, FAMILIES)
        _check_choices("ops", self.ops, MIXER_NAMES)
        if not self.resolutions or min(self.resolutions) < 1:
            raise ValueError(f"resolutions must be positive image sides in pixels, got {self.resolutions}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch sizes must be positive, got {self.batch_sizes}")
        if self.width_batch_size is not None and self.width_batch_size < 1:
            raise ValueError(f"width batch size must be positive, got {self.width_batch_size}")
        if self.warmup < 1 or self.iters < 1:
            # The first call of each model runs alone so that an out-of-memory error is
            # attributed to the model that raised it.
            raise ValueError(f"need warmup >= 1 and iters >= 1, got warmup={self.warmup} iters={self.iters}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        for size in (self.size, *self.width_sizes):
            for family in self.families:
                for op in self.ops:
                    name = model_name(op, family, size)
                    found = re.search(r"_patch(\d+)", name)
                    assert found is not None  # every ssog model name has its patch size
                    patch = int(found.group(1))
                    uneven = [res for res in self.resolutions if res % patch]
                    if uneven:
                        raise ValueError(f"resolutions {uneven} are not multiples of {name}'s patch size {patch}")
        resolve_device(self.device)

    @property
    def grid_width_batch_size(self) -> int:
        """Batch size of the width sweep: ``width_batch_size`` or the grid's smallest."""
        return self.width_batch_size or min(self.batch_sizes)

    def to_dict(self) -> dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}


def _check_choices(name: str, values: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    if not values:
        raise ValueError(f"{name} must not be empty; choose from {', '.join(allowed)}")
    unknown = [value for value in values if value not in allowed]
    if unknown:
        raise ValueError(f"unknown {name} {', '.join(map(repr, unknown))}; expected some of {', '.join(allowed)}")


PRESETS: dict[str, SweepConfig] = {
    # A CPU sweep: D=384, the three families, 224 and 448 px, batch 1 and 2, and D=576 at
    # 448 px, batch 1 for Fig. 1.
    "default": SweepConfig(),
    # The CPU targets of the benchmark issue: D=384, batch 4, fp32, 224 and 448 px.
    "cpu-targets": SweepConfig(batch_sizes=(4,), width_sizes=(), width_batch_size=None, warmup=2, iters=10),
    # The paper's A40 sweep (Fig. 1, 4, 5): D=768, batch 8-512, 224-1024 px, FP16 autocast,
    # 10 warmup and 50 measured iterations; Fig. 1 at 1024 px, batch 8.
    "paper": SweepConfig(
        size="base",
        resolutions=(224, 384, 512, 640, 768, 1024),
        batch_sizes=(8, 32, 64, 128, 256, 512),
        width_sizes=("small", "medium", "base"),
        width_batch_size=8,
        warmup=10,
        iters=50,
    ),
}


def model_name(op: str, family: str, size: str) -> str:
    """The registered timm model ``{op}_{family}_{size}_patch*`` (there must be exactly one)."""
    prefix = f"{op}_{family}_{size}_patch"
    names = [name for name in timm.list_models(f"{prefix}*") if name.startswith(prefix)]
    if len(names) != 1:
        sizes = sorted({name.split("_")[2] for name in timm.list_models(f"{op}_{family}_*")})
        found = f"sizes registered for {op}_{family}: {', '.join(sizes)}" if sizes else "is 'import ssog' done?"
        raise ValueError(f"no unique timm model named {prefix}*: found {names or 'none'} ({found})")
    return names[0]


def _forward(model: nn.Module, images: torch.Tensor, dtype: str) -> torch.Tensor:
    """One inference call; autocast is entered per call, as an inference loop would, so
    its cache of low-precision weight copies is made (and counted) by every call."""
    with autocast(images.device, dtype):
        return model(images)


def _train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor, dtype: str
) -> None:
    """One optimisation step: forward (autocast as in :func:`_forward`), loss, backward, AdamW."""
    loss = nn.functional.cross_entropy(_forward(model, images, dtype).float(), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def _release(device: torch.device) -> None:
    """Return freed CUDA memory to the device (CPU tensors are freed as they die)."""
    if device.type == "cuda":
        gc.collect()  # an out-of-memory traceback may keep the failed call's tensors alive
        torch.cuda.empty_cache()


def _flops(name: str, resolution: int) -> dict[str, Any]:
    """Per-image FLOPs and token count, counted on the meta device (no compute)."""
    with torch.device("meta"):
        model = timm.create_model(name, img_size=resolution, num_classes=NUM_CLASSES).eval()
    return count_flops(model, resolution)


def _groups(config: SweepConfig) -> Iterator[tuple[str, str, int, tuple[int, ...]]]:
    """(family, size, resolution, batch sizes) in measurement order."""
    largest = max(config.resolutions)
    width_batch = config.grid_width_batch_size
    for family in config.families:
        for resolution in sorted(config.resolutions):
            yield family, config.size, resolution, config.batch_sizes
        for size in config.width_sizes:
            # The grid's own width joins the width sweep unless the grid already holds it.
            if size != config.size or width_batch not in config.batch_sizes:
                yield family, size, largest, (width_batch,)


def planned_points(config: SweepConfig) -> int:
    """How many (family, size, resolution, batch size) ``config`` measures, each for every op."""
    return sum(len(batch_sizes) for *_, batch_sizes in _groups(config))


def _measure(
    models: Mapping[str, nn.Module],
    images: torch.Tensor,
    device: torch.device,
    dtype: str,
    warmup: int,
    iters: int,
    mode: str = "inference",
) -> dict[str, dict[str, float] | None]:
    """Throughput and peak memory of each model on ``images`` (forward passes, or training
    steps with ``mode="train"``); ``None`` where it ran out of memory."""
    measured: dict[str, dict[str, float] | None] = {}
    calls: dict[str, Callable[[], Any]] = {}
    optimizers: dict[str, torch.optim.Optimizer] = {}
    batch_size = images.shape[0]
    train = mode == "train"
    labels = torch.randint(NUM_CLASSES, (batch_size,), device=device)
    with torch.inference_mode(not train):
        for op, model in models.items():
            model.train(train)
            call: Callable[[], Any]
            if train:
                optimizers[op] = torch.optim.AdamW(model.parameters())
                call = partial(_train_step, model, optimizers[op], images, labels, dtype)
            else:
                call = partial(_forward, model, images, dtype)
            try:
                for _ in range(warmup):
                    call()
                calls[op] = call
            except (RuntimeError, torch.OutOfMemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                measured[op] = None
            _release(device)
        timings = time_interleaved(calls, device=device, warmup=0, iters=iters)
        for op, call in calls.items():
            model = models[op]
            try:
                resident = [*model.parameters(), *model.buffers(), images]
                if train:
                    resident += [labels, *_optimizer_state(optimizers[op])]
                peak = peak_memory(call, device=device, resident=resident)
            except (RuntimeError, torch.OutOfMemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                measured[op] = None
                continue
            timing = timings[op]
            measured[op] = {
                "images_per_s": batch_size / timing.median,
                "latency_ms": 1e3 * timing.median,
                "latency_ms_q1": 1e3 * timing.q1,
                "latency_ms_q3": 1e3 * timing.q3,
                "peak_memory_mib": peak / MiB,
            }
    if measured.get("mha") and (ssog_row := measured.get("ssog")):
        # Each round's MHA and SSoG calls ran back to back: their ratio sees one machine
        # state, so the median over rounds resists load changes better than a ratio of medians.
        ratios = [mha / ssog for mha, ssog in zip(timings["mha"].samples, timings["ssog"].samples)]
        q1, median, q3 = quartiles(ratios)
        ssog_row.update(speedup=median, speedup_q1=q1, speedup_q3=q3)
    return measured


def run_model_sweep(
    config: SweepConfig,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    output: str | os.PathLike | None = None,
) -> BenchResults:
    """Measure every point of ``config``; ``on_row`` sees each row as soon as it is done, and
    ``output`` (a directory), if given, holds ``results.json`` and ``results.csv`` of the
    rows so far from the start (``complete`` once the sweep ends)."""
    config.validate()
    device = resolve_device(config.device)
    dtype = config.dtype if config.dtype != "auto" else ("fp16" if device.type == "cuda" else "fp32")
    results = BenchResults(environment(device, dtype), replace(config, dtype=dtype).to_dict(), complete=False)
    if output is not None:
        results.save(output)
    out_of_memory: set[tuple[str, str, str, int]] = set()
    planned, done, start = planned_points(config), 0, time.perf_counter()
    logger.info("measuring %d points (family, size, resolution, batch size), each for %s, on %s", planned,
                " and ".join(config.ops), device)

    for family, size, resolution, batch_sizes in _groups(config):
        ops = [op for op in config.ops if any((family, op, size, b) not in out_of_memory for b in batch_sizes)]
        models: dict[str, nn.Module] = {}
        info, unbuilt = {}, set()
        for op in ops:
            name = model_name(op, family, size)
            try:  # a model too large for the device at this resolution is an out-of-memory point too
                model = timm.create_model(name, img_size=resolution, num_classes=NUM_CLASSES)
                info[op] = {
                    "dim": model.num_features,
                    "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                    **_flops(name, resolution),
                }
                # torch types compile's result as a callable; of a module it is a module
                compiled = torch.compile(model.to(device)) if config.compile else model.to(device)
                models[op] = compiled  # type: ignore[assignment]
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                unbuilt.add(op)
                _release(device)
        for batch in batch_sizes:
            todo = {op: model for op, model in models.items() if (family, op, size, batch) not in out_of_memory}
            measured: dict[str, dict[str, float] | None] = {
                op: None for op in unbuilt if (family, op, size, batch) not in out_of_memory}
            if todo:
                first: Any = next(iter(todo.values()))  # a timm model: its in_chans
                in_chans = first.in_chans
                try:
                    images = torch.randn(batch, in_chans, resolution, resolution, device=device)
                except (RuntimeError, MemoryError) as error:
                    if not is_out_of_memory(error):
                        raise
                    measured.update(dict.fromkeys(todo))  # not even the input fits
                else:
                    measured.update(_measure(todo, images, device, dtype, config.warmup, config.iters, config.mode))
                    del images
            for op in config.ops:
                row = _row(family, op, size, resolution, batch, device, dtype, config.mode, info.get(op, {}))
                values = measured.get(op)
                if op in measured and values is None:
                    row["status"] = "oom"
                    out_of_memory.add((family, op, size, batch))
                elif values is not None:
                    row.update(status="ok", **values)
                results.rows.append(row)
                if on_row is not None:
                    on_row(row)
            done += 1
            results.complete = done == planned
            if output is not None:
                results.save(output)
            elapsed = time.perf_counter() - start
            logger.info("%d/%d: %s %s, %d px, batch %d done; %s so far, about %s left", done, planned, family, size,
                        resolution, batch, format_duration(elapsed), format_duration(elapsed / done * (planned - done)))
        del models
        _release(device)
    return results


def _row(
    family: str,
    op: str,
    size: str,
    resolution: int,
    batch: int,
    device: torch.device,
    dtype: str,
    mode: str,
    info: Mapping[str, Any],
) -> dict[str, Any]:
    """A row with every column, status ``"skipped"`` and no measurement yet."""
    return {
        "family": family,
        "op": op,
        "size": size,
        "model": model_name(op, family, size),
        "dim": info.get("dim"),
        "params_m": info.get("params_m"),
        "resolution": resolution,
        "tokens": info.get("tokens"),
        "batch_size": batch,
        "device": str(device),
        "dtype": dtype,
        "mode": mode,
        "status": "skipped",
        "images_per_s": None,
        "latency_ms": None,
        "latency_ms_q1": None,
        "latency_ms_q3": None,
        "peak_memory_mib": None,
        "gflops_per_image": info.get("total_gflops"),
        "attention_gflops_per_image": info.get("attention_gflops"),
        "speedup": None,
        "speedup_q1": None,
        "speedup_q3": None,
    }
