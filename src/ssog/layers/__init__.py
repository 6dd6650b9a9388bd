"""Token mixers and small blocks built on :mod:`ssog.ops`."""
from .attention import MultiHeadAttention
from .norm import CenterNorm
from .ssog_attention import STEERABLE, SSoGAttention, multiscale_widths

__all__ = ["CenterNorm", "MultiHeadAttention", "SSoGAttention", "STEERABLE", "multiscale_widths"]
