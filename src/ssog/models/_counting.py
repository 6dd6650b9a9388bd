"""Parameter and FLOP counts (Tables 10 and 4), for ``ssog info`` and ``ssog flops``.

FLOPs follow docs/models.md, "Counting": 2 per multiply-add, matmuls/linears/convolutions only, counted by
``torch.utils.flop_counter.FlopCounterMode`` on one image. SSoG mixing is counted in its
separable form (``ssog.ops.forced_backend("separable")``) and attention through the math
SDPA kernel (plain matmuls), so the counts depend neither on the backend a model was
built with nor on the device. On the meta device nothing is computed, so counting a base
model at 1024 px takes well under a second.
"""
from __future__ import annotations

from typing import Any

import torch
from timm.layers import Mlp, to_2tuple
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ..layers import MIXER_TYPES, CenterNorm
from ..ops import forced_backend
from ._base import ViTBase
from ._registry import create_model

#: Parts of a model reported by :func:`count_parameters`, in order.
PARTS: tuple[str, ...] = ("patch_embed", "pos_cls", "mixer", "mlp", "modulation", "norms", "head", "other")


def _part(model: nn.Module, name: str, module: nn.Module) -> str | None:
    if isinstance(module, MIXER_TYPES):
        return "mixer"
    if isinstance(module, Mlp):
        return "mlp"
    if module is getattr(model, "patch_embed", None):
        return "patch_embed"
    if module is getattr(model, "head", None):
        return "head"
    if name.endswith(("adaLN_modulation", "kernel_modulation")):
        return "modulation"
    if isinstance(module, (nn.LayerNorm, CenterNorm)):
        return "norms"
    return None


def parameter_parts(model: nn.Module) -> dict[str, str]:
    """``{parameter name: part}`` (:data:`PARTS`) for every parameter of ``model``, shared ones once.

    A parameter belongs to the innermost part its module lies in; the class and
    position embeddings (and anything else held by the model itself) are ``pos_cls``.
    """
    modules = dict(model.named_modules())
    parts = {}
    for name, _ in model.named_parameters():
        path = name.split(".")[:-1]
        part = "pos_cls" if not path else None
        for depth in range(len(path), 0, -1):
            prefix = ".".join(path[:depth])
            part = _part(model, prefix, modules[prefix])
            if part is not None:
                break
        parts[name] = part or "other"
    return parts


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameters by part (:data:`PARTS`, see :func:`parameter_parts`) and ``total``; shared
    parameters count once."""
    counts = dict.fromkeys(PARTS, 0)
    params = dict(model.named_parameters())
    for name, part in parameter_parts(model).items():
        counts[part] += params[name].numel()
    counts["total"] = sum(counts.values())
    return counts


def count_flops(model: nn.Module, img_size: int | tuple[int, int] | None = None) -> dict[str, Any]:
    """Forward FLOPs of one image of ``img_size`` (default: the model's nominal size).

    Returns ``total_gflops``, ``attention_gflops`` (the token-mixer modules, projections
    included) and ``tokens`` (prefix + patch tokens). Build the model on the meta device
    (``with torch.device("meta"): ...``) to count without computing.
    """
    vit: Any = model  # ours or a timm ViT: its patch_embed, in_chans and num_prefix_tokens are read
    height, width = to_2tuple(img_size) if img_size is not None else vit.patch_embed.img_size
    param = next(model.parameters())
    x = torch.zeros(1, vit.in_chans, height, width, device=param.device, dtype=param.dtype)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), forced_backend("separable"), sdpa_kernel(SDPBackend.MATH), counter:
        model(x)
    root = type(model).__name__
    mixers = {f"{root}.{name}" for name, module in model.named_modules() if isinstance(module, MIXER_TYPES)}
    attention = sum(sum(ops.values()) for name, ops in counter.get_flop_counts().items() if name in mixers)
    patch = vit.patch_embed.patch_size
    return {
        "total_gflops": counter.get_total_flops() / 1e9,
        "attention_gflops": attention / 1e9,
        "tokens": vit.num_prefix_tokens + (height // patch[0]) * (width // patch[1]),
    }


def model_info(name: str, **kwargs: Any) -> dict[str, Any]:
    """Parameters by part and architecture of the registered model ``name`` (built on
    the meta device; ``kwargs`` override its preset, e.g. ``num_classes``)."""
    with torch.device("meta"):
        model = create_model(name, **kwargs)
    assert isinstance(model, ViTBase)  # every registered ssog model is one
    return {"model": name, "params": count_parameters(model), "config": model.config()}


def model_flops(name: str, img_size: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """:func:`count_flops` of the registered model ``name``, built on the meta device."""
    if img_size is not None and img_size <= 0:
        raise ValueError(f"img_size must be positive, got {img_size}")
    with torch.device("meta"):
        model = create_model(name, **kwargs).eval()
    assert isinstance(model, ViTBase)  # every registered ssog model is one
    return {"model": name, "img_size": img_size or model.patch_embed.img_size[0], **count_flops(model, img_size)}
