"""Helpers the test modules share (imported as ``from support import ...``; pytest puts this
folder on the path): small ImageFolder trees and a run's per-epoch log."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image


def image_tree(root: Path, splits: Sequence[str] = ("train", "val"), classes: Sequence[str] = ("cat", "dog"),
               per_class: int = 3, size: int = 12) -> Path:
    """``root/<split>/<class>/<i>.png``, seeded random RGB images (``splits=("",)``: the class
    folders directly under ``root``); returns ``root``."""
    rng = np.random.default_rng(0)
    for split in splits:
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def run_history(run: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``log.jsonl``, one per epoch."""
    return [json.loads(line) for line in (Path(run) / "log.jsonl").read_text().splitlines()]


def crash_after_save(monkeypatch, step: int):
    """Make a run raise KeyboardInterrupt right after it saved its checkpoint at optimizer step
    ``step`` (a kill between two steps); returns the real ``Trainer.save_last``."""
    from ssog.train.engine import Trainer

    original = Trainer.save_last

    def save_then_crash(self, **kwargs):
        original(self, **kwargs)
        if self.global_step == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "save_last", save_then_crash)
    return original
