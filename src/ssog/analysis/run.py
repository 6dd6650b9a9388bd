"""The analyses end to end: load each model, compute, write JSON (and figures).

What ``ssog analyze sinks|lipschitz|kernels|steering|field`` calls; each function returns one result per
model, with the model's identity (:meth:`AnalysisModel.describe`) merged in.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..files import clear_results, write_atomic
from ..runtime import check_plotting
from .field import field_branches
from .kernels import kernel_statistics
from .lipschitz import DEFAULT_SCALES, lipschitz_analysis
from .loading import AnalysisModel, data_name, image_batches, iter_models, source_folder
from .report import TABLE_ROWS, csv_table, markdown_table
from .sinks import sink_diagnostics
from .steering import steering_moves

__all__ = ["DTYPES", "OUTPUTS", "run_field", "run_kernels", "run_lipschitz", "run_sinks", "run_steering"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}


#: The files each analysis writes into its output folder (globs).
OUTPUTS = {
    "sinks": ("sinks.json", "sinks.csv", "sinks.md"),
    "lipschitz": ("lipschitz.json", "lipschitz.png"),
    "kernels": ("kernels.json", "kernels.csv", "kernels.md", "kernels_*.png"),
    "field": ("field.json", "field.png"),
    "steering": ("steering.json", "steering.csv", "steering.md", "steering.png"),
}


def _write_json(results: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(results, indent=2))


def _for_each_model(
    analysis: str,
    analyse: Callable[[int, AnalysisModel], dict[str, Any]],
    models: Sequence[str],
    checkpoints: Sequence[str | Path],
    *,
    ema: bool,
    seed: int,
    device: str,
    output: str | Path | None,
    overwrite: bool,
) -> list[dict[str, Any]]:
    """``analyse(index, loaded)`` for each model of :func:`iter_models` in turn; the results
    are written to ``output/<analysis>.json`` when ``output`` is set, and the rows of the
    analyses of :data:`~ssog.analysis.report.TABLE_ROWS` to ``<analysis>.csv`` and ``.md``.

    Before any work, with ``output``: an earlier run's results there are refused unless
    ``overwrite`` (then they are removed), and so is a matplotlib that cannot import.
    """
    if output is not None:
        check_plotting(f"ssog analyze {analysis} --output")
        clear_results(output, OUTPUTS[analysis], overwrite=overwrite, what=f"ssog analyze {analysis}")
    loaded_models = iter_models(models, checkpoints, ema=ema, seed=seed, device=device)
    results = [analyse(index, loaded) for index, loaded in enumerate(loaded_models)]
    if output is not None:
        _write_json(results, Path(output) / f"{analysis}.json")
        if analysis in TABLE_ROWS:  # the table's rows, ready for a paper or a README
            header, rows = TABLE_ROWS[analysis](results)
            write_atomic(Path(output) / f"{analysis}.csv", csv_table(header, rows))
            write_atomic(Path(output) / f"{analysis}.md", markdown_table(header, rows))
    return results


def _identity(loaded: AnalysisModel, data: str | None) -> dict[str, Any]:
    """The model's identity, its figure label (name and run folder, or "random") and the data it is analysed on."""
    label = f"{loaded.name} ({source_folder(loaded.source) or 'random'})"
    return {**loaded.describe(), "label": label, "data": data_name(loaded, data)}


def _images(loaded: AnalysisModel, data: str | None, data_dir: str | None, num_images: int, seed: int,
            split: dict[str, Any]) -> torch.Tensor:
    """The first ``num_images`` images of :func:`image_batches` as one batch."""
    return torch.cat(list(image_batches(loaded, data, data_dir=data_dir, num_images=num_images, seed=seed, **split)))


