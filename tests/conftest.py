"""Fixtures shared by the training, checkpoint, reliability and distributed tests:
tiny, fast training configs and the ``ssog`` command line run as a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from ssog.train import TrainConfig

REPO = Path(__file__).resolve().parents[1]

# A 2-block SSoG ViT of width 16 on 8x8 synthetic images, 2x2 patches: milliseconds per step.
TINY_MODEL = "ssog_vit_micro_patch1_8"
TINY_KWARGS = {"embed_dim": 16, "num_heads": 2, "depth": 2, "patch_size": 2, "global_pool": "token"}


def _tiny_config(output: Path | str, **overrides: Any) -> TrainConfig:
    values = dict(
        model=TINY_MODEL, model_kwargs=dict(TINY_KWARGS), dataset="synthetic", img_size=8,
        synthetic_size=64, synthetic_classes=4, epochs=2, batch_size=16, lr=3e-3, warmup_epochs=1,
        augment="none", seed=0, deterministic=True, progress=False, output=str(output),
    )
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., TrainConfig]:
    """``tiny_config(output, **overrides)``: 4 steps per epoch of a 2-block width-16 SSoG ViT
    on 64 synthetic 8x8 images of 4 classes, deterministic, 2 epochs."""
    return _tiny_config


class SsogCli:
    """The ``ssog`` command line of this checkout, run as ``python -m ssog`` from the repository."""

    repo = REPO

    @staticmethod
    def command(*args: str) -> list[str]:
        return [sys.executable, "-m", "ssog", *args]

    @staticmethod
    def env() -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
        return env

    @staticmethod
    def config_args(cfg: TrainConfig) -> list[str]:
        """``ssog train`` arguments that reproduce ``cfg``."""
        args = []
        for key, value in cfg.to_dict().items():
            if value != getattr(TrainConfig(), key):
                if isinstance(value, dict):
                    args += [arg for k, v in value.items() for arg in ("--set", f"{key}.{k}={v}")]
                else:
                    args += ["--set", f"{key}={'null' if value is None else value}"]
        return args

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), cwd=REPO, env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, *args: str, **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args), cwd=REPO, env=self.env(), text=True, **kwargs)


@pytest.fixture(scope="session")
def ssog_cli() -> SsogCli:
    return SsogCli()
