"""DDP: 2 CPU processes (gloo, launched by torchrun) train like 1 process with the same global batch.

Each rank takes every other sample of the shared permutation, with per-sample seeded
augmentation, and DDP averages the two half-batch gradients, so the runs differ only by
float32 summation order: losses agree to a relative 1e-4 (observed on this CPU: 3e-8 to 1e-7).
The two processes also accumulate each half-batch in two micro-batches (grad_accum_steps=2,
gradients all-reduced on the last only), which changes nothing but the summation order.
"""
import json
import sys

import pytest

from support import run_history
from ssog.train import train
from ssog.train.checkpoint import read_checkpoint_info

TOLERANCE = 1e-4


@pytest.mark.timeout(300)
def test_two_gloo_processes_match_one_process(tmp_path, tiny_config, ssog_cli, run_child):
    options = dict(epochs=2, batch_size=16, augment="weak", checkpoint_every=3)
    single = train(tiny_config(tmp_path / "one", **options))

    two = tiny_config(tmp_path / "two", grad_accum_steps=2, **options)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "ssog", "train", *ssog_cli.config_args(two)]
    result = run_child(command, 240, cwd=ssog_cli.repo, env=ssog_cli.env())
    assert result.returncode == 0, result.stderr[-3000:]
    double = json.loads((tmp_path / "two" / "summary.json").read_text())

    assert double["world_size"] == 2 and double["steps"] == single["steps"] == 8
    assert result.stdout.count("done:") == 1  # rank 0 alone reports
    for one, two in zip(run_history(tmp_path / "one"), run_history(tmp_path / "two"), strict=True):
        for key in ("train_loss", "val_loss"):
            assert two[key] == pytest.approx(one[key], rel=TOLERANCE), (one["epoch"], key)
        assert abs(two["acc1"] - one["acc1"]) <= 100 / 16  # at most one of 16 validation images
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=TOLERANCE)  # of the averaged gradient
    state = read_checkpoint_info(tmp_path / "two" / "last.safetensors")
    assert state["progress"]["global_step"] == 8
