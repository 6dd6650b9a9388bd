"""The SSoG operator as pure functions: the one place its math lives.

``ssog_mix`` and ``ssog_matrix`` check their arguments (:mod:`ssog.ops.checks`); importing
this package needs torch alone. ``BACKENDS`` is the table of backends (:mod:`ssog.ops.registry`),
``BACKEND_NAMES`` every name ``backend=`` takes.
"""
from .functional import choose_backend, forced_backend, ssog_matrix, ssog_mix
from .kernels import fixed_axis_kernels, gaussian_rows, steered_axis_kernels
from .registry import BACKEND_NAMES, BACKENDS

__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "choose_backend",
    "fixed_axis_kernels",
    "forced_backend",
    "gaussian_rows",
    "ssog_matrix",
    "ssog_mix",
    "steered_axis_kernels",
]
