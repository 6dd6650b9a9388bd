"""Token mixers and small blocks built on :mod:`ssog.ops`."""
from .attention import MultiHeadAttention
from .mixers import MIXER_TYPES, named_mixers, ssog_mixers
from .norm import CenterNorm
from .ssog_attention import STEERABLE, SSoGAttention, multiscale_widths

__all__ = [
    "CenterNorm", "MIXER_TYPES", "MultiHeadAttention", "SSoGAttention", "STEERABLE", "multiscale_widths",
    "named_mixers", "ssog_mixers",
]
