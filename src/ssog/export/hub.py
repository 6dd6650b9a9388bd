"""The ssog models in timm's Hugging Face layout with their model card (:func:`save_for_hf`,
:func:`save_run_for_hf`, :func:`model_card`: ``ssog export --format hf``).

:func:`model_card` writes the ``README.md`` that ``timm``'s ``push_to_hf_hub`` would (YAML front
matter with tags, library and licence, then the model's details), with the model's parameters,
GFLOPs, the run's data set and final metrics (its ``summary.json``), how to load it, and the
citations of the paper and of this library.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from ..files import new_file_mode, temporary_path

__all__ = [
    "HF_FILES", "LIBRARY_TITLE", "check_hub_id", "model_card", "run_summary", "save_for_hf", "save_run_for_hf",
    "training_recipe",
]

#: This library's title, as CITATION.cff gives it (the model card cites it).
LIBRARY_TITLE = "ssog: separable sum-of-Gaussians token mixing for Vision Transformers"
#: How the card names each family and token mixer.
FAMILY_TITLES = {
    "vit": "discrete ViT (independent pre-norm blocks)",
    "loopvit": "looped ViT (one shared block applied repeatedly)",
    "odevit": "continuous-depth ODE-ViT (one time-conditioned block integrated by torchdiffeq)",
}
MIXER_TITLES = {"mha": "multi-head self-attention", "ssog": "SSoG token mixing (separable sum of Gaussians)"}


#: The ``summary.json`` entries the model card reads, and their types.
_SUMMARY_NUMBERS = ("acc1", "acc3", "acc5", "loss", "best_acc1")
_SUMMARY_COUNTS = ("epochs", "best_epoch")
#: A Hugging Face hub repository: ``USER/REPO``, each letters, digits and ``- _ .``.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def check_hub_id(hub_id: str) -> str:
    """``hub_id`` if it names a hub repository (``USER/REPO``), else a ValueError naming ``--hub-id``."""
    if not _HUB_ID.fullmatch(hub_id) or ".." in hub_id or "--" in hub_id:
        raise ValueError(f"--hub-id must be a hub repository USER/REPO (letters, digits and - _ .), got {hub_id!r}")
    return hub_id


def run_summary(checkpoint: str | Path) -> dict[str, Any] | None:
    """The ``summary.json`` of the run that wrote ``checkpoint`` (a run folder, or a checkpoint
    file in one), or ``None`` when there is none (a run stopped before its end). A file that is
    not a run's summary (not JSON, an entry the card reads missing or of another type, a dataset
    that is not a source's name) is a ValueError naming it."""
    from ..data.info import check_dataset_name

    path = Path(checkpoint)
    file = (path if path.is_dir() else path.parent) / "summary.json"
    if not file.is_file():
        return None
    try:
        summary = json.loads(file.read_text())
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{file} is not a run's summary: not readable JSON ({type(error).__name__})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{file} is not a run's summary: a {type(summary).__name__}, not a mapping")
    for key in (*_SUMMARY_NUMBERS, *_SUMMARY_COUNTS, "dataset"):
        if key not in summary:
            raise ValueError(f"{file} is not a run's summary: it has no {key!r}")
    for key in _SUMMARY_NUMBERS:
        if isinstance(summary[key], bool) or not isinstance(summary[key], (int, float)):
            raise ValueError(f"{file}: {key} must be a number, got {summary[key]!r}")
    for key in _SUMMARY_COUNTS:
        if isinstance(summary[key], bool) or not isinstance(summary[key], int):
            raise ValueError(f"{file}: {key} must be a whole number, got {summary[key]!r}")
    check_dataset_name(summary["dataset"], f"{file}: dataset")
    return summary


