"""timm registration: ``{op}_{family}_{preset}`` for every family, op and preset.

Each family module calls :func:`register_family` once; that defines one timm entry point
per (op, preset) in the family module (so ``timm.list_models(module="odevit")`` and
``timm.create_model("ssog_odevit_base_patch16_224")`` work) with its ``default_cfg``.
"""
from __future__ import annotations

import difflib
import fnmatch
import sys
from pathlib import Path
from typing import Any, Callable

import timm
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import PretrainedCfg, build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from ..image_statistics import CIFAR10_MEAN, CIFAR10_STD
from .weights import checkpoint_filter_fn
from ._blocks import OPS
from ._names import MODEL_NAMES

#: The paper the models implement, in timm's ``pretrained_cfg`` fields (``origin_url``: where
#: the method comes from, the paper's page); every preset's config holds them, and
#: ``ssog export --format hf`` writes them to config.json and cites them in the model card.
PAPER: dict[str, str] = {
    "paper_name": "Beyond Quadratic Attention: Separable Gaussian Operators for ODE Vision Transformers",
    "paper_ids": "arXiv:2611.08236",
    "origin_url": "https://arxiv.org/abs/2611.08236",
}
#: Its authors, ``family, given`` (the model card's BibTeX).
PAPER_AUTHORS: tuple[str, ...] = ("Boned Riera, Carlos", "Romero Sanchez, David", "Ramos Terrades, Oriol")
#: The project's licence (pyproject.toml, LICENSE), as timm's ``pretrained_cfg["license"]``.
LICENSE = "mit"

_DIGITS_CFG = dict(input_size=(1, 8, 8), num_classes=10, mean=(0.5,), std=(0.5,), crop_pct=1.0)

#: Presets: model arguments (``applications`` = blocks / loop iterations / NFE) and the
#: data config timm reads from ``default_cfg``.
PRESETS: dict[str, dict[str, Any]] = {
    # The paper's widths (Table 10): patch 16 at 224 px, 12 block applications.
    "small_patch16_224": dict(embed_dim=384, num_heads=6, applications=12),
    "medium_patch16_224": dict(embed_dim=576, num_heads=9, applications=12),
    "base_patch16_224": dict(embed_dim=768, num_heads=12, applications=12),
    # CPU presets. 32 px CIFAR-size images, 8x8 tokens.
    "tiny_patch4_32": dict(
        img_size=32, patch_size=4, embed_dim=128, num_heads=4, applications=6,
        cfg=dict(input_size=(3, 32, 32), num_classes=10, mean=CIFAR10_MEAN, std=CIFAR10_STD,
                 crop_pct=1.0),
    ),
    # 8x8 single-channel images (scikit-learn's digits, the embedded default data set):
    # one token per pixel (tests, analysis), and 2x2-pixel patches with average pooling,
    # the one that trains (docs/results/presets.md).
    "micro_patch1_8": dict(
        img_size=8, patch_size=1, embed_dim=64, num_heads=4, applications=4, cfg=_DIGITS_CFG,
    ),
    "digits_patch2_8": dict(
        img_size=8, patch_size=2, embed_dim=64, num_heads=4, applications=4, global_pool="avg",
        cfg=_DIGITS_CFG,
    ),
}
#: Names registered by :func:`register_family`, in registration order.
_REGISTERED: list[str] = []


def _cfg(**overrides: Any) -> dict[str, Any]:
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": LICENSE,
        **PAPER,
        **overrides,
    }


def model_name(op: str, family: str, preset: str) -> str:
    return f"{op}_{family}_{preset}"


