"""Finding the token mixers of a model: the one place that walks a model for them."""
from __future__ import annotations

from torch import nn

from .attention import MultiHeadAttention
from .ssog_attention import SSoGAttention

__all__ = ["MIXER_TYPES", "named_mixers", "ssog_mixers"]

#: The token-mixer layers of the ssog models.
MIXER_TYPES: tuple[type[nn.Module], ...] = (SSoGAttention, MultiHeadAttention)


def named_mixers(
    model: nn.Module, types: type[nn.Module] | tuple[type[nn.Module], ...] = MIXER_TYPES
) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every mixer of ``model`` of ``types``, in module order; a mixer
    shared by several applications (looped and ODE families) is listed once."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, types)]


def ssog_mixers(model: nn.Module) -> list[SSoGAttention]:
    """Every :class:`SSoGAttention` of ``model`` (each shared one once)."""
    return [module for module in model.modules() if isinstance(module, SSoGAttention)]