def model_card(
    model: nn.Module,
    checkpoint: str | Path | None = None,
    *,
    ema: bool = False,
    hub_id: str | None = None,
) -> str:
    """The ``README.md`` of ``model`` in timm's Hugging Face layout, as timm's
    ``push_to_hf_hub`` lays it out (``timm.models._hub.generate_readme``).

    YAML front matter (``tags``, ``pipeline_tag``, ``library_name: timm``, ``license`` and
    ``datasets`` from the run), then the model's details: its name and architecture,
    parameters, forward GFLOPs of one image at its input size
    (:func:`ssog.models.count_flops`), the file its weights come from (``checkpoint``, a
    run's; ``ema``: its EMA weights), the data set and the final and best metrics of that
    run (:func:`run_summary`; without a checkpoint: initial weights), how to
    load it (``timm.create_model("hf-hub:HUB_ID")``, ``HUB_ID`` ``USER/REPO`` until given, or
    ``local-dir:``), the run's training recipe (:func:`training_recipe`), and BibTeX for the
    paper (``ssog.models._registry.PAPER``, what every
    preset's ``pretrained_cfg`` holds) and for this library. The licence is the
    ``pretrained_cfg``'s, else the project's (MIT).
    """
    from timm.models._hub import generate_readme

    from ..models._registry import LICENSE, PAPER

    pretrained = getattr(model, "pretrained_cfg", None) or {}
    name = pretrained.get("architecture") or type(model).__name__
    details: dict[str, Any] = {"Model Type": "Image classification / feature backbone"}
    family, op = getattr(model, "family", None), getattr(model, "op", None)
    if family in FAMILY_TITLES and op in MIXER_TITLES:
        details["Architecture"] = f"{FAMILY_TITLES[family]}, {MIXER_TITLES[op]}"
    details["Model Stats"] = _model_stats(model)
    if checkpoint is None:
        details["Weights"] = "initial (random) weights of the architecture, not trained"
    else:
        details["Weights"] = f"{'the EMA weights of ' if ema else ''}a run's {Path(checkpoint).name}"
        summary = run_summary(checkpoint)
        if summary:
            details["Dataset"] = summary["dataset"]
            details["Metrics"] = _metrics(summary)
        recipe = training_recipe(checkpoint)
        if recipe:
            details["Training recipe"] = recipe
    details["Papers"] = [f"{PAPER['paper_name']}: {PAPER['origin_url']}"]
    details["Library"] = f"ssog {_version()}"
    card = {
        "tags": ["image-classification", "timm", "ssog"],
        "library_name": "timm",
        "license": pretrained.get("license") or LICENSE,
        "description": f"{name}: an image classifier of the ssog library, in timm's format. "
                       "It takes any image size divisible by its patch (the position embedding is resampled).",
        "details": details,
        "usage": _usage(check_hub_id(hub_id) if hub_id else "USER/REPO"),
        "citation": [_paper_bibtex(), _library_bibtex()],
    }
    body = {key: value for key, value in card.items() if key != "license"}  # the header is written apart
    return _front_matter(card) + _body(generate_readme(body, name))


def _front_matter(card: dict[str, Any]) -> str:
    """The card's YAML header, the fields timm's ``generate_readme`` writes, written by a YAML
    dumper: a value is data, never more YAML."""
    header = {"tags": card["tags"], "pipeline_tag": "image-classification", "library_name": card["library_name"],
              "license": str(card["license"])}
    if "Dataset" in card["details"]:
        header["datasets"] = [card["details"]["Dataset"].lower()]
    return "---\n" + yaml.dump(header, Dumper=_OneLineDumper, sort_keys=False, allow_unicode=True,
                               width=float("inf")) + "---\n"


class _OneLineDumper(yaml.SafeDumper):
    """PyYAML's safe dumper writing every value on one line: a string holding a line break
    double-quoted with escapes, so no line of the header is ever a value's (a ``---`` or a key)."""


_OneLineDumper.add_representer(
    str, lambda dumper, value: dumper.represent_scalar(
        "tag:yaml.org,2002:str", value, style='"' if any(c in value for c in "\n\r\x85\u2028\u2029") else None))


