"""ONNX files of the ssog models, verified with onnxruntime.

Needs the optional ``export`` extra (``pip install -e '.[export]'``: onnx, onnxscript,
onnxruntime). The graph comes from ``torch.onnx.export(..., dynamo=True)`` with a dynamic
batch dimension and, with ``dynamic_size``, a dynamic height and width
(:func:`dynamic_image_shapes`, which ``torch.export.export`` takes too); :func:`export_onnx`
then runs the file in onnxruntime on a batch of another size (and at another image size)
and compares it with the eager model, so a file it reports is one that works.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..files import refuse_existing, replacing

__all__ = [
    "EXPORT_PACKAGES", "MIN_PATCHES", "ExportMismatch", "check_export_memory", "dynamic_image_shapes", "export_onnx",
    "missing_export_packages", "verify_onnx",
]


class ExportMismatch(RuntimeError):
    """The exported file does not compute the model: onnxruntime's output differs from eager
    PyTorch by more than the tolerance (the file is not written)."""

#: What ``torch.onnx.export(dynamo=True)`` and the check need (the ``export`` extra).
EXPORT_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


def missing_export_packages() -> list[str]:
    """The packages of :data:`EXPORT_PACKAGES` that are not installed."""
    return [name for name in EXPORT_PACKAGES if importlib.util.find_spec(name) is None]


#: Fewest patches per side of an image that a graph for every image size takes: ``torch.export``
#: treats a size of 1 as a special case (it would fix the dimension), so the grid starts at 2.
MIN_PATCHES = 2


def dynamic_image_shapes(model: nn.Module, dynamic_size: bool = True) -> tuple[dict[int, Any]]:
    """``dynamic_shapes`` for ``torch.export.export(model, (images,), ...)`` and
    ``torch.onnx.export(..., dynamo=True)``: a dynamic batch and, with ``dynamic_size``, a
    dynamic height and width, each a multiple of the model's patch size of at least
    :data:`MIN_PATCHES` patches (``Dim("patch_rows")``, ``Dim("patch_cols")``: the ONNX input is
    ``(batch, C, P*patch_rows, P*patch_cols)``). A dynamic size needs a model that accepts any
    size divisible by its patch (an ssog model, or a timm ViT built with ``dynamic_img_size=True``):
    anything else is a ``ValueError``.
    """
    shapes: dict[int, Any] = {0: torch.export.Dim("batch", min=1)}
    if dynamic_size:
        patch_embed = getattr(model, "patch_embed", None)
        if patch_embed is None or not getattr(model, "dynamic_img_size", False):
            what = "has no patch embedding" if patch_embed is None else "was built with dynamic_img_size=False"
            raise ValueError(f"a dynamic image size needs a model that accepts any size divisible by its patch; "
                             f"this {type(model).__name__} {what}: export it at one size")
        rows, cols = patch_embed.patch_size
        shapes[2] = rows * torch.export.Dim("patch_rows", min=MIN_PATCHES)
        shapes[3] = cols * torch.export.Dim("patch_cols", min=MIN_PATCHES)
    return (shapes,)


def export_onnx(
    model: nn.Module,
    path: str | Path,
    input_size: tuple[int, int, int],
    *,
    batch_size: int = 2,
    dynamic_size: bool = False,
    atol: float = 1e-4,
    seed: int = 0,
    overwrite: bool = True,
) -> dict[str, Any]:
    """Export ``model`` (eval mode, fp32, CPU) to ONNX at ``path`` and verify it.

    ``input_size`` is ``(C, H, W)``, the size traced (and, without ``dynamic_size``, the
    only size the file takes); the batch dimension is dynamic. With ``dynamic_size`` the
    height and width are dynamic too (:func:`dynamic_image_shapes`: multiples of the patch,
    at least :data:`MIN_PATCHES` patches) and the file is also checked at another size, two
    patches higher and one wider. Fixed and steered SSoG and MHA, every family; the
    continuous one with a fixed-step solver (an adaptive one raises ``ValueError``). The
    model's data config (input size, mean/std, crop_pct, interpolation) goes into the file's
    metadata. The file is written and checked under a temporary name and only then renamed
    to ``path`` (:func:`ssog.files.replacing`): an existing file there is refused unless
    ``overwrite`` (FileExistsError), and kept when the export fails. Raises ``RuntimeError``
    (with the largest difference) when onnxruntime's output differs from eager by more than
    ``atol``, and ``ImportError`` naming the missing packages. Returns the check's summary:
    ``verified_batch_size``, ``verified_sizes`` (``[H, W]`` each), ``max_abs_diff`` (over
    all of them), ``output_shape`` (at ``input_size``).
    """
    missing = missing_export_packages()
    if missing:
        raise ImportError(f"ONNX export needs {', '.join(missing)}: pip install 'ssog[export]'")
    path = Path(path)
    if not overwrite:
        refuse_existing([path])  # before the work (the rename refuses it too, should one appear meanwhile)
    model = model.eval().float().cpu()
    # Every backend sizes its work for one image under a symbolic batch (ssog.ops.capture.any_batch),
    # and does it in one block on a symbolic grid (ssog.ops.capture.any_grid).
    shapes = dynamic_image_shapes(model, dynamic_size)
    # Checked at another batch size than the traced one (and another image size): what is
    # dynamic must really be.
    channels, height, width = input_size
    sizes = [(height, width)]
    if dynamic_size:
        patch_embed: Any = model.patch_embed  # timm's PatchEmbed
        rows, cols = patch_embed.patch_size
        if min(height // rows, width // cols) < MIN_PATCHES:
            raise ValueError(f"a dynamic image size is traced at {MIN_PATCHES} patches per side or more; "
                             f"{height}x{width} has fewer")
        sizes.append((height + 2 * rows, width + cols))
    check_export_memory(model, input_size, sizes, batch_size)
    generator = torch.Generator().manual_seed(seed)
    example = torch.randn(batch_size, *input_size, generator=generator)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with torch.no_grad():
            program = torch.onnx.export(
                model, (example,), dynamo=True, dynamic_shapes=shapes, input_names=["images"],
                output_names=["logits"], verbose=False,
            )
    except torch.onnx.OnnxExporterError as error:
        if isinstance(error.__cause__, ValueError):  # the model's own one-line refusal (an adaptive solver)
            raise error.__cause__ from None
        raise
    checks = [torch.randn(batch_size + 1, channels, *size, generator=generator) for size in sizes]
    with replacing(path, overwrite=overwrite) as (tmp,):  # a file that does not compute the model never lands
        assert program is not None  # dynamo=True returns the program
        program.save(str(tmp))
        metadata = _write_data_config(tmp, model, input_size)
        try:
            verified = [verify_onnx(model, tmp, images, atol=atol) for images in checks]
        except RuntimeError as error:
            kept = "the earlier file is kept" if path.exists() else "nothing was written"
            raise ExportMismatch(f"{path}: {error}; {kept}") from None
    return {
        "path": str(path), "input_size": list(input_size), "dynamic_size": dynamic_size, "metadata": metadata,
        **verified[0], "verified_sizes": [list(size) for size in sizes],
        "max_abs_diff": max(check["max_abs_diff"] for check in verified),
    }


def _write_data_config(path: Path, model: nn.Module, input_size: tuple[int, int, int]) -> dict[str, str]:
    """Store the model's data config (``pretrained_cfg``: input size, mean/std, crop_pct,
    interpolation; class names where known) in the ONNX file's ``metadata_props``, each value as
    JSON, so that a runtime can preprocess images as the model was trained. Returns them."""
    import onnx

    from ..data.data_config import model_data_config

    values: dict[str, Any] = dict(model_data_config(model, input_size))
    labels = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if labels:
        values["label_names"] = list(labels)
    metadata = {key: json.dumps(list(value) if isinstance(value, tuple) else value) for key, value in values.items()}
    proto = onnx.load(str(path))
    onnx.helper.set_model_props(proto, metadata)
    onnx.save(proto, str(path))
    return metadata


def check_export_memory(model: nn.Module, input_size: tuple[int, int, int], sizes: list[tuple[int, int]],
                        batch_size: int) -> None:
    """Raise MemoryError, naming the image size, when the export's least memory (its input
    images, and for a model with patches two token activations of the checked batch, fp32)
    is beyond what this machine has available: the size would page for hours, not fail."""
    from ..runtime import available_memory_bytes

    available = available_memory_bytes()
    channels = input_size[0]
    patch_embed = getattr(model, "patch_embed", None)
    embed_dim = getattr(model, "embed_dim", None)
    needed = 4 * batch_size * channels * input_size[1] * input_size[2]  # the traced example
    for height, width in sizes:
        needed += 4 * (batch_size + 1) * channels * height * width  # each checked batch
        if patch_embed is not None and isinstance(embed_dim, int):
            rows, cols = patch_embed.patch_size
            needed += 2 * 4 * (batch_size + 1) * (height // rows) * (width // cols) * embed_dim
    if available is not None and needed > available:
        size = "x".join(map(str, input_size[1:]))
        raise MemoryError(f"exporting at {size} px (--img-size) needs at least {needed / 2**30:.3g} GiB, more than "
                          f"the {available / 2**30:.3g} GiB this machine has available; lower --img-size or "
                          "--batch-size")


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
        size = "x".join(map(str, images.shape[-2:]))
        raise ExportMismatch(f"onnxruntime's output differs from eager PyTorch by {diff:.3g} (> {atol:g}) at {size}")
    return {"verified_batch_size": images.shape[0], "max_abs_diff": diff, "output_shape": list(output.shape)}
