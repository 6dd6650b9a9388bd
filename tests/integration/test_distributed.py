"""DDP: 2 CPU processes (gloo, launched by torchrun) train like 1 process with the same global batch.

Each rank takes every other sample of the shared permutation, with per-sample seeded
augmentation, and DDP averages the two half-batch gradients, so the runs differ only by
float32 summation order: losses agree to a relative 1e-4 (observed on this CPU: 3e-8 to 1e-7).
The two processes also accumulate each half-batch in two micro-batches (grad_accum_steps=2,
gradients all-reduced on the last only), which changes nothing but the summation order.

When one process is killed, the other says so in one line with the resume command, and the
run's last checkpoint stays whole.
"""
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from support import run_history
from ssog.train import train
from ssog.train.checkpoint import load_checkpoint, read_checkpoint_info
from ssog.train.distributed import DistContext, is_peer_failure, peer_stopped_message

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


def _our_process_with(variable: bytes) -> int | None:
    """The pid of a grandchild of this process (a torchrun worker) whose environment holds
    ``variable`` (``b"RANK=1"``), or None."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, parent = int(stat.parent.name), int(stat.read_text().rpartition(")")[2].split()[1])
            grandparent = int((Path("/proc") / str(parent) / "stat").read_text().rpartition(")")[2].split()[1])
            if grandparent == os.getpid() and variable in (stat.parent / "environ").read_bytes().split(b"\0"):
                return pid
        except (OSError, ValueError, IndexError):  # a process that ended while we looked
            continue
    return None


def _kill_rank_one_once(checkpoint: Path, timeout: float) -> None:
    """SIGKILL rank 1 as soon as ``checkpoint`` exists (after the first optimizer step)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if checkpoint.exists() and (pid := _our_process_with(b"RANK=1")) is not None:
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the rank-1 process in /proc")
@pytest.mark.timeout(300)
def test_a_killed_process_leaves_the_other_one_line_and_the_checkpoint_whole(tmp_path, tiny_config, ssog_cli,
                                                                              run_child):
    run, logs = tmp_path / "run", tmp_path / "logs"
    # a checkpoint at every step, far more steps than run; average pooling, so that no warning is said either
    cfg = tiny_config(run, epochs=50, checkpoint_every=1,
                      model_kwargs={**tiny_config(run).model_kwargs, "global_pool": "avg"})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--log-dir", str(logs), "--redirects", "3",  # each rank's output in its own files
               "-m", "ssog", "train", *ssog_cli.config_args(cfg)]
    killer = threading.Thread(target=_kill_rank_one_once, args=(run / "last.safetensors", 240), daemon=True)
    killer.start()
    result = run_child(command, 240, cwd=ssog_cli.repo, env=ssog_cli.env())
    killer.join()

    assert result.returncode != 0
    (rank0_stderr,) = logs.glob("*/attempt_0/0/stderr.log")
    lines = rank0_stderr.read_text().splitlines()
    assert len(lines) == 1, lines  # no gloo traceback
    stopped = re.fullmatch(
        r"ssog train: error: another process of the run stopped \(rank 1\?\); the last checkpoint "
        rf"{re.escape(str(run / 'last.safetensors'))} \(epoch 1, step (\d+)\) is kept; resume it with "
        rf"ssog train --resume {re.escape(str(run))}", lines[0])
    assert stopped, lines[0]
    state = load_checkpoint(run / "last.safetensors")  # whole: it loads
    assert state["progress"]["global_step"] == int(stopped.group(1)) >= 1


def test_only_a_collective_error_of_a_distributed_run_is_another_process_stopping():
    cpu = torch.device("cpu")
    pair, alone, four = DistContext(0, 2, 0, cpu), DistContext(0, 1, 0, cpu), DistContext(1, 4, 1, cpu)
    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:38304: "
                        "Connection reset by peer.")
    assert is_peer_failure(gloo, pair) and is_peer_failure(dist.DistBackendError("NCCL error"), pair)
    assert not is_peer_failure(gloo, alone) and not is_peer_failure(RuntimeError("shape mismatch"), pair)
    assert peer_stopped_message(pair) == "another process of the run stopped (rank 1?)"
    assert peer_stopped_message(four) == "another process of the run stopped (rank 0, 2 or 3?)"
