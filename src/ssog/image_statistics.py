"""Per-channel mean and std (pixel values scaled to [0, 1], RGB order) of the data sets the
CPU presets are made for.

One home for both of their users: the data sources (:data:`ssog.data.info.SOURCE_STATISTICS`)
and the presets' ``pretrained_cfg`` (:mod:`ssog.models._registry`). It sits below both, with
no imports, because models must not import the data package (``README.md``, "Development":
``data`` is built on ``models``) and importing it would load torchvision with ``import ssog``.
"""
from __future__ import annotations

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100_MEAN", "CIFAR100_STD"]

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
