"""ssog: separable sum-of-Gaussians (SSoG) token mixing for Vision Transformers.

The paper: https://arxiv.org/abs/2611.08236 (arXiv 2611.08236). docs/operator.md defines the
operator as implemented here; the code cites its sections and those of docs/models.md.

The package imports lazily: ``import ssog.ops`` (the operator) and ``import ssog.layers``
need torch alone, and the names below load their subpackage on first use. ``import ssog``
registers the model families with timm, so that ``timm.create_model("ssog_vit_small_patch16_224")``
builds them: at once when timm is already imported, else as soon as it is (importing timm
is what a caller of ``timm.create_model`` does), so the operator alone never loads timm.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import sys
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


class _RegisterWhenTimmLoads(importlib.abc.MetaPathFinder):
    """Import :mod:`ssog.models` (which registers the models) right after timm is imported.

    A meta-path finder that only watches for ``timm``: it lets the normal finders locate it
    and wraps the loader so that the registration runs once timm has fully loaded.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "timm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("timm")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module: Any) -> None:
            exec_module(module)
            importlib.import_module(".models", __name__)

        spec.loader.exec_module = exec_and_register  # type: ignore[method-assign]
        return spec


def _register_models_with_timm() -> None:
    if "timm" in sys.modules:
        importlib.import_module(".models", __name__)
    elif not any(isinstance(finder, _RegisterWhenTimmLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenTimmLoads())


_register_models_with_timm()
