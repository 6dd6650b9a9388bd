"""One data config per run: input size, mean/std, crop_pct and interpolation.

The values come from the model's ``pretrained_cfg`` unless the run sets them, as timm's
``resolve_data_config`` resolves them for timm's own train.py; the same dict then builds the
transforms and is stored in the checkpoint, ``save_for_hf``'s config.json and the ONNX
metadata, so every consumer of a trained model normalises its input the same way.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from timm.data import resolve_data_config as timm_resolve_data_config

__all__ = ["DATA_CONFIG_KEYS", "INTERPOLATIONS", "resolve_data_config", "model_data_config"]

#: The keys of a resolved data config (timm's names).
DATA_CONFIG_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
#: Resampling filters timm's transforms accept by name.
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")


def _channels(values: Sequence[float], in_chans: int, name: str, source: str) -> tuple[float, ...]:
    """``values`` for ``in_chans`` channels: one value is repeated; a model's statistics of
    another channel count become their mean (timm's rule for a pretrained model given
    other channels); a run's own setting of the wrong length is an error."""
    values = tuple(float(v) for v in values)
    if len(values) == in_chans:
        return values
    if len(values) == 1:
        return values * in_chans
    if source == "model":
        return (sum(values) / len(values),) * in_chans
    raise ValueError(f"{name} has {len(values)} values but the data has {in_chans} channel(s); "
                     f"give 1 or {in_chans} values")


def resolve_data_config(
    pretrained_cfg: Mapping[str, Any] | None,
    in_chans: int,
    *,
    img_size: int | Sequence[int] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    crop_pct: float | None = None,
    interpolation: str | None = None,
) -> dict[str, Any]:
    """The data config of a run: each setting given here wins, the rest comes from the
    model's ``pretrained_cfg`` (timm's ``resolve_data_config``; its defaults, 224 px and
    ImageNet statistics, where the model has none).

    ``img_size`` is in pixels (side, or ``(H, W)``), ``in_chans`` the data's channels.
    Returns ``{"input_size": (C, H, W), "interpolation", "mean", "std", "crop_pct",
    "crop_mode"}`` with ``mean`` and ``std`` of ``in_chans`` values each.
    """
    pretrained_cfg = dict(pretrained_cfg or {})
    args: dict[str, Any] = {"in_chans": in_chans, "crop_pct": crop_pct, "interpolation": interpolation}
    if img_size is not None:
        height, width = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        args["input_size"] = (in_chans, height, width)
    if mean is not None:
        args["mean"] = _channels(mean, in_chans, "mean", "run")
    if std is not None:
        args["std"] = _channels(std, in_chans, "std", "run")
    config = timm_resolve_data_config(args, pretrained_cfg=pretrained_cfg)
    config["input_size"] = (in_chans, *config["input_size"][-2:])  # the data's channels, not the preset's
    for key in ("mean", "std"):
        config[key] = _channels(config[key], in_chans, key, "model")
    return {key: config[key] for key in DATA_CONFIG_KEYS}


def model_data_config(model: Any, input_size: Sequence[int] | None = None) -> dict[str, Any]:
    """The data config a model's ``pretrained_cfg`` records (a trained run's, once
    :func:`ssog.train.builders.apply_data_config` has set it), at ``input_size`` ``(C, H, W)``
    if given."""
    pretrained_cfg = getattr(model, "pretrained_cfg", None) or {}
    in_chans = input_size[0] if input_size is not None else pretrained_cfg.get("input_size", (3,))[0]
    return resolve_data_config(pretrained_cfg, in_chans, img_size=None if input_size is None else input_size[1:])
