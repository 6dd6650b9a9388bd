"""Attention-sink diagnostics (the paper's Table 5).

Every mixer application is a "layer": each block (discrete), loop iteration (looped) or
vector-field evaluation of the solver (continuous). For each layer the row-stochastic maps
``A (B, H, T, T)`` (rows: queries, columns: keys, ``T = P + N`` tokens) give:

- sink score: ``T * max_j mean_q A[q, j]``, the attention received by the most attended key
  relative to uniform (1: no sink), per image and head, averaged over heads and images;
- most attended key per image and head, for the same-key share;
- CLS mass: attention from patch queries to the prefix (class) tokens.

Over layers: mean and worst sink score, the sink score of the residual rollout
``prod_l (A_l + I) / 2`` of the head-averaged maps, the same-key share of the most consistent
layer, the mean CLS mass, and the share of high-norm final (pre-norm) patch tokens.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from torch import Tensor, nn

from .capture import on_final_norm_input, on_mixer_calls

__all__ = [
    "high_norm_counts", "HIGH_NORM_FACTOR", "most_attended_keys", "prefix_mass", "residual_rollout",
    "same_key_percent", "sink_diagnostics", "sink_scores", "SinkAccumulator",
]

#: A token is "high-norm" above this multiple of its image's median patch-token norm.
HIGH_NORM_FACTOR = 3.0


def _check_maps(attn: Tensor) -> None:
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attention maps must be (B, H, T, T), got {tuple(attn.shape)}")


def sink_scores(attn: Tensor) -> Tensor:
    """Per-image sink score ``(B,)`` of maps ``(B, H, T, T)``, averaged over heads.

    ``T * max_j mean_q A[q, j]``: 1 for uniform attention, ``T`` when every query reads one key.
    """
    _check_maps(attn)
    received = attn.mean(dim=-2)  # (B, H, T): mean over queries
    return (received.amax(dim=-1) * attn.shape[-1]).mean(dim=1)


def most_attended_keys(attn: Tensor) -> Tensor:
    """Index ``(B, H)`` of the key that receives the most attention, per image and head."""
    _check_maps(attn)
    return attn.mean(dim=-2).argmax(dim=-1)


def same_key_percent(keys: Tensor) -> float:
    """Share (%) of images whose most attended key is the head's most frequent one.

    ``keys (num_images, H)`` from :func:`most_attended_keys`; averaged over heads.
    """
    if keys.dim() != 2 or keys.shape[0] == 0:
        raise ValueError(f"keys must be (num_images >= 1, H), got {tuple(keys.shape)}")
    mode = keys.mode(dim=0).values  # (H,)
    return float((keys == mode).float().mean() * 100)


def prefix_mass(attn: Tensor, num_prefix_tokens: int) -> Tensor:
    """Attention mass ``(B,)`` from patch queries to the prefix keys, mean over heads and queries."""
    _check_maps(attn)
    if num_prefix_tokens < 1:
        raise ValueError("there is no prefix (class) token to measure attention to")
    return attn[:, :, num_prefix_tokens:, :num_prefix_tokens].sum(dim=-1).mean(dim=(1, 2))


def residual_rollout(maps: Sequence[Tensor]) -> Tensor:
    """``prod_l (A_l + I) / 2`` of head-averaged maps ``(B, T, T)``, first layer rightmost.

    Returns ``(B, T, T)``; row-stochastic when every ``A_l`` is.
    """
    if not maps:
        raise ValueError("rollout needs at least one attention map")
    rollout: Tensor | None = None
    for attn in maps:
        if attn.dim() != 3 or attn.shape[-1] != attn.shape[-2]:
            raise ValueError(f"head-averaged maps must be (B, T, T), got {tuple(attn.shape)}")
        step = (attn + torch.eye(attn.shape[-1], dtype=attn.dtype, device=attn.device)) / 2
        rollout = step if rollout is None else step @ rollout
    assert rollout is not None  # maps is not empty
    return rollout


def high_norm_counts(tokens: Tensor, factor: float = HIGH_NORM_FACTOR) -> tuple[int, int]:
    """``(count, total)`` of patch tokens ``(B, N, D)`` whose norm exceeds ``factor`` times
    their image's median norm."""
    if tokens.dim() != 3:
        raise ValueError(f"tokens must be (B, N, D), got {tuple(tokens.shape)}")
    norms = tokens.float().norm(dim=-1)
    median = norms.median(dim=-1, keepdim=True).values
    return int((norms > factor * median).sum()), norms.numel()


class _Layer:
    """Running statistics of one mixer application over all images."""

    def __init__(self, module: str, num_prefix_tokens: int) -> None:
        self.module, self.num_prefix_tokens = module, num_prefix_tokens
        self.sink_sum = 0.0
        self.prefix_sum = 0.0
        self.keys: list[Tensor] = []

    def update(self, attn: Tensor) -> None:
        self.sink_sum += float(sink_scores(attn).sum())
        if self.num_prefix_tokens:
            self.prefix_sum += float(prefix_mass(attn, self.num_prefix_tokens).sum())
        self.keys.append(most_attended_keys(attn).cpu())


