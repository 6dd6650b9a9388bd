"""The three model families, registered with timm on import.

- :class:`ViT` (``vit``): ``depth`` pre-norm blocks.
- :class:`LoopViT` (``loopvit``): one shared block applied ``num_loops`` times.
- :class:`OdeViT` (``odevit``): one shared time-conditioned block integrated on [0, 1].

Registered names: ``{op}_{family}_{preset}`` with op ``mha``/``ssog`` and presets
``small/medium/base_patch16_224`` (the paper's widths) and the CPU presets
``tiny_patch4_32`` (32 px), ``micro_patch1_8`` and ``digits_patch2_8`` (8x8 single channel), e.g.
``timm.create_model("ssog_odevit_base_patch16_224", num_classes=100)``.
"""
from ._blocks import MIXER_NAMES, Block, create_mixer
from ._counting import count_flops, count_parameters, parameter_parts
from ._registry import create_model, list_models
from .loopvit import LoopViT
from .odevit import ADAPTIVE_SOLVERS, FIXED_SOLVERS, OdeViT, VectorField
from .vit import ViT

__all__ = [
    "ADAPTIVE_SOLVERS", "Block", "FIXED_SOLVERS", "LoopViT", "MIXER_NAMES", "OdeViT",
    "VectorField", "ViT", "count_flops", "count_parameters", "create_mixer", "create_model",
    "list_models", "parameter_parts",
]