def _body(readme: str) -> str:
    """``generate_readme``'s card without its header: the text after the second ``---`` line
    (its header's values are one line each: constants and a dataset's name, :func:`run_summary`)."""
    return readme[readme.index("\n---\n") + len("\n---\n"):]


def training_recipe(checkpoint: str | Path) -> dict[str, str] | None:
    """The training recipe of the run that wrote ``checkpoint`` (a run folder: its ``best``),
    from the config stored in it, as timm's cards summarise theirs: data and its validation
    split, epochs, batch, optimizer and learning rate, schedule, augmentation and
    regularisation, EMA, precision, and the ``ssog eval`` command that evaluates the released
    folder on the run's validation images (where its flags can name them); None for a file
    without a run's config (plain weights)."""
    from ..train.checkpoint import checkpoint_path, read_checkpoint_info

    try:
        config = read_checkpoint_info(checkpoint_path(checkpoint, "best")).get("config")
    except (OSError, ValueError):
        return None
    if not config:
        return None
    get = config.get
    size = f", {get('img_size')} px" if get("img_size") else ""
    cooldown = f" + {get('cooldown_epochs')} cooldown" if get("cooldown_epochs") else ""
    accum = f" ({get('grad_accum_steps')} accumulated micro-batches)" if get("grad_accum_steps", 1) > 1 else ""
    layer_decay = f", layer decay {get('layer_decay')}" if get("layer_decay") else ""
    clip = f", gradient clipping {get('clip_grad')}" if get("clip_grad") else ""
    settings = [f"{name} {get(key)}" for name, key in (
        ("RandAugment/AutoAugment", "auto_augment"), ("random erasing", "re_prob"), ("crop scale", "scale"),
        ("flip", "hflip"), ("colour jitter", "color_jitter")) if get(key) is not None]
    mixes = [f"{name} {get(key)}" for name, key in (("mixup", "mixup"), ("cutmix", "cutmix")) if get(key) is not None]
    recipe = {
        # the data folder by its name: the card is published, the trainer's machine path is not
        "Data": f"{get('dataset')}{size}" + (f" (folder {Path(get('data_dir')).name})" if get("data_dir") else ""),
        "Validation": _validation_split(config),
        "Epochs": f"{get('epochs')}{cooldown}" + (f", stopped at step {get('max_steps')}" if get("max_steps") else ""),
        "Batch size": f"{get('batch_size')}{accum}",
        "Optimizer": f"{get('opt')}, lr {get('lr'):g}, weight decay {get('weight_decay'):g}{layer_decay}{clip}",
        "Schedule": f"{get('sched')}, {get('warmup_epochs')} warmup epochs from {get('warmup_lr'):g}, "
                    f"min lr {get('min_lr'):g}",
        "Augmentation": ", ".join([f"level {get('augment')}", *settings, *mixes]),
        "Regularisation": f"label smoothing {get('label_smoothing')}, drop path {get('drop_path')}",
        "EMA": f"decay {get('ema_decay')}" if get("ema_decay") else "none",
        "Precision": {"none": "float32"}.get(get("amp"), get("amp")),
        "Seed": str(get("seed")),
    }
    command = _eval_command(config)
    if command:
        recipe["Evaluation"] = command
    return recipe


def _validation_split(config: dict[str, Any]) -> str:
    """The images a run validated on, in words: those its ``val_split`` held out of the training
    data (stratified, seeded by ``split_seed``), the split or folder it names, or the source's own."""
    val_split, dataset = config.get("val_split"), config.get("dataset")
    where = "folder" if dataset == "imagefolder" else "set"
    if isinstance(val_split, str):
        return f"the {val_split}/ folder" if dataset == "imagefolder" else f"the {val_split!r} split"
    if isinstance(val_split, int):
        held = f"{val_split:,} images"
    elif isinstance(val_split, float):
        held = f"a fraction {val_split:g}"
    else:
        return _OWN_VALIDATION.get(str(dataset), "the data set's own validation split")
    return f"{held} held out of the training {where} (stratified), split_seed {config.get('split_seed', 0)}"


