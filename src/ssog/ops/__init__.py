"""The SSoG operator as pure functions: the one place its math lives.

``ssog_mix`` and ``ssog_matrix`` check their arguments (:mod:`ssog.ops.checks`); importing
this package needs torch alone.
"""
from .checks import BACKENDS
from .functional import choose_backend, forced_backend, ssog_matrix, ssog_mix
from .kernels import fixed_axis_kernels, gaussian_rows, steered_axis_kernels

__all__ = [
    "BACKENDS",
    "choose_backend",
    "fixed_axis_kernels",
    "forced_backend",
    "gaussian_rows",
    "ssog_matrix",
    "ssog_mix",
    "steered_axis_kernels",
]
