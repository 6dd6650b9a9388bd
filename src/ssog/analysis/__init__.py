"""Analyses of trained or random models: attention sinks, Lipschitz constants, learned kernels,
how far steering moves them, the continuous field's branches.

Pure computation lives in :mod:`.sinks`, :mod:`.lipschitz`, :mod:`.kernels`, :mod:`.steering` and
:mod:`.field` (hooks in
:mod:`.capture`); :mod:`.plots` draws, :mod:`.report` formats tables, and :mod:`.run` ties
loading, computation and output together for ``ssog analyze``.
"""
from .capture import on_final_norm_input, on_mixer_calls
from .field import field_branches, token_rms
from .kernels import kernel_maps, kernel_snapshots, kernel_statistics, mixer_kernel_statistics
from .lipschitz import (
    DEFAULT_SCALES, field_lipschitz_bound, lipschitz_analysis, local_lipschitz, mixer_lipschitz_bound,
)
from .loading import NOISE, AnalysisModel, image_batches, iter_models, load_model
from .report import field_table, kernels_table, lipschitz_table, sinks_table, steering_table
from .run import run_field, run_kernels, run_lipschitz, run_sinks, run_steering
from .sinks import (
    high_norm_counts, most_attended_keys, prefix_mass, residual_rollout, same_key_percent, sink_diagnostics,
    sink_scores,
)
from .steering import mixture_moves, steering_moves

__all__ = [
    "AnalysisModel", "DEFAULT_SCALES", "NOISE", "field_branches", "field_lipschitz_bound", "field_table",
    "high_norm_counts", "image_batches", "iter_models", "kernel_maps", "kernel_snapshots", "kernel_statistics",
    "kernels_table", "lipschitz_analysis", "lipschitz_table", "load_model", "local_lipschitz",
    "mixer_kernel_statistics", "mixer_lipschitz_bound", "mixture_moves", "most_attended_keys",
    "on_final_norm_input", "on_mixer_calls", "prefix_mass", "residual_rollout", "run_field", "run_kernels",
    "run_lipschitz", "run_sinks", "run_steering", "same_key_percent", "sink_diagnostics", "sink_scores",
    "sinks_table", "steering_moves", "steering_table", "token_rms",
]
