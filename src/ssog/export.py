"""ONNX export of the ssog models, verified with onnxruntime.

Needs the optional ``export`` extra (``pip install -e '.[export]'``: onnx, onnxscript,
onnxruntime). The graph comes from ``torch.onnx.export(..., dynamo=True)`` with a dynamic
batch dimension; :func:`export_onnx` then runs the file in onnxruntime on a batch of another
size and compares it with the eager model, so a file it reports is one that works.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["EXPORT_PACKAGES", "export_onnx", "missing_export_packages", "verify_onnx"]

#: What ``torch.onnx.export(dynamo=True)`` and the check need (the ``export`` extra).
EXPORT_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


def missing_export_packages() -> list[str]:
    """The packages of :data:`EXPORT_PACKAGES` that are not installed."""
    return [name for name in EXPORT_PACKAGES if importlib.util.find_spec(name) is None]


def export_onnx(
    model: nn.Module,
    path: str | Path,
    input_size: tuple[int, int, int],
    *,
    batch_size: int = 2,
    atol: float = 1e-4,
    seed: int = 0,
) -> dict[str, Any]:
    """Export ``model`` (eval mode, fp32, CPU) to ONNX at ``path`` and verify it.

    ``input_size`` is ``(C, H, W)``; the batch dimension is dynamic. Raises ``RuntimeError``
    (with the largest difference) when onnxruntime's output differs from eager by more than
    ``atol``, ``ImportError`` naming the missing packages. The model's data config (input size,
    mean/std, crop_pct, interpolation) goes into the file's metadata. Returns the check's summary.
    """
    missing = missing_export_packages()
    if missing:
        raise ImportError(f"ONNX export needs {', '.join(missing)}: pip install 'ssog[export]'")
    model = model.eval().float().cpu()
    generator = torch.Generator().manual_seed(seed)
    example = torch.randn(batch_size, *input_size, generator=generator)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1)
    pinned = _pin_auto_backends(model)
    try:
        with torch.no_grad():
            program = torch.onnx.export(
                model, (example,), dynamo=True, dynamic_shapes=({0: batch},), input_names=["images"],
                output_names=["logits"], verbose=False,
            )
    finally:
        for module, backend in pinned:
            module.backend = backend
    program.save(str(path))
    metadata = _write_data_config(path, model, input_size)
    # Another batch size than the traced one: the batch dimension must really be dynamic.
    check = torch.randn(batch_size + 1, *input_size, generator=generator)
    return {"path": str(path), "input_size": list(input_size), "metadata": metadata,
            **verify_onnx(model, path, check, atol=atol)}


def _write_data_config(path: Path, model: nn.Module, input_size: tuple[int, int, int]) -> dict[str, str]:
    """Store the model's data config (``pretrained_cfg``: input size, mean/std, crop_pct,
    interpolation; class names where known) in the ONNX file's ``metadata_props``, each value as
    JSON, so that a runtime can preprocess images as the model was trained. Returns them."""
    import onnx

    from .data.data_config import model_data_config

    values: dict[str, Any] = dict(model_data_config(model, input_size))
    labels = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if labels:
        values["label_names"] = list(labels)
    metadata = {key: json.dumps(list(value) if isinstance(value, tuple) else value) for key, value in values.items()}
    proto = onnx.load(str(path))
    onnx.helper.set_model_props(proto, metadata)
    onnx.save(proto, str(path))
    return metadata


def _pin_auto_backends(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """Fix each ``backend="auto"`` SSoG layer to a backend whose graph does not depend on the batch.

    Auto's cost model, and the separable backend's block sizes, are computed from the batch
    size; with a symbolic batch they become guards that pin the exported batch dimension.
    The dense backend builds each head's matrix once and multiplies every image by it: the
    same graph for every batch. Returns what to restore.
    """
    from .layers import SSoGAttention

    pinned = []
    for module in model.modules():
        if isinstance(module, SSoGAttention) and module.backend == "auto":
            pinned.append((module, module.backend))
            module.backend = "dense"
    return pinned


def verify_onnx(model: nn.Module, path: str | Path, images: torch.Tensor, atol: float = 1e-4) -> dict[str, Any]:
    """Run the ONNX file at ``path`` in onnxruntime (CPU) on ``images`` and compare with
    ``model(images)``; ``RuntimeError`` when they differ by more than ``atol``."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    with torch.no_grad():
        expected = model(images)
    diff = float((torch.from_numpy(output) - expected).abs().max())
    if not diff <= atol:
        raise RuntimeError(f"onnxruntime's output of {path} differs from eager PyTorch by {diff:.3g} (> {atol:g})")
    return {"verified_batch_size": images.shape[0], "max_abs_diff": diff, "output_shape": list(output.shape)}
