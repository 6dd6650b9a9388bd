"""Fixtures shared by the tests: one torch thread; and, for the training, checkpoint,
reliability and distributed tests, tiny, fast training configs, child processes that never
outlive their test, and the ``ssog`` command line run as such a child."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest
import torch

from ssog.train import TrainConfig

REPO = Path(__file__).resolve().parents[1]

# A 2-block SSoG ViT of width 16 on 8x8 synthetic images, 2x2 patches: milliseconds per step.
TINY_MODEL = "ssog_vit_micro_patch1_8"
TINY_KWARGS = {"embed_dim": 16, "num_heads": 2, "depth": 2, "patch_size": 2, "global_pool": "token"}


#: Fixtures that start a child process (``python -m ssog``, torchrun): their tests are marked
#: ``subprocess`` and ``slow`` (a child imports torch: seconds before it does anything).
CHILD_FIXTURES = {"run_child", "ssog_cli"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if CHILD_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.subprocess)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    """Torch runs on one thread in the tests: their tensors are tiny, and a second thread only
    adds synchronisation stalls, which grow many-fold when the CPU is busy
    (docs/development.md, "Threads")."""
    torch.set_num_threads(1)


@pytest.fixture
def ssog_log(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    """``caplog`` holding the ``ssog`` loggers' records from INFO up, also after a command-line
    test installed its printing handler (which stops them from reaching caplog's root handler)."""
    monkeypatch.setattr(logging.getLogger("ssog"), "propagate", True)
    caplog.set_level(logging.INFO, logger="ssog")
    return caplog


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


# Linux's prctl, looked up here rather than in the forked child, where only the call itself runs.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _die_with_pytest() -> None:
    """Run in the child before its command: the kernel kills it when pytest's process ends,
    even when pytest itself is killed and runs no finalizer."""
    _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


@contextmanager
def child_process(command: Sequence[str], **kwargs: Any) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(command, **kwargs)`` that does not outlive the block: if the child still
    runs when the block ends (the test failed, timed out or was interrupted), it gets SIGTERM, so
    that torchrun stops its workers too, and SIGKILL 30 s later."""
    with subprocess.Popen(command, preexec_fn=_die_with_pytest if _PRCTL else None, **kwargs) as process:
        try:
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()


def run_child(command: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)``, the
    child stopped as by :func:`child_process` if the test ends first."""
    with child_process(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs) as process:
        stdout, stderr = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="session", name="run_child")
def run_child_fixture() -> Callable[..., subprocess.CompletedProcess]:
    """:func:`run_child` for the test modules (``run_child(command, timeout, **popen_kwargs)``)."""
    return run_child


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
        env["OMP_NUM_THREADS"] = "1"  # one torch thread, as in the tests' own process
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

    def popen(self, *args: str, **kwargs: Any) -> AbstractContextManager[subprocess.Popen]:
        """``with ssog_cli.popen(...) as process:``, a :func:`child_process`."""
        return child_process(self.command(*args), cwd=REPO, env=self.env(), text=True, **kwargs)

    def popen_python(self, *args: str, **kwargs: Any) -> AbstractContextManager[subprocess.Popen]:
        """``with ssog_cli.popen_python(script, ...) as process:``: this Python, with the
        checkout's ``ssog``, as a :func:`child_process`."""
        return child_process([sys.executable, *args], cwd=REPO, env=self.env(), text=True, **kwargs)


@pytest.fixture(scope="session")
def ssog_cli() -> SsogCli:
    return SsogCli()