def register_family(module_name: str, model_cls: type[nn.Module]) -> None:
    """Register ``{op}_{model_cls.family}_{preset}`` for every op and preset.

    The entry points are defined in ``module_name`` (timm reads their ``default_cfg``
    from that module's ``default_cfgs``) and take timm's ``(pretrained=False, **kwargs)``;
    keyword arguments override the preset's.
    """
    module = sys.modules[module_name]
    family, depth_arg = model_cls.family, model_cls.depth_arg
    names = {name: (op, preset) for name, (fam, op, preset) in MODEL_NAMES.items() if fam == family}
    module.default_cfgs = generate_default_cfgs(
        {name: _cfg(**PRESETS[preset].get("cfg", {})) for name, (_, preset) in names.items()}
    )
    for name, (op, preset) in names.items():
        args = {k: v for k, v in PRESETS[preset].items() if k not in ("applications", "cfg")}
        # A family may take the presets' number as a default rather than a setting (odevit's
        # default_nfe, which an adaptive solver ignores).
        preset_arg = getattr(model_cls, "preset_depth_arg", depth_arg)
        args.update(op=op, **{preset_arg: PRESETS[preset]["applications"]})
        entry = _entry_point(model_cls, name, args)
        entry.__module__ = module_name
        setattr(module, name, register_model(entry))
        _REGISTERED.append(name)


def _entry_point(model_cls: type[nn.Module], name: str, preset_args: dict[str, Any]) -> Callable[..., nn.Module]:
    def entry(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        if pretrained and not _names_weights(kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay")):
            raise ValueError(
                f"{name} has no pretrained weights; train one with `ssog train` and load it with "
                "checkpoint_path='RUN/best.safetensors', "
                "pretrained=True, pretrained_cfg_overlay=dict(file='RUN/best.safetensors'), or, once exported "
                "with `ssog export --format hf`, timm.create_model('local-dir:DIR' or 'hf-hub:USER/REPO', "
                "pretrained=True)"
            )
        return build_model_with_cfg(
            model_cls, name, pretrained=pretrained, pretrained_filter_fn=checkpoint_filter_fn,
            feature_cfg=dict(out_indices=3, feature_cls="getter"),
            **{**preset_args, **kwargs},
        )

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = f"{model_cls.__name__} preset {name}: {preset_args}."
    return entry


def _names_weights(pretrained_cfg: Any, overlay: dict[str, Any] | None) -> bool:
    """Whether timm's ``pretrained_cfg`` (a ``local-dir:`` / ``hf-hub:`` model's, read from its
    config.json) or the overlay tells where weights are: the presets themselves have none."""
    if isinstance(pretrained_cfg, PretrainedCfg):
        pretrained_cfg = pretrained_cfg.to_dict()
    merged = {**(pretrained_cfg if isinstance(pretrained_cfg, dict) else {}), **(overlay or {})}
    return bool(merged.get("file") or merged.get("state_dict") or merged.get("hf_hub_id") or merged.get("url")
                or merged.get("source") in ("local-dir", "hf-hub"))


def list_models(pattern: str = "*") -> list[str]:
    """Sorted names of the registered ssog models matching the glob ``pattern``."""
    return sorted(fnmatch.filter(_REGISTERED, pattern))


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` for ssog models, with a ``ValueError`` naming close matches
    when ``name`` is not one of them."""
    known = list_models()
    if name not in known:
        raise ValueError(f"unknown model {name!r}; {did_you_mean(name, known)}")
    return timm.create_model(name, **kwargs)


def did_you_mean(name: str, known: list[str]) -> str:
    """``"did you mean A, B?"`` with the names of ``known`` closest to ``name``, else the list of
    ``known`` names when it is short (else a pointer to ``timm.list_models``)."""
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(close)}?"
    return f"known models: {', '.join(known)}" if len(known) <= 50 else "see timm.list_models() or ssog info"


def names_table(families: tuple[str, ...] = ("vit", "loopvit", "odevit")) -> dict[str, tuple[str, str, str]]:
    """``{name: (family, op, preset)}`` for every family, op and preset: what ``_names.py`` holds."""
    return {model_name(op, family, preset): (family, op, preset)
            for family in families for op in OPS for preset in PRESETS}


def _write_names_table() -> None:
    """Regenerate ``_names.py`` from :func:`names_table` (after adding a preset or an op)."""
    path = Path(__file__).with_name("_names.py")
    head = path.read_text().split("MODEL_NAMES")[0]
    rows = "".join(f'    "{name}": {entry!r},\n'.replace("'", '"') for name, entry in names_table().items())
    path.write_text(f"{head}MODEL_NAMES: dict[str, tuple[str, str, str]] = {{\n{rows}}}\n")


if __name__ == "__main__":
    _write_names_table()
