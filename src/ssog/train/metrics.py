"""Run metrics: validation loss and Acc@1/3/5 (in %), summed over processes; gradient norms
per parameter group, averaged over an epoch's steps."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import get_total_norm
from torch.utils.data import DataLoader

from ssog.layers import named_mixers
from ssog.models import parameter_parts
from ssog.runtime import autocast
from ssog.train.distributed import DistContext, all_reduce_sum

__all__ = ["TOPK", "GradNormMeter", "evaluate", "parameter_groups"]

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
    count: float  # summed over the processes as float64 (all_reduce_sum)
    loss_sum, count = 0.0, 0
    correct: list[float] = [0] * len(TOPK)
    class_counts: list[int] = []
    class_hits: list[int] = []
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
            if not class_counts:
                class_counts, class_hits = [0] * classes, [0] * classes
            for i, (n, h) in enumerate(zip(torch.bincount(targets, minlength=classes).tolist(),
                                           torch.bincount(targets[hits[:, 0]], minlength=classes).tolist())):
                class_counts[i] += n
                class_hits[i] += h
    model.train(was_training)
    loss_sum, count, *correct = all_reduce_sum([loss_sum, count, *correct], ctx)
    if count == 0:
        raise ValueError("the validation set is empty")
    metrics: dict[str, Any] = {"loss": loss_sum / count}
    metrics.update({f"acc{k}": 100.0 * c / count for k, c in zip(TOPK, correct)})
    if per_class:
        classes = len(class_counts)
        summed = all_reduce_sum([*class_counts, *class_hits], ctx)
        metrics["class_counts"] = [int(n) for n in summed[:classes]]
        metrics["class_acc1"] = [
            100.0 * h / n if n else float("nan") for n, h in zip(summed[:classes], summed[classes:])
        ]
    return metrics


def parameter_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The trainable parameters of ``model`` (each shared one once) by group, non-empty groups only.

    Groups are the parts of ``ssog info`` (:func:`ssog.models.parameter_parts`: ``patch_embed``,
    ``pos_cls``, ``mlp``, ``modulation``, ``norms``, ``head``, ``other``), each holding that part
    of every block, with the token mixers split three ways: ``mixer.kernel`` (the mixer's own tensors: SSoG's
    ``mu``, ``rho``, ``logits``), ``mixer.steer`` (SSoG's steering projections and gates) and
    ``mixer.proj`` (its linear layers: ``v`` and ``proj``, or attention's ``qkv`` and ``proj``).
    """
    parts = parameter_parts(model)
    mixers = [f"{name}." for name, _ in named_mixers(model)]
    groups: dict[str, list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        group = parts[name]
        if group == "mixer":
            local = next(name[len(prefix):] for prefix in mixers if name.startswith(prefix))
            group += ".steer" if local.startswith("steer_") else ".proj" if "." in local else ".kernel"
        groups.setdefault(group, []).append(param)
    return dict(sorted(groups.items()))


class GradNormMeter:
    """Mean over an epoch's steps of each parameter group's gradient L2 norm (:func:`parameter_groups`).

    Call :meth:`update` once per optimizer step, after backward (and after AMP unscaling),
    before clipping. A group's norm is that of all its gradients as one vector (a parameter
    without a gradient counts as zero). The sums stay on the model's device, so a step adds no
    host synchronisation; a non-finite norm (an fp16 overflow step, which the scaler skips)
    is left out of that group's mean.
    """

    def __init__(self, model: nn.Module):
        groups = parameter_groups(model)
        self.names = list(groups)
        self.params = list(groups.values())
        self.device = next(model.parameters()).device
        self.reset()

    def reset(self) -> None:
        """Start a new epoch."""
        self.sums = torch.zeros(len(self.names), device=self.device)
        self.steps = torch.zeros(len(self.names), dtype=torch.int64, device=self.device)

    @torch.no_grad()
    def update(self) -> None:
        """Add this step's norms, ``(groups,)``, from the parameters' ``.grad``."""
        norms = torch.stack([
            get_total_norm([p.grad for p in params if p.grad is not None]).to(self.device, torch.float32)
            for params in self.params
        ])
        finite = norms.isfinite()
        self.sums += torch.where(finite, norms, 0.0)
        self.steps += finite

    def means(self) -> dict[str, float | None]:
        """``{group: mean L2 norm of its gradient}`` over the steps since :meth:`reset`; None for a
        group without a finite step."""
        return {name: total / steps if steps else None
                for name, total, steps in zip(self.names, self.sums.tolist(), self.steps.tolist())}

    def state_dict(self) -> dict[str, list[float]]:
        """``{group: [sum of norms, steps]}``, JSON, for a checkpoint taken mid-epoch."""
        return {name: [total, steps] for name, total, steps in zip(self.names, self.sums.tolist(), self.steps.tolist())}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        self.reset()
        for i, name in enumerate(self.names):
            if name in state:
                self.sums[i], self.steps[i] = state[name]
