"""A stop signal sent to the whole job stops a run as cleanly as one sent to the trainer alone.

Schedulers and shells signal every process of a job: SLURM's scancel and preemption send
SIGTERM to every process, ``timeout`` and ``kill -- -PGID`` the process group, Ctrl-C the
terminal's foreground group. Whichever process gets it first (the loader's workers, the
trainer, or all at once), the run stops at a step boundary, saves ``last`` there, says how to
resume in one line and exits with 128 + the signal, with no traceback; in the training loop and
during the evaluation at an epoch's end alike.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ssog.runtime import STOP_SIGNALS
from ssog.train.checkpoint import read_checkpoint_info

#: A run on two datasets given in Python whose samples, read in a loader worker, mark which
#: loader has started (``MARKS/train``, ``MARKS/val``) and take a while, so that a signal finds
#: every worker busy. It exits as ``ssog train`` does on an interruption.
RUN_SCRIPT = """
import sys, time
from pathlib import Path
from PIL import Image
from torch.utils.data import get_worker_info
from ssog.train import TrainConfig, TrainingInterrupted, train

marks, output = Path(sys.argv[1]), sys.argv[2]

class Slow:
    def __init__(self, size, name, delay):
        self.size, self.name, self.delay = size, name, delay
        self.targets = [i % 4 for i in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if get_worker_info() is not None:
            (marks / self.name).touch()
            time.sleep(self.delay)
        return Image.new("RGB", (8, 8), (index * 37 % 256, index * 11 % 256, 0)), index % 4

cfg = TrainConfig(model="ssog_vit_micro_patch1_8", model_kwargs=dict(embed_dim=16, num_heads=2, depth=2,
                  patch_size=2, global_pool="avg"), img_size=8, epochs=1000, batch_size=8, lr=1e-3,
                  augment="none", seed=0, progress=False, num_workers=2, output=output)
try:
    train(cfg, train_dataset=Slow(256, "train", 0.01), val_dataset=Slow(64, "val", 0.05))
except TrainingInterrupted as stop:
    print(f"ssog train: {stop}", file=sys.stderr)
    sys.exit(128 + stop.signum)
"""


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a trainer's loader workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):  # a process that ended while we looked
            continue
    return found


def send(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def signal_job(process: subprocess.Popen, signum: int, order: str) -> None:
    """``signum`` to the trainer and its workers: the workers 0.3 s before the trainer, the
    trainer 0.3 s before the workers, or the whole process group at once."""
    workers = children(process.pid)
    assert workers, "the trainer has no loader workers to signal"
    if order == "group":
        os.killpg(process.pid, signum)
    elif order == "workers first":
        send(workers, signum)
        time.sleep(0.3)
        send([process.pid], signum)
    else:
        send([process.pid], signum)
        time.sleep(0.3)
        send(workers, signum)


def check_clean_stop(process: subprocess.Popen, err: str, signum: int, run: Path) -> dict:
    """The run ended with 128 + ``signum``, one line naming --resume, no traceback, and a
    ``last`` checkpoint at the step it names; returns the checkpoint's progress."""
    assert process.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err and "killed by signal" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    stopped = re.fullmatch(rf"ssog train: interrupted at epoch (\d+) step (\d+); resume with ssog train --resume "
                           rf"{re.escape(str(run))}", line)
    assert stopped, line
    progress = read_checkpoint_info(run / "last.safetensors")["progress"]
    epoch = progress["epoch"] + (1 if progress["step_in_epoch"] else 0)
    assert (epoch, progress["global_step"]) == (int(stopped.group(1)), int(stopped.group(2)))
    assert not (run / ".ssog-run.lock").exists()  # the folder was released
    return progress


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout  # a loaded machine can take minutes to import torch
    while not path.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    assert path.exists(), f"{path.name} never appeared (the run ended with {process.poll()})"


ORDERS = ("workers first", "trainer first", "group")
#: Every signal in every order in the training loop; each signal once, in another order each,
#: during the evaluation at the first epoch's end.
CASES = [("train", signum, order) for signum in STOP_SIGNALS for order in ORDERS] + [
    ("val", signal.SIGTERM, "workers first"), ("val", signal.SIGUSR1, "group"), ("val", signal.SIGINT, "trainer first")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the loader workers in /proc")
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("phase", "signum", "order"), CASES,
                         ids=[f"{phase}-{signal.Signals(signum).name}-{order}" for phase, signum, order in CASES])
def test_a_stop_signal_to_the_job_in_any_order_saves_the_step(phase, signum, order, tmp_path, ssog_cli):
    script, marks, run = tmp_path / "run.py", tmp_path / "marks", tmp_path / "run"
    script.write_text(RUN_SCRIPT)
    marks.mkdir()
    # the training loader's workers have started, and for "val" the evaluation's too, in the middle of it
    with ssog_cli.popen_python(str(script), str(marks), str(run), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True) as process:
        wait_for(marks / phase, process)
        if phase == "train":
            time.sleep(0.5)  # a few steps in
        signal_job(process, signum, order)
        _, err = process.communicate(timeout=120)
    progress = check_clean_stop(process, err, signum, run)
    if phase == "val":  # stopped during the first evaluation: its epoch ended, evaluated and saved
        assert (progress["epoch"], progress["step_in_epoch"], progress["global_step"]) == (1, 0, 32)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the loader workers in /proc")
@pytest.mark.timeout(900)
def test_ssog_train_with_loader_workers_stops_cleanly_on_sigterm_to_its_group(tmp_path, tiny_config, ssog_cli):
    run = tmp_path / "run"
    cfg = tiny_config(run, epochs=1000, checkpoint_every=0, num_workers=2, deterministic=False)
    with ssog_cli.popen("train", *ssog_cli.config_args(cfg), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        start_new_session=True) as process:
        wait_for(run / "last.safetensors", process)
        signal_job(process, signal.SIGTERM, "workers first")
        _, err = process.communicate(timeout=120)
    check_clean_stop(process, err, signal.SIGTERM, run)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the loader workers in /proc")
@pytest.mark.timeout(900)
def test_under_torchrun_a_sigterm_to_the_job_stops_every_rank_with_one_checkpoint(tmp_path, tiny_config, ssog_cli):
    run, logs = tmp_path / "run", tmp_path / "logs"
    cfg = tiny_config(run, epochs=1000, checkpoint_every=0, num_workers=1, deterministic=False,
                      model_kwargs={**tiny_config(run).model_kwargs, "global_pool": "avg"})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--log-dir", str(logs), "--redirects", "3",  # each rank's output in its own files
               "-m", "ssog", "train", *ssog_cli.config_args(cfg)]
    # as scancel does: the launcher, both ranks and their loader workers, all at once
    with ssog_cli.popen_python(*command[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True) as process:
        wait_for(run / "last.safetensors", process)
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGTERM)
        out, _ = process.communicate(timeout=120)
    assert process.returncode != 0, out[-3000:]  # torchrun's own status after a signal: 1
    progress = read_checkpoint_info(run / "last.safetensors")["progress"]
    for rank in (0, 1):
        (stderr,) = logs.glob(f"*/attempt_0/{rank}/stderr.log")
        lines = stderr.read_text().splitlines()
        assert len(lines) == 1, lines  # no traceback, no complaint of a worker
        stopped = re.fullmatch(rf"ssog train: interrupted at epoch (\d+) step (\d+); resume with ssog train "
                               rf"--resume {re.escape(str(run))}", lines[0])
        assert stopped, lines[0]
        epoch = progress["epoch"] + (1 if progress["step_in_epoch"] else 0)
        assert (epoch, progress["global_step"]) == (int(stopped.group(1)), int(stopped.group(2)))
    assert not (run / ".ssog-run.lock").exists()



