"""ssog: separable sum-of-Gaussians (SSoG) token mixing for Vision Transformers.

``import ssog`` registers the model families with timm, so ``timm.create_model`` builds them.
"""
from . import models  # noqa: F401  (registers the timm models)
from .layers import CenterNorm, MultiHeadAttention, SSoGAttention
from .ops import ssog_matrix, ssog_mix

__version__ = "0.1.0"

__all__ = ["CenterNorm", "MultiHeadAttention", "SSoGAttention", "ssog_matrix", "ssog_mix", "__version__"]
