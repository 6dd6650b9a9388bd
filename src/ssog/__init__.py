"""ssog: separable sum-of-Gaussians (SSoG) token mixing for Vision Transformers.

The paper: https://arxiv.org/abs/2611.08236 (arXiv 2611.08236). docs/operator.md defines the
operator as implemented here; the code cites its sections and those of docs/models.md.

``import ssog`` registers the model families with timm (it imports :mod:`ssog.models`, whose
family modules hold one ``@register_model`` function per model), so that
``timm.create_model("ssog_vit_small_patch16_224")`` builds them. The other subpackages load on
first use (``ssog.train``, ``ssog.bench``, ...).
"""
from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

try:  # one home for the version: pyproject.toml, through the installed package's metadata
    __version__ = importlib.metadata.version(__name__)
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

#: Public names and the subpackage that defines each.
_EXPORTS = {
    "CenterNorm": "layers",
    "MultiHeadAttention": "layers",
    "SSoGAttention": "layers",
    "ssog_matrix": "ops",
    "ssog_mix": "ops",
    "convert": "conversion",
}
_SUBPACKAGES = ("analysis", "bench", "cli", "conversion", "data", "export", "layers", "models", "ops", "train")

__all__ = ["CenterNorm", "MultiHeadAttention", "SSoGAttention", "convert", "ssog_matrix", "ssog_mix", "__version__"]

if TYPE_CHECKING:
    from .conversion import convert
    from .layers import CenterNorm, MultiHeadAttention, SSoGAttention
    from .ops import ssog_matrix, ssog_mix


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, *_SUBPACKAGES])


from . import models  # noqa: E402,F401  (registers the models with timm)
