"""docs/results/cifar100/gpu_widths.sh: its rehearsal without a GPU (EXTRA="--device cpu ..."),
with the queue's unarchived CIFAR-100 lines (QUEUE=) as the runs."""
from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "results" / "cifar100" / "gpu_widths.sh"
ARCHIVED = "odevit_ssog_p2"  # the test's RESULTS/cifar100/runs/ holds its summary: the queue skips it


def tiny_cifar100(folder: Path) -> Path:
    """A tarball laid out as ../shared/data/cifar100-train.tar.gz: cifar100/train/CLASS/*.png."""
    rng = np.random.default_rng(0)
    for name in ("apple", "bee", "cat"):
        (folder / "cifar100" / "train" / name).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
                folder / "cifar100" / "train" / name / f"{i:04d}.png")
    tarball = folder / "cifar100-train.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(folder / "cifar100", arcname="cifar100")
    return tarball


@pytest.mark.slow
def test_the_queue_mode_runs_each_unarchived_cifar100_line_with_its_arguments(tmp_path, run_child):
    results = tmp_path / "results"  # not docs/results: which runs it holds changes as the queue runs
    (results / "cifar100" / "runs" / ARCHIVED).mkdir(parents=True)
    (results / "cifar100" / "runs" / ARCHIVED / "summary.json").write_text("{}")
    queue = tmp_path / "queue.txt"
    queue.write_text(
        "# a comment\n"
        f"379d77d cifar100.yaml {ARCHIVED} cifar100\n"
        "47d0071 cifar100.yaml sweep_odevit_ssog_p2_lr8e-3+time_kernels cifar100 --set model_kwargs.time_kernels=true\n"
        "379d77d cifar100.yaml sweep_odevit_mha_p2_lr4e-3 cifar100\n"
        "f638755 tinyimagenet.yaml mha_p4 tinyimagenet\n"
    )
    env = {**os.environ, "PYTHON": sys.executable, "QUEUE": str(queue), "RESULTS": str(results),
           "EXTRA": "--device cpu --max-steps 1 --val-split 6 --batch-size 4"}
    out = tmp_path / "out"
    done = run_child(["bash", str(SCRIPT), str(tiny_cifar100(tmp_path)), str(out), "300"], 400, env=env, cwd=ROOT)
    assert done.returncode == 0 and "finished: 2 of 2" in done.stdout, done.stdout + done.stderr
    with tarfile.open(out / "widths.tgz") as archive:
        archive.extractall(tmp_path / "runs", filter="data")
    runs = tmp_path / "runs"
    assert {p.name for p in runs.iterdir() if p.is_dir()} == {
        "sweep_odevit_ssog_p2_lr8e-3+time_kernels", "sweep_odevit_mha_p2_lr4e-3"}
    assert "time_kernels: true" in (runs / "sweep_odevit_ssog_p2_lr8e-3+time_kernels" / "config.yaml").read_text()
    assert "time_kernels" not in (runs / "sweep_odevit_mha_p2_lr4e-3" / "config.yaml").read_text()
    assert all((run / "summary.json").is_file() for run in runs.iterdir() if run.is_dir())
