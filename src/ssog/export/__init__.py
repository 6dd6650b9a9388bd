"""Exporting the ssog models: ONNX files verified with onnxruntime (:mod:`.onnx_file`), and
models in timm's Hugging Face layout with their model card (:mod:`.hub`: ``ssog export --format hf``)."""
from .hub import (
    HF_FILES, LIBRARY_TITLE, check_hub_id, model_card, run_summary, save_for_hf, save_run_for_hf, training_recipe,
)
from .onnx_file import (
    EXPORT_PACKAGES, MIN_PATCHES, ExportMismatch, check_export_memory, dynamic_image_shapes, export_onnx,
    missing_export_packages, verify_onnx,
)

__all__ = [
    "EXPORT_PACKAGES", "HF_FILES", "LIBRARY_TITLE", "MIN_PATCHES", "ExportMismatch", "check_export_memory",
    "check_hub_id", "dynamic_image_shapes", "export_onnx", "missing_export_packages", "model_card", "run_summary",
    "save_for_hf", "save_run_for_hf", "training_recipe", "verify_onnx",
]
