"""Forward hooks that see every token-mixer application and the final norm's input.

The models always call their mixers positionally as ``attn(x, grid_size)``, once per block,
loop iteration or vector-field evaluation, so a forward hook on each
:class:`~ssog.layers.SSoGAttention` / :class:`~ssog.layers.MultiHeadAttention` module sees
every application in execution order, whatever the family. A continuous field with
``time_kernels`` also passes each call a ``kernel_offset``: the callbacks receive it among the
call's mixing options, to pass on to ``attention_matrix`` or the mixer.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from torch import Tensor, nn

from ..layers import named_mixers

__all__ = ["on_final_norm_input", "on_mixer_calls"]

#: Keyword arguments of a mixer call that change what it mixes with (not ``prepared``, which
#: only saves work), given to the callbacks as ``options``.
MIXING_OPTIONS = ("kernel_offset",)
#: ``callback(module_name, module, x, grid_size, options)`` with the mixer's input ``x (B, T, D)``
#: and the call's :data:`MIXING_OPTIONS` (``{}`` unless the kernels move with ``t``).
MixerCallback = Callable[[str, nn.Module, Tensor, tuple[int, int], dict[str, Any]], None]


@contextmanager
def on_mixer_calls(model: nn.Module, callback: MixerCallback) -> Iterator[None]:
    """Call ``callback`` after every mixer application of ``model`` inside the block."""
    mixers = named_mixers(model)
    if not mixers:
        raise ValueError(
            f"{type(model).__name__} has no SSoGAttention or MultiHeadAttention token mixer to analyse"
        )

    def make_hook(name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Tensor) -> None:
            if len(args) != 2:
                raise ValueError(
                    f"mixer {name} was called with {len(args)} positional arguments; the analysis "
                    "hooks need attn(x, grid_size)"
                )
            options = {key: kwargs[key] for key in MIXING_OPTIONS if kwargs.get(key) is not None}
            callback(name, module, args[0], tuple(args[1]), options)

        return hook

    handles = [module.register_forward_hook(make_hook(name), with_kwargs=True) for name, module in mixers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def on_final_norm_input(model: nn.Module, callback: Callable[[Tensor], None]) -> Iterator[None]:
    """Call ``callback(x)`` with the input ``(B, P + N, D)`` of the model's final ``norm``."""
    norm = getattr(model, "norm", None)
    if not isinstance(norm, nn.Module):
        raise ValueError(f"{type(model).__name__} has no final `norm` module whose input could be read")
    handle = norm.register_forward_pre_hook(lambda module, args: callback(args[0]))
    try:
        yield
    finally:
        handle.remove()
