"""The numeric options of the token mixers and of the models built on them: one table,
checked before anything is built.

:data:`OPTIONS` says what each value must be (an integer >= 1, a finite number > 0, a
probability in [0, 1), ...). :func:`check_options` checks values against it and raises a
one-line ``ValueError`` that names the option, its value and the expected range, e.g.
``num_heads=0: expected an integer >= 1``. The rules that tie options together live here
too: :func:`check_heads` (the width splits into equal heads), :func:`token_grid` (the image
splits into whole patches) and :func:`check_kernel_reach` (the initial centres and the
steering radius stay within the token grid).

:class:`~ssog.layers.SSoGAttention` and :class:`~ssog.layers.MultiHeadAttention` check their
options with these at construction; the model families
(:class:`~ssog.models._base.ViTBase` and its subclasses) check theirs before building any
module. Options that name a choice (``op``, ``centre_init``, ``solver``, ...) are checked
where their choices are listed.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

from ..ops.checks import MAX_CENTRE_OFFSET

__all__ = [
    "OPTIONS", "Integer", "Number", "Size", "check_heads", "check_kernel_reach", "check_mixer_options",
    "check_options", "token_grid",
]


def _format(number: float) -> str:
    """``1048576`` for 2.0**20, ``0.5`` for 0.5: a bound as a reader writes it."""
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class Integer:
    """A whole number ``>= low`` (a count or size; ``bool`` and ``4.0`` are not integers)."""

    low: int

    def accepts(self, value: Any) -> bool:
        return _is_integer(value) and value >= self.low

    def __str__(self) -> str:
        return f"an integer >= {self.low}"


@dataclass(frozen=True)
class Size:
    """An image or patch size in pixels: an integer >= 1, or a ``(height, width)`` pair of them."""

    def accepts(self, value: Any) -> bool:
        pair = (value, value) if _is_integer(value) else value
        return (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(_is_integer(side) and side >= 1 for side in pair))

    def __str__(self) -> str:
        return "an integer >= 1 or a (height, width) pair of them"


@dataclass(frozen=True)
class Number:
    """A finite real number, between ``low`` and ``high`` where given (``open``: the bound
    itself excluded); ``noun`` names it in the message, ``unit`` follows in parentheses."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    noun: str = "number"
    unit: str = ""

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            text = (f"a {self.noun} in {'(' if self.low_open else '['}{_format(self.low)}, "
                    f"{_format(self.high)}{')' if self.high_open else ']'}")
        elif self.low is not None:
            text = f"a finite {self.noun} {'>' if self.low_open else '>='} {_format(self.low)}"
        else:
            text = f"a finite {self.noun}"
        return f"{text} ({self.unit})" if self.unit else text


Rule = Union[Integer, Size, Number]

_PROBABILITY = Number(0, 1, high_open=True, noun="probability")
#: Every numeric option of the mixers and the model families, and what its value must be.
#: Lengths of the SSoG kernels are in tokens; the model families give them in kernel units
#: (``kernel_units``), and :func:`check_kernel_reach` bounds them by the model's token grid.
OPTIONS: dict[str, Rule] = {
    # sizes and counts
    "img_size": Size(),
    "patch_size": Size(),
    "in_chans": Integer(1),
    "num_classes": Integer(0),
    "embed_dim": Integer(1),
    "dim": Integer(1),
    "num_heads": Integer(1),
    "num_atoms": Integer(1),
    "num_prefix_tokens": Integer(0),
    "depth": Integer(1),
    "num_loops": Integer(1),
    "nfe": Integer(1),
    "default_nfe": Integer(1),
    "mlp_ratio": Number(0, low_open=True),
    # dropout
    "drop_rate": _PROBABILITY,
    "proj_drop_rate": _PROBABILITY,
    "drop_path_rate": _PROBABILITY,
    "proj_drop": _PROBABILITY,
    "attn_drop": _PROBABILITY,
    # SSoG kernels; the operator places no centre further than MAX_CENTRE_OFFSET tokens
    "sigma_min": Number(0, low_open=True, unit="the width floor in tokens"),
    "centre_radius": Number(0, MAX_CENTRE_OFFSET, unit="tokens"),
    "steer_radius": Number(0, MAX_CENTRE_OFFSET, low_open=True, unit="tokens"),
    "steer_gate_init": Number(unit="the steering gates' starting logit"),
    # adaptive ODE solvers: a relative tolerance > 0 keeps the step size from collapsing
    "rtol": Number(0, low_open=True, noun="tolerance"),
    "atol": Number(0, noun="tolerance"),
}


def check_options(values: Mapping[str, Any]) -> None:
    """Check each value of ``values`` whose name is in :data:`OPTIONS` against its rule;
    ``None`` ("the default") and names not in the table pass.

    Raises:
        ValueError: ``"NAME=VALUE: expected RANGE"`` for the first value out of its range.
    """
    for name, value in values.items():
        rule = OPTIONS.get(name)
        if rule is not None and value is not None and not rule.accepts(value):
            raise ValueError(f"{name}={value!r}: expected {rule}")


def check_heads(dim: int, num_heads: int, dim_name: str = "dim") -> None:
    """The width ``dim`` (called ``dim_name``) and ``num_heads`` are integers >= 1 and ``dim``
    splits into ``num_heads`` heads of equal width."""
    check_options({dim_name: dim, "num_heads": num_heads})
    if dim % num_heads:
        width = dim - dim % num_heads or num_heads  # the nearest multiple below, else num_heads itself
        heads = max(h for h in range(1, num_heads) if dim % h == 0)
        raise ValueError(f"{dim_name}={dim} is not divisible by num_heads={num_heads}: expected {dim_name} a "
                         f"multiple of num_heads (heads of equal width, e.g. {dim_name}={width}, or "
                         f"num_heads={heads})")


def check_mixer_options(**options: Any) -> None:
    """A token mixer's numeric options (``dim``, ``num_heads``, ``num_atoms``, ``sigma_min``,
    ``proj_drop``, ...): each against :data:`OPTIONS`, and ``dim`` a multiple of ``num_heads``."""
    check_options(options)
    check_heads(options["dim"], options["num_heads"])


def token_grid(img_size: int | tuple[int, int], patch_size: int | tuple[int, int]) -> tuple[int, int]:
    """The token grid ``(Hg, Wg)`` of ``img_size`` cut into ``patch_size`` patches (either an
    int or a ``(height, width)`` pair of them); a size that would leave part of a patch over
    (a fractional grid) is an error."""
    check_options({"img_size": img_size, "patch_size": patch_size})
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
    a length the layers do not use is checked against :data:`OPTIONS` alone.

    A length ``r`` in ``units`` (the model's ``kernel_units``) becomes ``r * kernel_scale``
    tokens per axis ``(y, x)``; an offset longer than the grid places the kernel outside the
    image for every query (and far enough out, the loss is not finite at the first step).
    """
    rows, cols = grid
    limit = min(rows / kernel_scale[0], cols / kernel_scale[1])
    used = {"centre_radius": ssog_options.get("centre_init") != "zero",
            "steer_radius": "mu" in ssog_options.get("steer", ())}
    for name, in_use in used.items():
        value = ssog_options.get(name)
        rule = OPTIONS[name]
        assert isinstance(rule, Number)  # both are lengths
        if not in_use:
            check_options({name: value})
        elif value is not None and not (within := Number(0, limit, low_open=rule.low_open)).accepts(value):
            raise ValueError(
                f"{name}={value!r}: expected {within} (kernel_units={units!r}: {_format(limit)} is the "
                f"extent of this model's {rows}x{cols} token grid; a longer offset places every kernel outside "
                "the image)"
            )
