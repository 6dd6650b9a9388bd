"""Token mixers and small blocks built on :mod:`ssog.ops`."""
from .attention import MultiHeadAttention
from .find_mixers import MIXER_TYPES, named_mixers, ssog_mixers
from .kernel_init import (
    KERNEL_UNITS, REFERENCE_GRID, describe_initial_kernels, initial_centres, initial_widths, kernel_scale_for_grid,
    multiscale_widths,
)
from .norm import CenterNorm
from .ssog_attention import CLASS_TOKEN_POOLING, KERNEL_OFFSET_SIZE, STEERABLE, SSoGAttention
from .token_grid import TokenGridFromImages, follow_model_grid

__all__ = [
    "CLASS_TOKEN_POOLING", "CenterNorm", "KERNEL_OFFSET_SIZE", "KERNEL_UNITS", "MIXER_TYPES", "MultiHeadAttention",
    "REFERENCE_GRID", "SSoGAttention", "STEERABLE", "TokenGridFromImages", "describe_initial_kernels",
    "follow_model_grid", "initial_centres", "initial_widths", "kernel_scale_for_grid", "multiscale_widths",
    "named_mixers", "ssog_mixers",
]
