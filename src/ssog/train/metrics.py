"""Run metrics: validation loss and Acc@1/3/5 (in %), summed over processes; the paired
difference of two models' Acc@1 on the same images; gradient norms per parameter group,
averaged over an epoch's steps."""
from __future__ import annotations

import math
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

__all__ = ["TOPK", "GradNormMeter", "evaluate", "paired_difference", "parameter_groups"]

TOPK = (1, 3, 5)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, ctx: DistContext, amp: str = "none",
             progress=None, per_class: bool = False, per_sample: bool = False) -> dict[str, Any]:
    """``{"loss", "acc1", "acc3", "acc5"}`` of ``model`` on every sample of ``loader``; with
    ``per_class`` also ``class_counts`` (images per label) and ``class_acc1`` (Acc@1 per label, %);
    with ``per_sample`` also ``targets`` (``(N,)`` int64) and ``correct`` (``(N,)`` bool: its top-1
    is the target), on the CPU in the loader's order, for one process only.

    Each process evaluates its shard; sums are reduced so every process returns the metrics
    of the whole set. Top-k with k above the number of classes counts as top-C.
    """
    if per_sample and ctx.distributed:
        raise ValueError("per-sample results need the whole evaluation set in one process; evaluate without "
                         "torchrun (one process)")
    was_training = model.training
    model.eval()
    count: float  # summed over the processes as float64 (all_reduce_sum)
    loss_sum, count = 0.0, 0
    correct: list[float] = [0] * len(TOPK)
    class_counts: list[int] = []
    class_hits: list[int] = []
    sample_targets: list[torch.Tensor] = []
    sample_correct: list[torch.Tensor] = []
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
        if per_sample:
            sample_targets.append(targets.cpu())
            sample_correct.append(hits[:, 0].cpu())
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
    if per_sample:
        metrics.update(targets=torch.cat(sample_targets), correct=torch.cat(sample_correct))
    return metrics


def paired_difference(correct_a: torch.Tensor, correct_b: torch.Tensor) -> dict[str, Any]:
    """How far model A's Acc@1 is from model B's on the same images, and whether that exceeds
    the noise of the images drawn.

    ``correct_a``, ``correct_b``: ``(N,)`` bool, image ``i`` classified right by A / by B. Returns
    ``images`` (N), ``acc1_a``, ``acc1_b`` and ``difference`` (A - B) in %, ``only_a`` /
    ``only_b`` (images only A / only B gets right), ``ci95`` (``[low, high]``, %: the Wald
    interval of a paired difference of proportions) and ``p_value`` (McNemar's exact two-sided
    test: the discordant images split as a fair coin would split them). Pairing removes the
    images both get right or both get wrong, so the interval is narrower than two separate
    runs' binomial errors suggest. It measures the evaluation images' noise, not training's:
    two seeds of one recipe can differ by more.
    """
    if correct_a.shape != correct_b.shape or correct_a.ndim != 1 or not correct_a.numel():
        raise ValueError(f"paired results need one flag per image from each model, got shapes "
                         f"{tuple(correct_a.shape)} and {tuple(correct_b.shape)}")
    images = correct_a.numel()
    only_a = int((correct_a & ~correct_b).sum())
    only_b = int((correct_b & ~correct_a).sum())
    difference = (only_a - only_b) / images
    spread = math.sqrt(max(only_a + only_b - (only_a - only_b) ** 2 / images, 0.0)) / images
    discordant = only_a + only_b
    # exact binomial tail in integers (math.comb): a float tail underflows at thousands of images
    tail = sum(math.comb(discordant, k) for k in range(min(only_a, only_b) + 1))
    return {
        "images": images,
        "acc1_a": 100.0 * float(correct_a.float().mean()), "acc1_b": 100.0 * float(correct_b.float().mean()),
        "difference": 100.0 * difference, "only_a": only_a, "only_b": only_b,
        "ci95": [100.0 * (difference - 1.96 * spread), 100.0 * (difference + 1.96 * spread)],
        "p_value": min(1.0, 2 * tail / 2 ** discordant),
    }


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