class SinkAccumulator:
    """Collects Table 5's statistics over batches; see :func:`sink_diagnostics`."""

    def __init__(self, num_prefix_tokens: int, high_norm_factor: float = HIGH_NORM_FACTOR) -> None:
        self.num_prefix_tokens = num_prefix_tokens
        self.high_norm_factor = high_norm_factor
        self.layers: list[_Layer] = []
        self.images = 0
        self.rollout_sum = 0.0
        self.high_norm = [0, 0]
        self._batch_calls = 0
        self._rollout: Tensor | None = None

    def start_batch(self) -> None:
        self._batch_calls, self._rollout = 0, None

    def add_map(self, module: str, attn: Tensor, num_prefix_tokens: int) -> None:
        """One mixer application's maps ``(B, H, T, T)``, in execution order."""
        index = self._batch_calls
        self._batch_calls += 1
        if self.images == 0:
            self.layers.append(_Layer(module, num_prefix_tokens))
        elif index >= len(self.layers) or self.layers[index].module != module:
            raise ValueError(
                "the mixer applications differ between batches (an adaptive ODE solver?); "
                "sink diagnostics need a fixed sequence of layers, e.g. a fixed-step solver"
            )
        attn = attn.float()
        self.layers[index].update(attn)
        step = residual_rollout([attn.mean(dim=1)])
        self._rollout = step if self._rollout is None else step @ self._rollout

    def add_final_tokens(self, tokens: Tensor) -> None:
        """The final norm's input ``(B, P + N, D)`` (``P`` the model's prefix tokens)."""
        count, total = high_norm_counts(tokens[:, self.num_prefix_tokens:], self.high_norm_factor)
        self.high_norm[0] += count
        self.high_norm[1] += total

    def end_batch(self, batch_size: int) -> None:
        if self._rollout is None:
            raise ValueError("no mixer was applied during the forward pass")
        if self.images and self._batch_calls != len(self.layers):
            raise ValueError(
                f"{self._batch_calls} mixer applications in this batch, {len(self.layers)} in the first; "
                "sink diagnostics need a fixed sequence of layers, e.g. a fixed-step solver"
            )
        self.rollout_sum += float(sink_scores(self._rollout.unsqueeze(1)).sum())
        self.images += batch_size

    def result(self) -> dict[str, Any]:
        if not self.images:
            raise ValueError("no images were analysed")
        n = self.images
        per_layer: list[dict[str, Any]] = []
        for index, layer in enumerate(self.layers):
            keys = torch.cat(layer.keys)
            per_layer.append({
                "layer": index,
                "module": layer.module,
                "sink_score": layer.sink_sum / n,
                "same_key_percent": same_key_percent(keys),
                "cls_percent": 100 * layer.prefix_sum / n if layer.num_prefix_tokens else None,
            })
        sinks = [row["sink_score"] for row in per_layer]
        same = [row["same_key_percent"] for row in per_layer]
        cls = [row["cls_percent"] for row in per_layer if row["cls_percent"] is not None]
        worst, consistent = max(range(len(sinks)), key=sinks.__getitem__), max(range(len(same)), key=same.__getitem__)
        return {
            "images": n,
            "layers": len(per_layer),
            "sink_mean": sum(sinks) / len(sinks),
            "sink_worst": sinks[worst],
            "sink_worst_layer": worst,
            "rollout": self.rollout_sum / n,
            "same_key_percent": same[consistent],
            "same_key_layer": consistent,
            # "-" in the paper: patches never read the class token (exactly zero mass).
            "cls_percent": sum(cls) / len(cls) if cls and any(cls) else None,
            "high_norm_percent": 100 * self.high_norm[0] / self.high_norm[1],
            "high_norm_factor": self.high_norm_factor,
            "per_layer": per_layer,
        }


@torch.no_grad()
def sink_diagnostics(
    model: nn.Module, batches: Iterable[Tensor], high_norm_factor: float = HIGH_NORM_FACTOR
) -> dict[str, Any]:
    """Table 5's metrics of ``model`` over image batches ``(B, C, H, W)``.

    Returns ``sink_mean``, ``sink_worst`` (and its layer), ``rollout``, ``same_key_percent``
    (most consistent layer), ``cls_percent`` (``None`` where patches never read a prefix
    token, or the model has none), ``high_norm_percent`` and ``per_layer`` records.
    """
    model.eval()
    acc = SinkAccumulator(getattr(model, "num_prefix_tokens", 0), high_norm_factor)

    def on_mixer(name: str, module: nn.Module, x: Tensor, grid_size: tuple[int, int], options: dict) -> None:
        mixer: Any = module  # SSoGAttention or MultiHeadAttention
        acc.add_map(name, mixer.attention_matrix(x, grid_size, **options), mixer.num_prefix_tokens)

    vit: Any = model  # a ViT with forward_features
    with on_mixer_calls(model, on_mixer), on_final_norm_input(model, acc.add_final_tokens):
        for images in batches:
            acc.start_batch()
            vit.forward_features(images)
            acc.end_batch(images.shape[0])
    return acc.result()
