"""Checks of the numeric options of the token mixers and of the models built on them: plain
functions each constructor calls on its own arguments before it builds anything.

:func:`check_integer`, :func:`check_number`, :func:`check_probability` and :func:`check_size`
raise a one-line ``ValueError`` that names the option, its value and the expected range, e.g.
``num_heads=0: expected an integer >= 1``; ``None`` (the default) passes. The rules that tie
options together live here too: :func:`check_heads` (the width splits into equal heads),
:func:`token_grid` (the image splits into whole patches) and :func:`check_kernel_reach` (the
initial centres and the steering radius stay within the token grid).

Each mixer states its options' ranges in its ``check_options``
(:meth:`~ssog.layers.SSoGAttention.check_options`,
:meth:`~ssog.layers.MultiHeadAttention.check_options`), which its constructor runs and the
model families (:class:`~ssog.models._base.ViTBase` and its subclasses) run on the mixer's
options before building any module; each family checks its own arguments in its constructor.
Options that name a choice (``op``, ``centre_init``, ``solver``, ...) are checked where their
choices are listed.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

__all__ = [
    "check_heads", "check_integer", "check_kernel_reach", "check_number", "check_probability", "check_size",
    "token_grid",
]


def _format(number: float) -> str:
    """``1048576`` for 2.0**20, ``0.5`` for 0.5: a bound as a reader writes it."""
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_integer(name: str, value: Any, low: int) -> None:
    """``value`` is a whole number ``>= low`` (a count or size; ``bool`` and ``4.0`` are not)."""
    if value is not None and not (_is_integer(value) and value >= low):
        raise ValueError(f"{name}={value!r}: expected an integer >= {low}")


def check_size(name: str, value: Any) -> None:
    """``value`` is an image or patch size in pixels: an integer >= 1, or a ``(height, width)``
    pair of them."""
    pair = (value, value) if _is_integer(value) else value
    if value is not None and not (isinstance(pair, (tuple, list)) and len(pair) == 2
                                  and all(_is_integer(side) and side >= 1 for side in pair)):
        raise ValueError(f"{name}={value!r}: expected an integer >= 1 or a (height, width) pair of them")


def _number_range(low: float | None, high: float | None, low_open: bool, high_open: bool, noun: str,
                  unit: str) -> str:
    """What :func:`check_number` expects, as its message says it."""
    if low is not None and high is not None:
        text = (f"a {noun} in {'(' if low_open else '['}{_format(low)}, "
                f"{_format(high)}{')' if high_open else ']'}")
    elif low is not None:
        text = f"a finite {noun} {'>' if low_open else '>='} {_format(low)}"
    else:
        text = f"a finite {noun}"
    return f"{text} ({unit})" if unit else text


def _in_range(value: Any, low: float | None, high: float | None, low_open: bool, high_open: bool) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
        return False
    if low is not None and (value <= low if low_open else value < low):
        return False
    return high is None or (value < high if high_open else value <= high)


def check_number(name: str, value: Any, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False, noun: str = "number", unit: str = "") -> None:
    """``value`` is a finite real number, between ``low`` and ``high`` where given (``*_open``:
    the bound itself excluded); ``noun`` names it in the message, ``unit`` follows in parentheses."""
    if value is not None and not _in_range(value, low, high, low_open, high_open):
        raise ValueError(f"{name}={value!r}: expected {_number_range(low, high, low_open, high_open, noun, unit)}")


def check_probability(name: str, value: Any) -> None:
    """``value`` is a dropout probability, in ``[0, 1)``."""
    check_number(name, value, 0, 1, high_open=True, noun="probability")


def check_heads(dim: int, num_heads: int, dim_name: str = "dim") -> None:
    """The width ``dim`` (called ``dim_name``) and ``num_heads`` are integers >= 1 and ``dim``
    splits into ``num_heads`` heads of equal width."""
    check_integer(dim_name, dim, 1)
    check_integer("num_heads", num_heads, 1)
    if dim % num_heads:
        width = dim - dim % num_heads or num_heads  # the nearest multiple below, else num_heads itself
        heads = max(h for h in range(1, num_heads) if dim % h == 0)
        raise ValueError(f"{dim_name}={dim} is not divisible by num_heads={num_heads}: expected {dim_name} a "
                         f"multiple of num_heads (heads of equal width, e.g. {dim_name}={width}, or "
                         f"num_heads={heads})")


def token_grid(img_size: int | tuple[int, int], patch_size: int | tuple[int, int]) -> tuple[int, int]:
    """The token grid ``(Hg, Wg)`` of ``img_size`` cut into ``patch_size`` patches (either an
    int or a ``(height, width)`` pair of them); a size that would leave part of a patch over
    (a fractional grid) is an error."""
    check_size("img_size", img_size)
    check_size("patch_size", patch_size)
    sizes = tuple(img_size) if isinstance(img_size, (tuple, list)) else (img_size, img_size)
    patches = tuple(patch_size) if isinstance(patch_size, (tuple, list)) else (patch_size, patch_size)
    if any(size % patch for size, patch in zip(sizes, patches)):
        grid = " x ".join(_format(size / patch) for size, patch in zip(sizes, patches))
        raise ValueError(f"img_size={img_size} is not divisible by patch_size={patch_size}: expected a whole "
                         f"number of patches per side, not a {grid} token grid")
    return sizes[0] // patches[0], sizes[1] // patches[1]


def check_kernel_reach(ssog_options: Mapping[str, Any], grid: tuple[int, int], kernel_scale: tuple[float, float],
                       units: str) -> None:
    """The kernel lengths of a model's SSoG layers: the initial centres (``centre_radius``,
    unless ``centre_init="zero"``, which places them at the query) and the steered centres'
    reach (``steer_radius``, when ``mu`` is steered) lie within its ``grid (Hg, Wg)`` of tokens;
    a length the layers do not use is held to the layer's own range alone
    (:meth:`~ssog.layers.SSoGAttention.check_options`).

    A length ``r`` in ``units`` (the model's ``kernel_units``) becomes ``r * kernel_scale``
    tokens per axis ``(y, x)``; an offset longer than the grid places the kernel outside the
    image for every query (and far enough out, the loss is not finite at the first step).
    """
    rows, cols = grid
    limit = min(rows / kernel_scale[0], cols / kernel_scale[1])
    # name: (whether the layers use it, whether 0 is excluded, as in the layer's range)
    lengths = {"centre_radius": (ssog_options.get("centre_init") != "zero", False),
               "steer_radius": ("mu" in ssog_options.get("steer", ()), True)}
    for name, (in_use, low_open) in lengths.items():
        value = ssog_options.get(name)
        if in_use and value is not None and not _in_range(value, 0, limit, low_open, False):
            raise ValueError(
                f"{name}={value!r}: expected {_number_range(0, limit, low_open, False, 'number', '')} "
                f"(kernel_units={units!r}: {_format(limit)} is the extent of this model's {rows}x{cols} token grid; "
                "a longer offset places every kernel outside the image)"
            )
