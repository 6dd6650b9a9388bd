"""The SSoG operator as pure functions: the one place its math lives."""
from .functional import BACKENDS, choose_backend, forced_backend, mix, ssog_matrix, ssog_mix
from .kernels import fixed_axis_kernels, gaussian_rows, steered_axis_kernels

__all__ = [
    "BACKENDS",
    "choose_backend",
    "fixed_axis_kernels",
    "forced_backend",
    "gaussian_rows",
    "mix",
    "ssog_matrix",
    "ssog_mix",
    "steered_axis_kernels",
]
