"""Validation metrics: cross-entropy loss and Acc@1/3/5 (in %), summed over processes."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ssog.runtime import autocast
from ssog.train.distributed import DistContext, all_reduce_sum

__all__ = ["TOPK", "evaluate", "autocast"]

TOPK = (1, 3, 5)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, ctx: DistContext, amp: str = "none",
             progress=None, per_class: bool = False) -> dict[str, Any]:
    """``{"loss", "acc1", "acc3", "acc5"}`` of ``model`` on every sample of ``loader``; with
    ``per_class`` also ``class_counts`` (images per label) and ``class_acc1`` (Acc@1 per label, %).

    Each process evaluates its shard; sums are reduced so every process returns the metrics
    of the whole set. Top-k with k above the number of classes counts as top-C.
    """
    was_training = model.training
    model.eval()
    loss_sum, count = 0.0, 0
    correct = [0] * len(TOPK)
    class_counts = class_hits = None
    for images, targets in (progress(loader) if progress else loader):
        images = images.to(ctx.device, non_blocking=True)
        targets = targets.to(ctx.device, non_blocking=True)
        with autocast(ctx.device, amp):
            logits = model(images)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, targets, reduction="sum").item()
        ranked = logits.topk(min(max(TOPK), logits.shape[1]), dim=1).indices
        hits = ranked == targets[:, None]
        for i, k in enumerate(TOPK):
            correct[i] += hits[:, :k].any(dim=1).sum().item()
        count += targets.numel()
        if per_class:
            classes = logits.shape[1]
            if class_counts is None:
                class_counts, class_hits = [0] * classes, [0] * classes
            for i, (n, h) in enumerate(zip(torch.bincount(targets, minlength=classes).tolist(),
                                           torch.bincount(targets[hits[:, 0]], minlength=classes).tolist())):
                class_counts[i] += n
                class_hits[i] += h
    model.train(was_training)
    loss_sum, count, *correct = all_reduce_sum([loss_sum, count, *correct], ctx)
    if count == 0:
        raise ValueError("the validation set is empty")
    metrics = {"loss": loss_sum / count}
    metrics.update({f"acc{k}": 100.0 * c / count for k, c in zip(TOPK, correct)})
    if per_class:
        classes = len(class_counts)
        summed = all_reduce_sum([*class_counts, *class_hits], ctx)
        metrics["class_counts"] = [int(n) for n in summed[:classes]]
        metrics["class_acc1"] = [
            100.0 * h / n if n else float("nan") for n, h in zip(summed[:classes], summed[classes:])
        ]
    return metrics