#: The validation images of a source used without ``val_split``.
_OWN_VALIDATION = {"imagefolder": "the val/ (or validation/) folder", "cifar10": "the test set",
                   "cifar100": "the test set"}


def _eval_command(config: dict[str, Any]) -> str | None:
    """The ``ssog eval`` command that evaluates the released folder on the run's validation
    images, DATA_DIR standing for the data folder; None where its flags cannot name that data
    (data given in Python, generated data of the run's own size, a timm source's options or
    training split)."""
    dataset, val_split, seed = config.get("dataset"), config.get("val_split"), config.get("split_seed", 0)
    if dataset in ("custom", "synthetic") or config.get("dataset_kwargs") \
            or config.get("train_split", "train") != "train":
        return None
    flags = ["--checkpoint FOLDER", f"--dataset {dataset}"]
    if config.get("data_dir"):
        flags.append("--data-dir DATA_DIR")
    if val_split is not None:
        flags.append(f"--val-split {val_split}")
    if seed or (val_split is not None and not isinstance(val_split, str)):  # a seeded split (digits: always)
        flags.append(f"--split-seed {seed}")
    placeholders = "FOLDER: this folder" + (
        f"; DATA_DIR: the data folder{' (the one with train/)' if dataset == 'imagefolder' else ''}"
        if config.get("data_dir") else "")
    return f"`ssog eval {' '.join(flags)}` ({placeholders}) gives the metrics above"


def _model_stats(model: nn.Module) -> dict[str, str]:
    params = sum(p.numel() for p in model.parameters())
    stats = {"Params (M)": f"{params / 1e6:.3f}", "Params": f"{params:,}"}
    patch_embed = getattr(model, "patch_embed", None)
    if patch_embed is not None and hasattr(model, "num_prefix_tokens"):  # what count_flops reads
        from ..models import count_flops

        height, width = patch_embed.img_size
        stats["GFLOPs"] = f"{count_flops(model)['total_gflops']:.4g} (one {height}x{width} image, 2 per multiply-add)"
        stats["Image size"] = f"{height} x {width}"
    return stats


def _metrics(summary: dict[str, Any]) -> dict[str, str]:
    """The run's final epoch and best checkpoint, from its ``summary.json``."""
    final = f"Acc@1 {summary['acc1']:.2f}, Acc@3 {summary['acc3']:.2f}, Acc@5 {summary['acc5']:.2f}, " \
            f"val loss {summary['loss']:.4f}"
    metrics = {f"Final (epoch {summary['epochs']})": final}
    if "ema_acc1" in summary:
        metrics["Final EMA"] = f"Acc@1 {summary['ema_acc1']:.2f}, Acc@5 {summary['ema_acc5']:.2f}"
    best = "EMA Acc@1" if summary.get("best_metric") == "ema_acc1" else "Acc@1"
    metrics["Best"] = f"{best} {summary['best_acc1']:.2f} at epoch {summary['best_epoch']} (best.safetensors)"
    return metrics


def _usage(hub_id: str) -> str:
    return (
        "```python\n"
        "import timm\n"
        "import ssog  # registers the ssog architectures with timm\n\n"
        f"model = timm.create_model(\"hf-hub:{hub_id}\", pretrained=True).eval()\n"
        "# or from a local copy of this folder: timm.create_model(\"local-dir:PATH\", pretrained=True)\n"
        "transform = timm.data.create_transform(**timm.data.resolve_data_config(model=model))\n"
        "```\n"
    )


def _paper_bibtex() -> str:
    from ..models._registry import PAPER, PAPER_AUTHORS

    arxiv = PAPER["paper_ids"].removeprefix("arXiv:")
    year = "20" + arxiv[:2]  # an arXiv identifier starts with the year and month, YYMM
    return (
        f"@article{{ssog{year},\n"
        f"  title={{{PAPER['paper_name']}}},\n"
        f"  author={{{' and '.join(PAPER_AUTHORS)}}},\n"
        f"  journal={{arXiv preprint arXiv:{arxiv}}},\n"
        f"  year={{{year}}},\n"
        f"  url={{{PAPER['origin_url']}}}\n"
        "}"
    )


