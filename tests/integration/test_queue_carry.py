"""docs/results/cifar100/queue_carry.sh: a session's unfinished queue runs, stopped with a
checkpoint and copied into the repository for the next machine."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "results" / "cifar100" / "queue_carry.sh"


@pytest.mark.slow
@pytest.mark.subprocess
def test_unfinished_runs_are_stopped_and_carried_finished_and_large_ones_are_not(tmp_path, ssog_cli, tiny_config):
    runs, repo = tmp_path / "runs", tmp_path / "repo"
    repo.mkdir()
    finished, large = runs / "finished", runs / "large"
    for run in (finished, large):
        run.mkdir(parents=True)
        (run / "last.safetensors").write_bytes(b"0" * (9 * 2**20 if run is large else 8))
    (finished / "summary.json").write_text("{}")
    training = runs / "running"
    arguments = ssog_cli.config_args(tiny_config(training, epochs=10**5))  # stopped long before its end
    with ssog_cli.popen("train", *arguments, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:
        deadline = time.monotonic() + 120
        while not (training / "last.safetensors").is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (training / "last.safetensors").is_file(), "the run saved no checkpoint in 2 minutes"
        carried = subprocess.run(["bash", str(SCRIPT)], cwd=repo, env={**os.environ, "RUNS": str(runs)},
                                 capture_output=True, text=True, timeout=120)
        assert process.wait(timeout=30) == 143, process.stderr.read()  # stopped by SIGTERM, as a stop is
    assert carried.returncode == 0, carried.stdout + carried.stderr
    carry = repo / "docs" / "results" / "cifar100" / "carry"
    assert sorted(p.name for p in carry.iterdir()) == ["running"]
    kept = {p.name for p in (carry / "running").iterdir()}
    assert {"last.safetensors", "config.yaml", ".ssog-run"} <= kept and ".ssog-run.lock" not in kept
    assert (carry / "running" / "last.safetensors").read_bytes() == (training / "last.safetensors").read_bytes()
    assert "large: 9 MiB, over the carry's 8 MiB" in carried.stdout
    assert (runs / "STOP").exists()  # the workers take no further run
