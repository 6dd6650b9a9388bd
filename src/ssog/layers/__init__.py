"""Token mixers and small blocks built on :mod:`ssog.ops`."""
from .attention import MultiHeadAttention
from .find_mixers import MIXER_TYPES, named_mixers, ssog_mixers
from .norm import CenterNorm
from .ssog_attention import (
    CLASS_TOKEN_POOLING, KERNEL_OFFSET_SIZE, KERNEL_UNITS, REFERENCE_GRID, STEERABLE, SSoGAttention,
    TokenGridFromImages, describe_initial_kernels, follow_model_grid, kernel_scale_for_grid, multiscale_widths,
)

__all__ = [
    "CLASS_TOKEN_POOLING", "CenterNorm", "KERNEL_OFFSET_SIZE", "KERNEL_UNITS", "MIXER_TYPES", "MultiHeadAttention",
    "REFERENCE_GRID",
    "SSoGAttention", "STEERABLE", "TokenGridFromImages", "describe_initial_kernels", "follow_model_grid",
    "kernel_scale_for_grid", "multiscale_widths", "named_mixers", "ssog_mixers",
]