def _library_bibtex() -> str:
    return (
        "@software{ssog_library,\n"
        f"  title={{{LIBRARY_TITLE}}},\n"
        "  author={{the ssog authors}},\n"
        f"  version={{{_version()}}}\n"
        "}"
    )


def _version() -> str:
    from .. import __version__

    return __version__


# ----------------------------------------------------------------------------- Hugging Face layout
#: What ``timm.models.save_for_hf`` writes (timm's Hugging Face layout).
HF_FILES = ("config.json", "model.safetensors", "pytorch_model.bin")


def save_for_hf(model: torch.nn.Module, directory: str | Path, readme: str | None = None) -> Path:
    """Write ``model`` in timm's Hugging Face layout (``config.json`` with its architecture,
    arguments, data config and class names; ``model.safetensors``; ``README.md``: ``readme``,
    its model card, :func:`model_card`) to the new or empty folder
    ``directory``, through ``timm.models.save_for_hf``, so that
    ``timm.create_model("local-dir:DIR", pretrained=True)`` (or ``hf-hub:USER/REPO`` once
    uploaded) rebuilds it. The files are written to a temporary folder beside it and moved
    there at once; a folder that already holds a model is refused."""
    from timm.models import save_for_hf as timm_save_for_hf

    # A link to an (empty) folder is written through, into its target; ``a/../b`` is ``b``,
    # so no ``a/`` is created on the way (both as the user reads the path).
    directory = Path(directory).resolve() if Path(directory).is_symlink() else Path(os.path.normpath(directory))
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        held = next((name for name in HF_FILES if (directory / name).exists()), None)
        what = f"already holds a model ({held})" if held else "is not an empty folder"
        raise ValueError(f"--output {directory} {what}; choose a new folder")
    directory.parent.mkdir(parents=True, exist_ok=True)
    labels = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    tmp = temporary_path(directory)
    tmp.mkdir()  # the permissions of a new folder (tempfile.mkdtemp's are 0o700: not shareable)
    try:
        timm_save_for_hf(model, str(tmp), model_config={"label_names": labels} if labels else None,
                         safe_serialization=True)
        if readme is not None:
            (tmp / "README.md").write_text(readme, encoding="utf-8")
        for file in tmp.iterdir():  # safetensors writes 0600: give every file what the umask allows
            os.chmod(file, new_file_mode())
        os.replace(tmp, directory)  # replaces an empty folder too
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def save_run_for_hf(
    checkpoint: str | Path, directory: str | Path, ema: bool = False, hub_id: str | None = None,
) -> Path:
    """A run's trained model (a run folder: its ``best``; ``ema``: its EMA weights) in timm's
    Hugging Face layout (:func:`save_for_hf`), with the run's data config and class names, and
    its model card (:func:`model_card`: the run's metrics; ``hub_id``, ``USER/REPO``,
    the name it loads by from the hub)."""
    from ..train.checkpoint import checkpoint_path, load_checkpoint
    from ..train.config import TIMM_INIT_PREFIX
    from ..train.transfer import model_from_checkpoint, model_source

    if isinstance(model_source(checkpoint), str):
        raise ValueError(f"{checkpoint} is a released model already (timm's hub layout): copy the folder to publish "
                         "it; --format hf writes a run's checkpoint in that layout")
    path = checkpoint_path(checkpoint, "best")
    config = load_checkpoint(path, only=("config",)).get("config") or {}
    if (config.get("init_from") or "").startswith(TIMM_INIT_PREFIX):
        raise ValueError(f"{path} is a timm model converted to SSoG ({config['init_from']}); timm's layout names "
                         "an architecture timm can rebuild, which a conversion is not: use ssog.convert on it")
    model = model_from_checkpoint(path, ema=ema)
    return save_for_hf(model, directory, readme=model_card(model, path, ema=ema, hub_id=hub_id))
