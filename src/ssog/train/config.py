"""Training configuration: one flat dataclass, YAML recipes with inheritance and variants.

A recipe is a YAML mapping of :class:`TrainConfig` fields plus two optional keys:

* ``base: other.yaml`` (or a list): files, relative to this one, whose settings this file
  extends; mappings (``model_kwargs``) merge key by key, everything else is replaced.
* ``variants: {name: {...}}``: named sets of overrides, e.g. the rows of an ablation table;
  ``--variant name`` picks one (a file with variants needs one).

A run from a recipe writes to ``runs/<recipe file stem>/<variant>`` unless ``output`` is set.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ssog.data.data_config import INTERPOLATIONS
from ssog.data.info import check_dataset_name
from ssog.data.transforms import TRANSFORM_SETTINGS, Augmentation, configure_augmentation
from ssog.train.recipes import load_recipe, merge_settings
from ssog.train.run_folder import is_run_config

__all__ = [
    "TrainConfig", "data_source_from_overrides", "infer_dataset", "resolve_config", "upgrade_checkpoint_config",
]

# 2x2-pixel patches (4x4 tokens) and average pooling: with one-pixel patches of a grey image
# every token is a multiple of one vector, which LayerNorm reduces to its sign, and the
# digits then train several times slower.
DEFAULT_MODEL = "ssog_vit_digits_patch2_8"
#: Schedules of timm's create_scheduler_v2.
SCHEDULES = ("cosine", "tanh", "step", "multistep", "poly", "plateau", "wsd", "rsqrt", "constant")
# create_scheduler_v2 arguments set from fields of their own (or by the engine), never through sched_kwargs.
_OWN_SCHEDULE_OPTIONS = {
    "sched", "num_epochs", "decay_epochs", "decay_milestones", "decay_rate", "patience_epochs", "cooldown_epochs",
    "min_lr", "warmup_lr", "warmup_epochs", "step_on_epochs", "updates_per_epoch", "optimizer",
}
#: ``init_from`` of a run whose model is timm's ``NAME`` converted to SSoG (``timm:NAME``).
TIMM_INIT_PREFIX = "timm:"
#: The folder torchvision's CIFAR data sets keep under their root.
_CIFAR_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
# Data sources generated in memory, which ignore data_dir.
BUILT_IN_DATA = ("digits", "synthetic")
# Seeds are 32-bit: numpy's legacy seeding (and so the stratified splits) takes them modulo 2**32.
_SEED_LIMIT = 2**32


@dataclass
class TrainConfig:
    """Everything a training run needs; defaults train the embedded digits on a small SSoG ViT.

    Sizes are in pixels, ``batch_size`` is global (split over processes), learning rates are
    absolute, ``warmup_epochs`` / ``epochs`` count passes over the training set.
    """

    # model: created with timm.create_model(model, **model_kwargs, num_classes=..., ...)
    model: str = DEFAULT_MODEL
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    drop_path: float = 0.0
    # data
    dataset: str = "digits"
    data_dir: str | None = None
    # how to get the data when data_dir is not given: a recipe's words, shown in that error
    data_hint: str | None = None
    download: bool = False
    # The data config (docs/training.md, "One data config"): each of these left null comes from
    # the model's pretrained_cfg (timm's resolve_data_config), e.g. 32 px and CIFAR statistics
    # for the *_tiny_patch4_32 presets, 224 px and ImageNet statistics for the paper's sizes.
    img_size: int | None = None  # input side in pixels
    mean: list[float] | None = None  # per-channel normalisation (one value or one per channel)
    std: list[float] | None = None
    crop_pct: float | None = None  # evaluation centre-crop fraction
    interpolation: str | None = None  # resize filter: bicubic | bilinear | nearest | ...
    # A fraction or count split off the training set, or the name of the source's validation
    # split for timm's sources (null: the source's own: CIFAR's test set, ImageFolder's val/
    # or validation/ folder, a timm source's "validation" split)
    val_split: float | int | str | None = None
    train_split: str = "train"  # the training split's name (timm's sources)
    num_classes: int | None = None  # classifier outputs where the source does not tell them (null: the data's)
    # options of a timm source: timm.data.create_dataset's keyword arguments for hfds/ and torch/
    # (class_map, input_key, target_key, ...); input_key, target_key, num_samples and shuffle_size
    # for the wds/ and hfids/ streams (docs/training.md)
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    split_seed: int = 0
    # train on a seeded, stratified subset of this many training images (the validation split is
    # untouched; seeded by split_seed): the small-data regime where a spatial prior should pay
    train_subset: int | None = None
    synthetic_size: int = 256
    synthetic_classes: int = 10
    augment: str = "none"  # strong | moderate | weak | none (Table 15)
    mixup: float | None = None  # None: the augmentation level's alpha
    cutmix: float | None = None
    # timm's create_transform arguments over the level's (null: the level's; auto_augment "none": off;
    # train_interpolation null: interpolation's); ssog.data.transforms.configure_augmentation
    auto_augment: str | None = None
    re_prob: float | None = None
    scale: list[float] | None = None
    ratio: list[float] | None = None
    hflip: float | None = None
    color_jitter: float | None = None
    train_interpolation: str | None = None
    num_workers: int = 0
    # decode a map-style data set once into memory and augment whole batches on tensors in the
    # training process (crops and flips only; ssog.data.memory): no per-epoch decoding, no workers
    data_in_memory: bool = False
    # ImageFolder files that fail the up-front check: an error naming them (False), or a
    # warning naming each and the run goes on without them (True). See docs/training.md.
    skip_bad_images: bool = False
    # optimisation
    epochs: int = 30
    # stop after this many optimizer steps in all (null: the schedule's end), with the usual
    # evaluation, checkpoints and summary at that point; the schedule keeps the recipe's epochs
    max_steps: int | None = None
    batch_size: int = 64  # images per optimizer step, over all processes and accumulated micro-batches
    # micro-batches per optimizer step: each process holds batch_size / (processes x grad_accum_steps)
    # images at once and the gradients of grad_accum_steps of them are summed (timm's name)
    grad_accum_steps: int = 1
    opt: str = "adamw"
    lr: float = 5e-3
    weight_decay: float = 0.05
    # layer-wise lr decay (timm's optimizer factory with the model's group_matcher): each group
    # from the head down gets lr x layer_decay^depth (null: off)
    layer_decay: float | None = None
    # the learning-rate schedule, timm's create_scheduler_v2: cosine | tanh | step | multistep |
    # poly | plateau | wsd | rsqrt | constant, stepped every optimizer step (plateau: every epoch,
    # on validation Acc@1); sched_kwargs passes its other options (cycle_mul, k_decay, noise,
    # plateau_mode, decay_fn, ...)
    sched: str = "cosine"
    decay_epochs: float | None = None  # step: the interval; wsd/rsqrt: the decay phase (null: timm's)
    decay_milestones: list[float] = field(default_factory=lambda: [90, 180, 270])  # multistep
    decay_rate: float = 0.1  # step, multistep, plateau; poly's power
    patience_epochs: int = 10  # plateau
    cooldown_epochs: int = 0  # at min_lr after the schedule, trained after `epochs`
    sched_kwargs: dict[str, Any] = field(default_factory=dict)
    warmup_epochs: float = 2
    warmup_lr: float = 1e-5
    min_lr: float = 1e-5
    clip_grad: float | None = 1.0
    label_smoothing: float = 0.1
    ema_decay: float | None = None
    amp: str = "none"  # none | bf16 | fp16 (autocast; fp16 uses a gradient scaler)
    # transfer
    init_from: str | None = None  # checkpoint whose backbone starts the run (new head)
    init_keep_head: bool = False  # also load its classifier (same classes: warm starts)
    linear_probe: bool = False
    # run
    seed: int = 0
    deterministic: bool = False
    device: str = "auto"  # auto | cpu | cuda
    # Intra-op threads of a CPU run (null: torch's own choice, one per core); a recipe for a
    # shared machine may set 1 (docs/training.md, "threads").
    threads: int | None = None
    output: str | None = None  # None: runs/<timestamp>-<random hex>
    # replace the files of an earlier run in `output` (never other files); results unchanged
    overwrite: bool = False
    checkpoint_every: int = 0  # also save `last` every this many optimizer steps (0: epoch ends only)
    # every this many optimizer steps: the training loss and lr to TensorBoard / W&B, and a
    # progress line when stderr is not a terminal (0: epoch ends only)
    log_every: int = 50
    progress: bool = True
    compile: bool = False  # train through torch.compile (the model's forward and backward)
    channels_last: bool = False  # the model's 4-d weights (convolutions) in channels-last memory format
    tensorboard: bool = False
    wandb_project: str | None = None

    def __post_init__(self) -> None:
        if self.model_kwargs is None:  # `model_kwargs:` left empty in a recipe
            self.model_kwargs = {}
        for name in ("dataset_kwargs", "sched_kwargs"):
            if getattr(self, name) is None:
                setattr(self, name, {})
        if self.init_from and self.init_from.startswith(TIMM_INIT_PREFIX):
            self.model = self._timm_init_model()
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first field that is out of range."""
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"bad training config: {item.name} must be a finite number, got {value}")
        checks = [
            (self.epochs >= 1, "epochs must be >= 1"),
            (self.max_steps is None or self.max_steps >= 1, f"max_steps must be >= 1 or null, got {self.max_steps}"),
            (self.img_size is None or self.img_size >= 1, "img_size must be >= 1 (pixels) or null"),
            *((0 <= value < _SEED_LIMIT,
               f"{name} must be in [0, {_SEED_LIMIT - 1}] (numpy and scikit-learn take 32-bit seeds, so a larger "
               f"one would repeat a smaller one's run), got {value}")
              for name, value in (("seed (--seed)", self.seed), ("split_seed", self.split_seed))),
            (self.crop_pct is None or 0 < self.crop_pct <= 1, "crop_pct must be in (0, 1] or null"),
            (self.mean is None or (len(self.mean) >= 1 and all(map(math.isfinite, self.mean))),
             f"mean must be a list of finite numbers or null, got {self.mean}"),
            (self.std is None or (len(self.std) >= 1 and all(math.isfinite(v) and v > 0 for v in self.std)),
             f"std must be a list of numbers > 0 or null, got {self.std}"),
            (self.interpolation is None or self.interpolation in INTERPOLATIONS,
             f"interpolation must be one of {', '.join(INTERPOLATIONS)} or null, got {self.interpolation!r}"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.train_subset is None or self.train_subset >= 1, "train_subset must be >= 1 or null"),
            (self.lr > 0, "lr must be > 0"),
            (self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}"),
            (self.warmup_epochs >= 0, "warmup_epochs must be >= 0"),
            (self.warmup_lr >= 0 and self.min_lr >= 0, "warmup_lr and min_lr must be >= 0"),
            (self.min_lr <= self.lr and self.warmup_lr <= self.lr,
             f"min_lr ({self.min_lr}) and warmup_lr ({self.warmup_lr}) must not exceed lr ({self.lr}): the "
             "schedule rises from warmup_lr to lr and falls to min_lr"),
            (all(m > 0 for m in self.decay_milestones)
             and all(a < b for a, b in zip(self.decay_milestones, self.decay_milestones[1:])),
             f"decay_milestones must be epochs > 0 in increasing order, got {self.decay_milestones}"),
            (self.clip_grad is None or self.clip_grad > 0, "clip_grad must be > 0 or null (no clipping)"),
            (all(a is None or a >= 0 for a in (self.mixup, self.cutmix)), "mixup and cutmix must be >= 0 or null"),
            (self.synthetic_size >= 1 and self.synthetic_classes >= 2,
             "synthetic_size must be >= 1 and synthetic_classes >= 2"),
            (self.checkpoint_every >= 0, "checkpoint_every must be >= 0 (0: epoch ends only)"),
            (self.log_every >= 0, "log_every must be >= 0 (0: epoch ends only)"),
            (self.grad_accum_steps >= 1, f"grad_accum_steps must be >= 1, got {self.grad_accum_steps}"),
            (self.layer_decay is None or 0 < self.layer_decay <= 1, "layer_decay must be in (0, 1] or null"),
            (self.sched in SCHEDULES, f"sched must be one of {', '.join(SCHEDULES)}, got {self.sched!r}"),
            (self.decay_epochs is None or self.decay_epochs > 0, "decay_epochs must be > 0 or null"),
            (self.decay_rate > 0, "decay_rate must be > 0"),
            (self.patience_epochs >= 0 and self.cooldown_epochs >= 0,
             "patience_epochs and cooldown_epochs must be >= 0"),
            (isinstance(self.sched_kwargs, dict) and not set(self.sched_kwargs) & _OWN_SCHEDULE_OPTIONS,
             f"sched_kwargs may not set {sorted(set(self.sched_kwargs or {}) & _OWN_SCHEDULE_OPTIONS)}: "
             "they are training config fields"),
            (self.num_workers >= 0, "num_workers must be >= 0"),
            (self.threads is None or self.threads >= 1, "threads must be >= 1 or null (torch's default)"),
            (self.amp in ("none", "bf16", "fp16"), f"amp must be none, bf16 or fp16, got {self.amp!r}"),
            (self.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, got {self.device!r}"),
            (self.ema_decay is None or 0 < self.ema_decay < 1, "ema_decay must be in (0, 1) or null"),
            (0 <= self.drop_path < 1, "drop_path must be in [0, 1)"),
            (0 <= self.label_smoothing < 1, "label_smoothing must be in [0, 1)"),
            (isinstance(self.model_kwargs, dict), "model_kwargs must be a mapping"),
            (isinstance(self.dataset_kwargs, dict), "dataset_kwargs must be a mapping"),
            (self.num_classes is None or self.num_classes >= 2, "num_classes must be >= 2 or null"),
            (self.data_dir is None or self.dataset not in BUILT_IN_DATA,
             f"data_dir is set but dataset {self.dataset!r} reads no files; choose dataset imagefolder, "
             "cifar10 or cifar100 (or give data_dir without a dataset to infer it)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"bad training config: {message}")
        check_dataset_name(self.dataset, "bad training config: dataset (--dataset)")
        self.augmentation()  # the level and its transform settings

    def augmentation(self) -> Augmentation:
        """The training augmentation: the ``augment`` level with the transform settings set here."""
        try:
            return configure_augmentation(self.augment, **{name: getattr(self, name) for name in TRANSFORM_SETTINGS})
        except ValueError as error:
            raise ValueError(f"bad training config: {error}") from None

    def _timm_init_model(self) -> str:
        """The model a ``timm:NAME`` start builds: NAME, so logs, summaries and the saved config
        name the model trained. Another ``model`` set with it would be ignored: an error."""
        assert self.init_from is not None  # called for a timm: start only
        name = self.init_from[len(TIMM_INIT_PREFIX):]
        if self.model not in (DEFAULT_MODEL, name):
            raise ValueError(
                f"bad training config: init_from {self.init_from} trains timm's {name} converted to SSoG, "
                f"so model {self.model!r} would be ignored; leave model unset or set it to {name}"
            )
        return name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the config's fields, in declaration order (the keys of :meth:`to_dict`)."""
        return tuple(item.name for item in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        known = set(cls.field_names())
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown training config keys {unknown}; known keys: {sorted(known)}")
        hints = typing.get_type_hints(cls)
        values = dict(values)
        for key, value in values.items():
            values[key] = value = _yaml_float(value, hints[key])
            if not _matches(value, hints[key]):
                kind = hints[key].__name__ if isinstance(hints[key], type) else str(hints[key])
                raise ValueError(f"training config key {key!r} must be {kind}, got {value!r}")
        return cls(**values)


def _yaml_float(value: Any, hint: Any) -> Any:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; accept it where a float is expected."""
    if isinstance(value, str) and float in (typing.get_args(hint) or (hint,)):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _matches(value: Any, hint: Any) -> bool:
    """Whether a YAML value fits a field's type hint (ints are accepted for floats)."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for option in options:
        kind = typing.get_origin(option) or option
        if kind is type(None) and value is None:
            return True
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind in (bool, str, dict) and isinstance(value, kind):
            return True
        if kind is list and isinstance(value, list):
            item = (typing.get_args(option) or (Any,))[0]
            return item is Any or all(_matches(v, item) for v in value)
    return False


def resolve_config(
    recipe: str | Path | None = None,
    variant: str | None = None,
    overrides: Iterable[tuple[str, Any]] = (),
) -> TrainConfig:
    """Defaults <- recipe file (with bases) <- its ``variant`` <- ``overrides``.

    Overrides are ``(key, value)`` pairs; dotted keys set one entry of a mapping field
    (``model_kwargs.depth``).
    """
    values: dict[str, Any] = {}
    if recipe is not None:
        values = load_recipe(recipe)
        # Replacing an earlier run's files is asked for per command, never by a file: a run's
        # config.yaml records the --overwrite it was started with, and reusing it as a recipe
        # must not replace whatever its output holds now.
        if values.pop("overwrite", False) and not is_run_config(Path(recipe), TrainConfig.field_names()):
            raise ValueError(f"{recipe} sets overwrite: true; replacing an earlier run's files is asked for on the "
                             "command line only (--overwrite)")
        variants = values.pop("variants", None) or {}
        if variants and variant is None:
            raise ValueError(f"{recipe} defines variants {list(variants)}: choose one with --variant")
        if variant is not None:
            if variant not in variants:
                raise ValueError(f"{recipe} has no variant {variant!r}; it defines {list(variants)}")
            values = merge_settings(values, variants[variant])
    elif variant is not None:
        raise ValueError("--variant needs --config")
    overrides = list(overrides)
    recipe_values = values
    for key, value in overrides:
        head, _, rest = key.partition(".")
        values = merge_settings(values, {head: _nest(rest, value)} if rest else {head: value})
    values = data_source_from_overrides(recipe_values, values, {key.partition(".")[0] for key, _ in overrides})
    init_from = values.get("init_from")
    if init_from and not str(init_from).startswith(TIMM_INIT_PREFIX) and "model" not in values:
        values = merge_settings(_source_architecture(str(init_from)), values)
    if recipe is not None and values.get("output") is None:
        # A fixed place per recipe and variant, so that recipes can name each other's
        # checkpoints (warm starts, transfer) and a rerun is caught rather than overwriting.
        values["output"] = str(Path("runs") / Path(recipe).stem / (variant or "run"))
    return TrainConfig.from_dict(values)


def _source_architecture(init_from: str) -> dict[str, Any]:
    """``model`` and ``model_kwargs`` of the run (or checkpoint) ``init_from`` names: a run started
    from it without a model of its own continues that architecture."""
    from ssog.train.checkpoint import checkpoint_path, read_checkpoint_info

    try:
        config = read_checkpoint_info(checkpoint_path(init_from, "best")).get("config") or {}
    except (OSError, ValueError) as error:
        raise ValueError(f"init_from {init_from}: cannot read the model it was trained as ({error}); "
                         "name the model with --model") from None
    if "model" not in config:
        raise ValueError(f"init_from {init_from} holds weights only, without the model they belong to; "
                         "name it with --model")
    return {"model": config["model"], "model_kwargs": dict(config.get("model_kwargs") or {})}


def data_source_from_overrides(recipe: dict[str, Any], values: dict[str, Any],
                               overridden: set[str]) -> dict[str, Any]:
    """The data source of ``values`` when the command line names a dataset or a data folder: it
    beats the recipe's, so that ``--dataset synthetic`` tries a recipe before its data is
    downloaded. A dataset given without a folder drops the recipe's folder (and its download
    setting) when it is another source; a folder given without a dataset takes the source it
    visibly holds (a CIFAR folder, or an ImageFolder ``train/``), else keeps the recipe's (a
    folder to download into). With no dataset named anywhere, the folder's is inferred."""
    values = dict(values)
    if "dataset" in overridden and "data_dir" not in overridden and values["dataset"] != recipe.get("dataset"):
        values["data_dir"] = None
        if "download" not in overridden:
            values.pop("download", None)
    elif values.get("data_dir") is not None and "dataset" not in values:
        values["dataset"] = infer_dataset(values["data_dir"])
    elif "data_dir" in overridden and "dataset" not in overridden and values.get("data_dir") is not None:
        folder = Path(values["data_dir"]).expanduser()
        if any((folder / name).is_dir() for name in (*_CIFAR_FOLDERS.values(), "train")):
            values["dataset"] = infer_dataset(folder)
    return values


def upgrade_checkpoint_config(values: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's stored config, with the data settings of a run written before runs stored
    their data config (no ``mean`` key: ssog 0.1.0) filled in as that version used them: the
    data source's own size, mean, std and evaluation crop (:data:`ssog.data.info.SOURCE_STATISTICS`;
    an ImageFolder run trained with ImageNet's statistics at 224 px unless its ``img_size`` said
    otherwise) and bicubic resizing. Without this the model's ``pretrained_cfg`` would decide, and
    an old run would be evaluated on differently normalised images. Newer configs pass unchanged."""
    from ssog.data.info import SOURCE_STATISTICS

    if "mean" in values or values.get("dataset") not in SOURCE_STATISTICS:
        return values
    size, mean, std, crop_pct = SOURCE_STATISTICS[values["dataset"]]
    upgraded = dict(values, mean=list(mean), std=list(std), interpolation="bicubic")
    if upgraded.get("img_size") is None:
        upgraded["img_size"] = size
    if upgraded.get("crop_pct") is None:
        upgraded["crop_pct"] = crop_pct
    return upgraded


def infer_dataset(data_dir: str | Path) -> str:
    """The data source a ``data_dir`` given without a dataset holds: CIFAR when it contains
    torchvision's CIFAR folder, else an ImageFolder tree (checked when it is read)."""
    for name, folder in _CIFAR_FOLDERS.items():
        if (Path(data_dir) / folder).is_dir():
            return name
    return "imagefolder"


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value
