"""One step of each fixed-step solver of torchdiffeq, in torchdiffeq's own arithmetic.

The continuous family integrates with fixed steps through these rather than through
``torchdiffeq.odeint``: ``odeint`` compares time values in Python (``t1 >= t[j]``), which
``torch.compile(fullgraph=True)``, ``torch.jit.trace`` and ``torch.export`` cannot record, which
the meta device (FLOP counting) cannot run, and which synchronises a GPU at every step. A step
here is straight-line tensor code with the operations of torchdiffeq's solver of the same name
in the same order, so its result equals ``odeint(field, x, grid, method=name)``'s bit for bit
(tests/models/test_models.py checks every solver against ``odeint``). Adaptive solvers and the adjoint
go through ``odeint`` and ``odeint_adjoint`` themselves (:mod:`ssog.models.odevit`).
"""
from __future__ import annotations

from typing import Callable

from torch import Tensor

__all__ = ["FIXED_SOLVERS", "Field", "fixed_step"]

#: ``field(t, x) -> dx/dt``: ``t`` a scalar tensor, ``x`` and the result of one shape.
Field = Callable[[Tensor, Tensor], Tensor]


def _euler(field: Field, t0: Tensor, dt: Tensor, t1: Tensor, x: Tensor) -> Tensor:
    return dt * field(t0, x)


def _midpoint(field: Field, t0: Tensor, dt: Tensor, t1: Tensor, x: Tensor) -> Tensor:
    half_dt = 0.5 * dt
    x_mid = x + field(t0, x) * half_dt
    return dt * field(t0 + half_dt, x_mid)


def _heun2(field: Field, t0: Tensor, dt: Tensor, t1: Tensor, x: Tensor) -> Tensor:
    k1 = field(t0, x)
    k2 = field(t0 + dt * 1.0, x + dt * k1 * 1.0)
    return dt * (k1 * 0.5 + k2 * 0.5)


def _heun3(field: Field, t0: Tensor, dt: Tensor, t1: Tensor, x: Tensor) -> Tensor:
    k1 = field(t0, x)
    k2 = field(t0 + dt * (1 / 3), x + dt * k1 * (1 / 3))
    k3 = field(t0 + dt * (2 / 3), x + dt * (k1 * 0.0 + k2 * (2 / 3)))
    return dt * (k1 * 0.25 + k2 * 0.0 + k3 * 0.75)


def _rk4(field: Field, t0: Tensor, dt: Tensor, t1: Tensor, x: Tensor) -> Tensor:
    """torchdiffeq's ``rk4``: Kutta's 3/8 rule."""
    k1 = field(t0, x)
    k2 = field(t0 + dt * (1 / 3), x + dt * k1 * (1 / 3))
    k3 = field(t0 + dt * (2 / 3), x + dt * (k2 - k1 * (1 / 3)))
    k4 = field(t1, x + dt * (k1 - k2 + k3))
    return (k1 + 3 * (k2 + k3) + k4) * dt * 0.125


_STEPS: dict[str, Callable[[Field, Tensor, Tensor, Tensor, Tensor], Tensor]] = {
    "euler": _euler, "midpoint": _midpoint, "heun2": _heun2, "heun3": _heun3, "rk4": _rk4,
}
#: Fixed-step torchdiffeq solvers and their vector-field evaluations per step.
FIXED_SOLVERS: dict[str, int] = {"euler": 1, "midpoint": 2, "heun2": 2, "heun3": 3, "rk4": 4}


def fixed_step(solver: str, field: Field, t0: Tensor, t1: Tensor, x: Tensor) -> Tensor:
    """The state after one step of ``solver`` (a key of :data:`FIXED_SOLVERS`) from ``x`` at
    time ``t0`` to time ``t1`` (scalar tensors); ``x (...)`` -> the same shape."""
    return x + _STEPS[solver](field, t0, t1 - t0, t1, x)
