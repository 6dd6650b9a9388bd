"""The options of ``ssog train``: one table (:data:`TRAIN_FLAGS`) from command-line flags to config
settings, with timm's train.py flags where timm has the setting.

Each :class:`Option` names its flags (the first is the one ``--help`` lists first), the config
key it sets (dotted: one entry of a mapping field, ``model_kwargs.grad_checkpointing``) and
the timm train.py flag of the same setting. How a value is read comes from the type of the
key's :class:`~ssog.train.config.TrainConfig` field unless the option says otherwise: a
number, ``null`` for a field that may be null, a list of numbers, a switch for a boolean. A flag
given on the command line overrides the recipe, and ``--set KEY=VALUE`` overrides the flags.
docs/training.md ("timm's flags") lists the table; tests/cli/test_timm_flags.py checks the two agree.
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = [
    "EMA_DECAY", "GROUPS", "TRAIN_FLAGS", "Option", "TIMM_INSTEAD", "add_options", "fill_fallbacks", "option_settings",
    "parse_split", "unknown_option_hint",
]

#: timm's ``--model-ema-decay`` default: the decay ``--model-ema`` alone keeps an EMA with.
EMA_DECAY = 0.9998
#: Help sections, in the order ``ssog train --help`` shows them.
GROUPS = ("data", "augmentation and regularisation", "optimisation and schedule", "run")
NULL = "null"


@dataclass(frozen=True)
class Option:
    """One option of ``ssog train``.

    ``key``: the config key it sets, or None for a behaviour ssog has fixed (``fixed``: the one
    value accepted, ``reason``: what ssog does instead). ``timm``: timm's train.py flag of this
    setting (one of ``flags``), None where timm has none. ``parse``/``nargs``: how the value is
    read (default: from the field's type); ``const``: the value of a switch, or of the flag
    given bare when ``nargs`` is ``"?"``. ``fallback``: set only where the resolved config
    leaves ``key`` null (a recipe's value stays).
    """

    flags: tuple[str, ...]
    key: str | None
    help: str
    group: str
    timm: str | None = None
    parse: Callable[[str], Any] | None = None
    nargs: int | str | None = None
    const: Any = None
    fixed: Any = None
    reason: str = ""
    fallback: bool = False

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments."""
        return self.flags[0].lstrip("-").replace("-", "_")


def parse_split(text: str) -> float | int | str:
    """A ``--val-split`` value (``ssog train``, ``ssog eval``): a fraction or count, or a split's name."""
    try:
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        return text


def _amp_dtype(text: str) -> str:
    """timm's ``--amp-dtype`` (float16 | bfloat16) as ssog's ``amp`` (fp16 | bf16)."""
    modes = {"float16": "fp16", "bfloat16": "bf16"}
    if text not in modes:
        raise argparse.ArgumentTypeError(f"expected float16 or bfloat16, got {text!r}")
    return modes[text]


_DATA, _AUG, _OPT, _RUN = GROUPS
#: Every option of ``ssog train`` that sets (or fixes) a setting; the order is the order in
#: which they apply (a later one wins where two set the same key), and ``--help``'s.
TRAIN_FLAGS: tuple[Option, ...] = (
    Option(("--model",), "model", "timm model name (default: the digits preset)", _DATA, "--model"),
    Option(("--dataset",), "dataset", "digits | cifar10 | cifar100 | imagefolder | synthetic, or a timm data source: "
           "hfds/NAME, hfids/NAME, wds/NAME, tfds/NAME, torch/NAME", _DATA, "--dataset"),
    Option(("--data-dir",), "data_dir", "data folder (CIFAR root, ImageFolder root with train/ and val/ or "
           "validation/, WebDataset shard folder, Hugging Face cache folder)", _DATA, "--data-dir"),
    Option(("--val-split",), "val_split", "split this fraction (<1) or count off the training set for validation, "
           "or name the validation split of a timm source or the validation folder of an ImageFolder "
           "(default: validation)", _DATA, "--val-split", parse=parse_split),
    Option(("--train-split",), "train_split", "the training split's name (timm's sources)", _DATA, "--train-split"),
    Option(("--train-subset",), "train_subset", "train on a seeded, stratified subset of N training images", _DATA),
    Option(("--num-classes",), "num_classes", "classifier outputs where the source does not tell them", _DATA,
           "--num-classes"),
    Option(("--img-size",), "img_size", "input size in pixels (default: the model's pretrained_cfg, e.g. 32 for "
           "*_tiny_patch4_32, 224 for *_patch16_224; so are --mean, --std, --crop-pct, --interpolation)", _DATA,
           "--img-size"),
    Option(("--mean",), "mean", "per-channel normalisation mean (one value, or one per channel)", _DATA, "--mean",
           nargs="+"),
    Option(("--std",), "std", "per-channel normalisation std", _DATA, "--std", nargs="+"),
    Option(("--crop-pct",), "crop_pct", "evaluation centre-crop fraction", _DATA, "--crop-pct"),
    Option(("--interpolation",), "interpolation", "resize filter: bicubic | bilinear | nearest | ...", _DATA,
           "--interpolation"),
    Option(("--num-workers", "-j", "--workers"), "num_workers", "data-loading worker processes per training process",
           _DATA, "--workers"),
    Option(("--data-in-memory",), "data_in_memory", "decode the data set once into memory and augment batches "
           "on tensors (crops and flips; for small images such as CIFAR and Tiny-ImageNet)", _DATA),
    Option(("--download", "--dataset-download"), "download", "download CIFAR where a network is available", _DATA,
           "--dataset-download"),
    Option(("--skip-bad-images",), "skip_bad_images",
           "leave out ImageFolder files that cannot be read, warning for each (default: refuse them)", _DATA),
    Option(("--augment",), "augment", "augmentation level: strong | moderate | weak | none (Table 15); the options "
           "below change its transform", _AUG),
    Option(("--no-aug",), "augment", "no training augmentation: --augment none", _AUG, "--no-aug", const="none"),
    Option(("--aa",), "auto_augment", "RandAugment / AugMix / AutoAugment string over the level's, e.g. "
           "rand-m9-mstd0.5-inc1 (none: off)", _AUG, "--aa"),
    Option(("--reprob",), "re_prob", "random-erasing probability", _AUG, "--reprob"),
    Option(("--scale",), "scale", "random-resized-crop area range LOW HIGH", _AUG, "--scale", nargs=2),
    Option(("--ratio",), "ratio", "random-resized-crop aspect-ratio range LOW HIGH", _AUG, "--ratio", nargs=2),
    Option(("--hflip",), "hflip", "horizontal-flip probability (given, also for data the levels do not flip: "
           "the digits)", _AUG, "--hflip"),
    Option(("--color-jitter",), "color_jitter", "brightness/contrast/saturation jitter (off under --aa, as timm)",
           _AUG, "--color-jitter"),
    Option(("--train-interpolation",), "train_interpolation", "the training crop's filter: random | bicubic | "
           "bilinear | ... (default: --interpolation's)", _AUG, "--train-interpolation"),
    Option(("--mixup",), "mixup", "mixup alpha (default: the level's)", _AUG, "--mixup"),
    Option(("--cutmix",), "cutmix", "cutmix alpha (default: the level's)", _AUG, "--cutmix"),
    Option(("--smoothing",), "label_smoothing", "label smoothing", _AUG, "--smoothing"),
    Option(("--drop-path",), "drop_path", "stochastic depth rate", _AUG, "--drop-path"),
    Option(("--epochs",), "epochs", "training epochs", _OPT, "--epochs"),
    Option(("--max-steps",), "max_steps", "stop after N optimizer steps (evaluated, saved and summarised there); the "
           "schedule keeps its epochs: a quick check of a recipe's whole pipeline", _OPT),
    Option(("--batch-size", "-b"), "batch_size", "global batch size (split over processes)", _OPT, "--batch-size"),
    Option(("--grad-accum-steps",), "grad_accum_steps", "micro-batches per optimizer step", _OPT,
           "--grad-accum-steps"),
    Option(("--opt",), "opt", "timm optimizer (default adamw)", _OPT, "--opt"),
    Option(("--lr",), "lr", "peak learning rate", _OPT, "--lr"),
    Option(("--weight-decay",), "weight_decay", "weight decay", _OPT, "--weight-decay"),
    Option(("--layer-decay",), "layer_decay", "layer-wise learning-rate decay (null: off)", _OPT, "--layer-decay"),
    Option(("--clip-grad",), "clip_grad", "gradient-norm clipping (null: off)", _OPT, "--clip-grad"),
    Option(("--sched",), "sched", "learning-rate schedule: cosine | tanh | step | multistep | poly | plateau | wsd | "
           "rsqrt | constant", _OPT, "--sched"),
    Option(("--warmup-epochs",), "warmup_epochs", "linear warmup length in epochs", _OPT, "--warmup-epochs"),
    Option(("--warmup-lr",), "warmup_lr", "learning rate the warmup starts from", _OPT, "--warmup-lr"),
    Option(("--min-lr",), "min_lr", "the schedule's lowest learning rate", _OPT, "--min-lr"),
    Option(("--decay-epochs",), "decay_epochs", "step: the interval; wsd/rsqrt: the decay phase", _OPT,
           "--decay-epochs"),
    Option(("--decay-milestones",), "decay_milestones", "multistep's epochs", _OPT, "--decay-milestones", nargs="+"),
    Option(("--decay-rate", "--dr"), "decay_rate", "step, multistep, plateau: the factor; poly: the power", _OPT,
           "--decay-rate"),
    Option(("--patience-epochs",), "patience_epochs", "plateau: epochs without gain before a decay", _OPT,
           "--patience-epochs"),
    Option(("--cooldown-epochs",), "cooldown_epochs", "epochs at min_lr after the schedule", _OPT, "--cooldown-epochs"),
    Option(("--model-ema",), "ema_decay", f"keep an EMA of the weights (decay {EMA_DECAY} unless set)", _OPT,
           "--model-ema", const=EMA_DECAY, fallback=True),
    Option(("--ema-decay", "--model-ema-decay"), "ema_decay", "keep an EMA of the weights with this decay", _OPT,
           "--model-ema-decay"),
    Option(("--amp",), "amp", "mixed precision: none | bf16 | fp16 (bare: fp16, as timm's --amp)", _OPT, "--amp",
           nargs="?", const="fp16"),
    Option(("--amp-dtype",), "amp", "mixed precision as timm names it: float16 | bfloat16", _OPT, "--amp-dtype",
           parse=_amp_dtype),
    Option(("--seed",), "seed", "random seed", _RUN, "--seed"),
    Option(("--deterministic",), "deterministic", "deterministic algorithms (exactly reproducible on CPU)", _RUN),
    Option(("--device",), "device", "auto | cpu | cuda", _RUN),
    Option(("--threads",), "threads", "intra-op threads of a CPU run (default: torch's choice)", _RUN),
    Option(("--channels-last",), "channels_last", "the model's 4-d weights in channels-last memory format", _RUN,
           "--channels-last"),
    Option(("--grad-checkpointing",), "model_kwargs.grad_checkpointing", "recompute each block in the backward pass "
           "instead of storing its activations (model.set_grad_checkpointing)", _RUN, "--grad-checkpointing",
           const=True),
    Option(("--compile",), "compile", "train through torch.compile (first steps slower while it compiles)", _RUN),
    Option(("--checkpoint-every",), "checkpoint_every", "also save last.safetensors every N optimizer steps", _RUN),
    Option(("--log-every", "--log-interval"), "log_every", "log the training loss and lr every N optimizer steps",
           _RUN, "--log-interval"),
    Option(("--eval-metric",), None, "the metric that picks best.safetensors: top1 only", _RUN, "--eval-metric",
           parse=str, fixed="top1", reason="ssog keeps best.safetensors by validation Acc@1 (the EMA's with an EMA): "
           "timm's top1"),
    Option(("--checkpoint-hist",), None, "checkpoints kept by the metric: 1 only (best.safetensors)", _RUN,
           "--checkpoint-hist", parse=int, fixed=1, reason="ssog keeps one best checkpoint (best.safetensors) beside "
           "last.safetensors"),
    Option(("--val-interval",), None, "evaluate every N epochs: 1 only", _RUN, "--val-interval", parse=int, fixed=1,
           reason="ssog evaluates at every epoch's end (and at --max-steps)"),
    Option(("--init-from",), "init_from", "start from this checkpoint's (or run folder's best) backbone, with a new "
           "head, its attention converted where the model is SSoG; or timm:NAME, timm's ViT NAME converted to SSoG "
           "(ssog.convert; pretrained where a hub is reachable), the run's model then being NAME", _RUN),
    Option(("--linear-probe",), "linear_probe", "train only the classifier on a frozen backbone", _RUN),
    Option(("--tensorboard",), "tensorboard", "also log to TensorBoard (OUTPUT/tensorboard)", _RUN),
    Option(("--wandb-project",), "wandb_project", "log to this Weights & Biases project", _RUN),
    Option(("--overwrite",), "overwrite", "replace the files of an earlier run in --output (only those: "
           "config.yaml, checkpoints, logs, curves, summary)", _RUN),
    Option(("--no-progress",), "progress", "no progress bars", _RUN, const=False),
)

#: timm train.py flags ``ssog train`` does not take, and what to use instead (the hint for them).
TIMM_INSTEAD = {
    "--pretrained": "--init-from timm:NAME, timm's NAME pretrained and converted to SSoG,",
    "--initial-checkpoint": "--init-from PATH, its backbone with a new head (--set init_keep_head=true: its head too),",
    "--input-size": "--img-size N",
    "--model-kwargs": "--set model_kwargs.KEY=VALUE",
    "--torchcompile": "--compile",
    "--log-wandb": "--wandb-project NAME",
    "--recovery-interval": "--checkpoint-every N",
    "--drop": "the classifier's dropout, --set model_kwargs.drop_rate=P (--drop-path is stochastic depth)",
}


def _field_type(key: str) -> Any:
    """The type hint of the TrainConfig field ``key`` names (None for an entry of a mapping)."""
    from ssog.train.config import TrainConfig

    return None if "." in key else typing.get_type_hints(TrainConfig)[key]


def _null_or(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """``kind``, reading ``null`` as None (a field that may be null)."""
    def parse(text: str) -> Any:
        return None if text == NULL else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error ("invalid float value")
    return parse


def _argument(option: Option) -> dict[str, Any]:
    """``add_argument``'s keyword arguments for ``option``: a switch for a boolean field or an
    option with a ``const`` alone, else a value read as the field's type (a list: its items;
    a field that may be null: ``null`` too)."""
    hint = _field_type(option.key) if option.key else None
    kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kind = next((k for k in kinds if k is not type(None)), None)
    if option.parse is None and option.nargs is None and (kind is bool or option.const is not None):
        return dict(action="store_const", const=True if option.const is None else option.const, help=option.help)
    args: dict[str, Any] = dict(help=option.help, nargs=option.nargs, const=option.const, type=option.parse)
    if option.parse is not None:
        return args
    if typing.get_origin(kind) is list:
        return dict(args, type=typing.get_args(kind)[0], nargs=option.nargs or "+")
    if kind not in (int, float, str):
        raise TypeError(f"option {option.flags[0]}: no reader for {option.key}'s type {hint}")
    return dict(args, type=_null_or(kind) if type(None) in kinds and kind is not str else kind)


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add every :data:`TRAIN_FLAGS` entry to ``parser``, in its help group; an option not given is
    absent from the parsed arguments."""
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for option in TRAIN_FLAGS:
        groups[option.group].add_argument(*option.flags, dest=option.dest, default=argparse.SUPPRESS,
                                          **_argument(option))


def option_settings(args: argparse.Namespace) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """The settings the given options make, as ``(key, value)`` overrides in table order, and
    the fallbacks (set only where the resolved config leaves the key null). Raises ValueError
    for a fixed behaviour asked otherwise."""
    overrides, fallbacks = [], []
    given: dict[str, tuple[Option, Any]] = {}  # the option that set each key, and its value
    for option in TRAIN_FLAGS:
        if not hasattr(args, option.dest):
            continue
        value = getattr(args, option.dest)
        if option.key is None:
            if value != option.fixed:
                raise ValueError(f"{option.flags[0]} {value}: {option.reason}; give {option.fixed} or leave it out")
        elif option.fallback:
            fallbacks.append((option.key, value))
        else:
            if option.key in given and given[option.key][1] != value and not _bare(*given[option.key]):
                first, first_value = given[option.key]
                raise ValueError(f"{_shown(first, first_value)} and {_shown(option, value)} both set {option.key}, "
                                 f"to {first_value!r} and {value!r}: give one")
            given[option.key] = (option, value)
            overrides.append((option.key, value))
    return overrides, fallbacks


def _bare(option: Option, value: Any) -> bool:
    """Whether ``option`` may have been given bare (``--amp``): then another flag of its key
    (``--amp-dtype bfloat16``) says the value, as in timm."""
    return option.nargs == "?" and value == option.const


def _shown(option: Option, value: Any) -> str:
    """``option`` as given on the command line: its flag, and its value unless a switch's."""
    return option.flags[0] if value == option.const and option.nargs is None else f"{option.flags[0]} {value}"


def fill_fallbacks(cfg: Any, fallbacks: Sequence[tuple[str, Any]]) -> Any:
    """``cfg`` (a TrainConfig) with each fallback set where it is null."""
    missing = {key: value for key, value in fallbacks if getattr(cfg, key) is None}
    return dataclasses.replace(cfg, **missing) if missing else cfg


def unknown_option_hint(option: str) -> str:
    """What to use instead of ``option``, which ``ssog train`` does not take: timm's flag's
    equivalent, or ``--set`` (with the config field the option names, if it names one)."""
    from ssog.train.config import TrainConfig

    if option in TIMM_INSTEAD:
        return f"timm's {option} is {TIMM_INSTEAD[option]} here"
    field = option.lstrip("-").replace("-", "_")
    key = field if field in TrainConfig.field_names() else "KEY"
    return f"--set {key}=VALUE sets any config field: docs/training.md, \"Configuration\""