def run_sinks(
    models: Sequence[str] = (),
    checkpoints: Sequence[str | Path] = (),
    *,
    data: str | None = None,
    data_dir: str | None = None,
    val_split: float | int | str | None = None,
    split_seed: int | None = None,
    num_images: int = 512,
    batch_size: int = 64,
    ema: bool = False,
    seed: int = 0,
    device: str = "auto",
    output: str | Path | None = None,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Table 5 for every model; written to ``output/sinks.json`` when ``output`` is set (an
    earlier one there is refused unless ``overwrite``)."""

    def analyse(_: int, loaded: AnalysisModel) -> dict[str, Any]:
        batches = image_batches(loaded, data, data_dir=data_dir, num_images=num_images,
                                batch_size=batch_size, seed=seed, val_split=val_split, split_seed=split_seed)
        return {**loaded.describe(), "data": data_name(loaded, data), **sink_diagnostics(loaded.model, batches)}

    return _for_each_model("sinks", analyse, models, checkpoints, ema=ema, seed=seed, device=device,
                           output=output, overwrite=overwrite)


def run_lipschitz(
    models: Sequence[str] = (),
    checkpoints: Sequence[str | Path] = (),
    *,
    data: str | None = None,
    data_dir: str | None = None,
    val_split: float | int | str | None = None,
    split_seed: int | None = None,
    num_images: int = 8,
    scales: Sequence[float] = DEFAULT_SCALES,
    iters: int = 20,
    dtype: str = "float64",
    ema: bool = False,
    seed: int = 0,
    device: str = "auto",
    output: str | Path | None = None,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Bounds and estimates for every model; ``output/lipschitz.json`` and ``lipschitz.png``
    (earlier ones there are refused unless ``overwrite``)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")

    def analyse(_: int, loaded: AnalysisModel) -> dict[str, Any]:
        images = _images(loaded, data, data_dir, num_images, seed, dict(val_split=val_split, split_seed=split_seed))
        return {**_identity(loaded, data), "dtype": dtype,
                **lipschitz_analysis(loaded.model, images, scales, iters, DTYPES[dtype], seed)}

    results = _for_each_model("lipschitz", analyse, models, checkpoints, ema=ema, seed=seed, device=device,
                              output=output, overwrite=overwrite)
    if output is not None:
        from .plots import plot_lipschitz  # matplotlib: only when figures are written
        plot_lipschitz(results, Path(output) / "lipschitz.png")
    return results


def run_field(
    models: Sequence[str] = (),
    checkpoints: Sequence[str | Path] = (),
    *,
    data: str | None = None,
    data_dir: str | None = None,
    val_split: float | int | str | None = None,
    split_seed: int | None = None,
    num_images: int = 256,
    ema: bool = False,
    seed: int = 0,
    device: str = "auto",
    output: str | Path | None = None,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """The continuous field's branches (:func:`~ssog.analysis.field.field_branches`) of every
    model on ``num_images`` validation images, in one forward pass; ``output/field.json`` and
    ``field.png`` (earlier ones there are refused unless ``overwrite``)."""

    def analyse(_: int, loaded: AnalysisModel) -> dict[str, Any]:
        images = _images(loaded, data, data_dir, num_images, seed, dict(val_split=val_split, split_seed=split_seed))
        return {**_identity(loaded, data), **field_branches(loaded.model, images)}

    results = _for_each_model("field", analyse, models, checkpoints, ema=ema, seed=seed, device=device,
                              output=output, overwrite=overwrite)
    if output is not None:
        from .plots import plot_field  # matplotlib: only when figures are written
        plot_field(results, Path(output) / "field.png")
    return results


def run_kernels(
    models: Sequence[str] = (),
    checkpoints: Sequence[str | Path] = (),
    *,
    ema: bool = False,
    seed: int = 0,
    device: str = "cpu",
    output: str | Path | None = None,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Kernel statistics for every model; ``output/kernels.json`` and one
    ``kernels_<i>_<model>.png`` per model (earlier ones there are refused unless ``overwrite``)."""

    def analyse(index: int, loaded: AnalysisModel) -> dict[str, Any]:
        result = {**loaded.describe(), "kernels": kernel_statistics(loaded.model)}
        if output is not None:
            stem = re.sub(r"[^A-Za-z0-9_.-]", "_", loaded.name)
            from .plots import plot_kernels  # matplotlib: only when figures are written
            figure = plot_kernels(loaded.model, Path(output) / f"kernels_{index}_{stem}.png",
                                  title=f"{loaded.name} ({loaded.source})")
            result["figure"] = str(figure)
        return result

    return _for_each_model("kernels", analyse, models, checkpoints, ema=ema, seed=seed, device=device,
                           output=output, overwrite=overwrite)


def run_steering(
    models: Sequence[str] = (),
    checkpoints: Sequence[str | Path] = (),
    *,
    data: str | None = None,
    data_dir: str | None = None,
    val_split: float | int | str | None = None,
    split_seed: int | None = None,
    num_images: int = 256,
    ema: bool = False,
    seed: int = 0,
    device: str = "auto",
    output: str | Path | None = None,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """How far steering moves each steered mixer's mixture
    (:func:`~ssog.analysis.steering.steering_moves`) on ``num_images`` validation images, in one
    forward pass; ``output/steering.json``, ``.csv``, ``.md`` and ``steering.png`` (earlier ones
    there are refused unless ``overwrite``)."""

    def analyse(_: int, loaded: AnalysisModel) -> dict[str, Any]:
        images = _images(loaded, data, data_dir, num_images, seed, dict(val_split=val_split, split_seed=split_seed))
        return {**_identity(loaded, data), **steering_moves(loaded.model, images)}

    results = _for_each_model("steering", analyse, models, checkpoints, ema=ema, seed=seed, device=device,
                              output=output, overwrite=overwrite)
    if output is not None:
        from .plots import plot_steering  # matplotlib: only when figures are written
        plot_steering(results, Path(output) / "steering.png")
    return results
