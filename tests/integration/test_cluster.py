"""Ready for a cluster: one command that starts a run or resumes it (``--resume auto``), and
the SLURM example of docs/training.md run line by line on this CPU (``srun`` and ``scontrol``
stand-ins), stopped by its deadline signal, requeued and finished."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import run_history
from ssog.cli import main
from ssog.train.checkpoint import read_checkpoint_info

REPO = Path(__file__).resolve().parents[2]


def _args(tiny_config, output: Path, *extra: str) -> list[str]:
    cfg = tiny_config(output)
    args = ["--model", cfg.model, "--img-size", "8", "--dataset", "synthetic", "--set", "synthetic_size=32",
            "--set", "synthetic_classes=4", "--batch-size", "8", "--no-progress", "--output", str(output)]
    return args + [a for k, v in cfg.model_kwargs.items() for a in ("--set", f"model_kwargs.{k}={v}")] + list(extra)


def _last_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_resume_auto_starts_a_run_then_resumes_it_with_the_same_command(tmp_path, tiny_config, capsys):
    run = tmp_path / "run"
    assert main(["train", *_args(tiny_config, run, "--epochs", "1", "--resume", "auto")]) == 0
    assert [r["epoch"] for r in run_history(run)] == [1]
    # the requeued job: the same command with a longer schedule (epochs may change on resume)
    capsys.readouterr()
    assert main(["train", *_args(tiny_config, run, "--epochs", "2", "--resume", "auto")]) == 0
    assert "resumed at epoch 2, step 4" in "".join(capsys.readouterr())
    assert [r["epoch"] for r in run_history(run)] == [1, 2]
    assert json.loads((run / "summary.json").read_text())["steps"] == 8
    assert read_checkpoint_info(run / "last.safetensors")["progress"]["global_step"] == 8


def test_resume_auto_refuses_a_run_with_other_settings(tmp_path, tiny_config, capsys):
    run = tmp_path / "run"
    assert main(["train", *_args(tiny_config, run, "--epochs", "1")]) == 0
    before = (run / "last.safetensors").read_bytes()
    assert main(["train", *_args(tiny_config, run, "--epochs", "1", "--seed", "7", "--resume", "auto")]) == 2
    assert _last_line(capsys) == (f"ssog train: error: --resume auto: {run} holds a run with other settings (seed: 0 "
                                  f"there, 7 here); resume it with --resume {run}, or give another --output")
    assert (run / "last.safetensors").read_bytes() == before
    for extra, message in ((["--overwrite"], "--overwrite starts a new run in place of another; --resume auto"),
                           ([], "--resume auto starts the run in --output or resumes it there: give --output")):
        args = _args(tiny_config, run, "--resume", "auto", *extra)
        if not extra:
            args = [a for a in args if a not in ("--output", str(run))]
        assert main(["train", *args]) == 2
        assert message in _last_line(capsys)


def test_resume_auto_starts_again_a_run_that_saved_no_checkpoint(tmp_path, tiny_config, ssog_log):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".ssog-run").write_text("an ssog run\n")
    (run / "config.yaml").write_text("# ssog train: the resolved configuration of the run in this folder\nepochs: 1\n")
    (run / "notes.txt").write_text("mine")
    assert main(["train", *_args(tiny_config, run, "--epochs", "1", "--resume", "auto")]) == 0
    assert (run / "summary.json").is_file() and (run / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- the SLURM example, on this CPU
def _slurm_script() -> str:
    """The sbatch script of docs/training.md ("On a cluster")."""
    text = (REPO / "docs" / "training.md").read_text()
    match = re.search(r"```bash\n(#!/bin/bash\n#SBATCH .*?)```", text, re.S)
    assert match, "docs/training.md has no sbatch script"
    return match.group(1)


def _stand_ins(folder: Path) -> None:
    """``srun`` runs its command; ``scontrol show hostnames`` names this machine and
    ``scontrol requeue`` notes the job in ``requeued``."""
    folder.mkdir()
    (folder / "srun").write_text('#!/bin/bash\nexec "$@"\n')
    (folder / "scontrol").write_text(f'#!/bin/bash\nif [ "$1" = requeue ]; then echo "$2" >> {folder}/requeued; '
                                     'else echo localhost; fi\n')
    for name in ("srun", "scontrol"):
        (folder / name).chmod(0o755)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not os.path.exists("/proc"), reason="Linux: torchrun and bash")
@pytest.mark.timeout(900)
def test_the_slurm_example_stops_at_its_deadline_signal_requeues_and_finishes(tmp_path, tiny_config, ssog_cli):
    import yaml

    bin_dir, run = tmp_path / "bin", tmp_path / "run"
    _stand_ins(bin_dir)
    script = tmp_path / "job.sbatch"
    script.write_text(_slurm_script())
    recipe = tmp_path / "recipe.yaml"
    cfg = tiny_config(run, epochs=6, synthetic_size=256, device="cpu", deterministic=False, checkpoint_every=0)
    recipe.write_text(yaml.safe_dump({k: v for k, v in cfg.to_dict().items() if k != "output"}))
    env = dict(ssog_cli.env(), PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ['PATH']}", SLURM_JOB_ID="4711", SLURM_NNODES="1", SLURM_JOB_NODELIST="localhost",
               SLURM_RESTART_COUNT="0", RECIPE=str(recipe), RUN=str(run), GPUS_PER_NODE="2",
               MASTER_PORT=str(_free_port()))
    # the first run of the job: its deadline signal (SIGUSR1 to the batch script) after the first checkpoint
    with _bash(script, env) as job:
        deadline = time.monotonic() + 600
        while not (run / "last.safetensors").exists() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.05)
        assert (run / "last.safetensors").exists(), job.communicate()[0][-3000:]
        job.send_signal(signal.SIGUSR1)
        out, _ = job.communicate(timeout=300)
    assert (bin_dir / "requeued").read_text() == "4711\n", out[-3000:]
    assert not (run / "summary.json").exists() and not (run / ".ssog-run.lock").exists()
    stopped = read_checkpoint_info(run / "last.safetensors")["progress"]["global_step"]
    assert 0 < stopped < 6 * 16
    # each process says its line; no traceback passes through ssog (torchrun reports the signal itself)
    assert len(re.findall(rf"ssog train: interrupted at epoch \d+ step {stopped}; resume with ssog train --resume "
                          rf"{re.escape(str(run))}", out)) == 2, out[-3000:]
    assert "src/ssog" not in out and "killed by signal" not in out
    # the requeued run: the same script, SLURM_RESTART_COUNT 1, to the end; no further requeue
    env["SLURM_RESTART_COUNT"] = "1"
    with _bash(script, env) as job:
        out, _ = job.communicate(timeout=600)
    assert job.returncode == 0, out[-3000:]
    assert "resumed at epoch" in out and json.loads((run / "summary.json").read_text())["steps"] == 6 * 16
    assert (bin_dir / "requeued").read_text() == "4711\n"


def _bash(script: Path, env: dict[str, str]):
    from conftest import child_process

    return child_process(["bash", str(script), "--device", "cpu"], cwd=REPO, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
