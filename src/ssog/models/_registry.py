"""What the families' timm registrations share: the ``pretrained_cfg`` of every model, the
builder behind each ``@register_model`` function, and looking the registered names up.

Each family module writes out one ``@register_model`` function per model, as timm's own
modules do (``ssog_vit_small_patch16_224`` in :mod:`ssog.models.vit`, ...), with its
``default_cfgs`` from :func:`timm.models.generate_default_cfgs`; importing the module (which
``import ssog`` does) registers them, so ``timm.list_models(module="odevit")`` and
``timm.create_model("ssog_odevit_base_patch16_224")`` work.
"""
from __future__ import annotations

import difflib
import fnmatch
from typing import Any, TypeVar

import timm
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import PretrainedCfg, build_model_with_cfg, model_entrypoint
from torch import nn

from ..image_statistics import CIFAR10_MEAN, CIFAR10_STD
from .weights import checkpoint_filter_fn

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

#: The data config of the 32 px presets (``*_tiny_patch4_32``): CIFAR-size RGB images.
CIFAR_CFG: dict[str, Any] = dict(input_size=(3, 32, 32), num_classes=10, mean=CIFAR10_MEAN, std=CIFAR10_STD,
                                 crop_pct=1.0)
#: The data config of the 8x8 presets (``*_micro_patch1_8``, ``*_digits_patch2_8``): single-channel
#: images, as the embedded digits, the default data set.
DIGITS_CFG: dict[str, Any] = dict(input_size=(1, 8, 8), num_classes=10, mean=(0.5,), std=(0.5,), crop_pct=1.0)
#: The modules that register the families, as ``timm.list_models(module=...)`` names them.
FAMILY_MODULES: tuple[str, ...] = ("vit", "loopvit", "odevit")

Model = TypeVar("Model", bound=nn.Module)


def model_cfg(**overrides: Any) -> dict[str, Any]:
    """A registered model's ``pretrained_cfg``: ImageNet's data config at 224 px, the paper and
    the licence, and ``overrides``; the presets' weights are none (``url`` empty)."""
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


def build_registered(model_cls: type[Model], name: str, pretrained: bool = False, **kwargs: Any) -> Model:
    """Build the registered model ``name`` of ``model_cls`` with timm's ``build_model_with_cfg``
    (what each ``@register_model`` function calls, with its preset's arguments and the caller's
    ``kwargs`` over them). ``pretrained=True`` needs weights named by the caller: the presets
    have none."""
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
        feature_cfg=dict(out_indices=3, feature_cls="getter"), **kwargs,
    )


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
    names = [name for module in FAMILY_MODULES for name in timm.list_models(module=module)
             if model_entrypoint(name).__module__ == f"{__package__}.{module}"]
    return sorted(fnmatch.filter(names, pattern))


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
