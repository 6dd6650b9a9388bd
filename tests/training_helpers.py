"""Tiny, fast training configs shared by the training, checkpoint and distributed tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ssog.train import TrainConfig

REPO = Path(__file__).resolve().parents[1]

# A 2-block SSoG ViT of width 16 on 8x8 synthetic images, 2x2 patches: milliseconds per step.
TINY_MODEL = "ssog_vit_micro_patch1_8"
TINY_KWARGS = {"embed_dim": 16, "num_heads": 2, "depth": 2, "patch_size": 2, "global_pool": "token"}


def tiny_config(output: Path | str, **overrides) -> TrainConfig:
    values = dict(
        model=TINY_MODEL, model_kwargs=dict(TINY_KWARGS), dataset="synthetic", img_size=8,
        synthetic_size=64, synthetic_classes=4, epochs=2, batch_size=16, lr=3e-3, warmup_epochs=1,
        augment="none", seed=0, deterministic=True, progress=False, output=str(output),
    )
    values.update(overrides)
    return TrainConfig(**values)


def cli_args(cfg: TrainConfig) -> list[str]:
    """``ssog train`` arguments that reproduce ``cfg``."""
    args = []
    for key, value in cfg.to_dict().items():
        if value != getattr(TrainConfig(), key):
            if isinstance(value, dict):
                args += [arg for k, v in value.items() for arg in ("--set", f"{key}.{k}={v}")]
            else:
                args += ["--set", f"{key}={'null' if value is None else value}"]
    return args


def ssog_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ssog", *args]


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_ssog(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(ssog_command(*args), cwd=REPO, env=run_env(), capture_output=True, text=True,
                          timeout=timeout)