ORPHAN = """
import os, signal, sys, time
import numpy as np
from ssog.data import StopSafeDataLoader

class Arrays:  # numpy results go through the workers' pipe, not shared memory
    def __len__(self): return 64
    def __getitem__(self, index): return np.zeros(1 << 20, dtype=np.float32)

iterator = iter(StopSafeDataLoader(Arrays(), batch_size=4, num_workers=1, collate_fn=list))
time.sleep(3)  # the worker fills the pipe and waits to write more
open(sys.argv[1], "w").write(str(iterator._workers[0].pid))
os.kill(os.getpid(), signal.SIGTERM)  # no handler yet: the process ends without shutting its loader down
"""


def test_a_loader_worker_ends_with_a_parent_that_never_shut_it_down(tmp_path):
    pid_file = tmp_path / "worker.pid"
    # no pipes to the child: an orphaned worker would hold them open
    done = subprocess.run([sys.executable, "-c", ORPHAN, str(pid_file)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=120)
    assert done.returncode == -signal.SIGTERM
    worker = int(pid_file.read_text())

    def running() -> bool:
        stat = Path(f"/proc/{worker}/stat")
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 15
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = running()
    if alive:
        os.kill(worker, signal.SIGKILL)
    assert not alive, "the orphaned loader worker still runs 15 s after its parent ended"
