"""Checkpoints: lossless round trips, atomic writes, clear errors, exact resume, kill and resume."""
import json
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2

from support import crash_after_save, run_history
from ssog.cli import main
from ssog.train import check_state_dict, load_checkpoint, save_checkpoint, train
from ssog.train.checkpoint import read_checkpoint_info

METRICS = ("train_loss", "val_loss", "acc1", "acc3", "acc5", "lr", "step", "grad_norm")


def _trained_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-2, weight_decay=0.05)
    scheduler, _ = create_scheduler_v2(optimizer, num_epochs=4, warmup_epochs=1, step_on_epochs=False,
                                       updates_per_epoch=5)
    for step in range(3):
        model(torch.randn(5, 4)).square().mean().backward()
        optimizer.step()
        scheduler.step_update(num_updates=step + 1)
    return model, optimizer, scheduler


def test_round_trip_restores_every_kind_of_state(tmp_path):
    model, optimizer, scheduler = _trained_optimizer()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "rng": [{"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}],
        "progress": {"epoch": 2, "loss_sum": float("inf"), "nothing": None}, "history": [{"acc1": 50.0}],
    }
    expected = (random.random(), np.random.rand(), torch.rand(1))  # the draws the saved RNG states give
    path = save_checkpoint(tmp_path / "ck.safetensors", state)
    loaded = load_checkpoint(path)

    assert loaded["progress"] == state["progress"] and loaded["history"] == state["history"]
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
    fresh, fresh_opt, fresh_sched = _trained_optimizer()
    fresh_opt.load_state_dict(loaded["optimizer"])
    fresh_sched.load_state_dict(loaded["scheduler"])
    assert fresh_opt.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    assert isinstance(loaded["optimizer"]["param_groups"][0]["betas"], tuple)
    for k, v in optimizer.state_dict()["state"].items():
        assert all(torch.equal(loaded["optimizer"]["state"][k][name], t) for name, t in v.items())
    assert fresh_sched.state_dict() == scheduler.state_dict()

    rng = loaded["rng"][0]
    random.setstate(rng["python"]), np.random.set_state(rng["numpy"]), torch.set_rng_state(rng["torch"])
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def test_failed_save_keeps_previous_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path / "last.safetensors", {"progress": {"epoch": 1}})
    before = path.read_bytes()
    with pytest.raises(TypeError, match="cannot store object"):
        save_checkpoint(path, {"progress": {"epoch": 2}, "bad": object()})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.safetensors"]  # no temporary file left


def test_truncated_missing_and_foreign_files_give_clear_errors(tmp_path):
    path = save_checkpoint(tmp_path / "ck.safetensors", {"model": {"w": torch.ones(1000)}})
    data = path.read_bytes()
    for cut in (50, len(data) // 2, len(data) - 8):
        (tmp_path / "cut.safetensors").write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated"):
            load_checkpoint(tmp_path / "cut.safetensors")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors")
    save_file({"w": torch.ones(2)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="not an ssog training checkpoint"):
        load_checkpoint(tmp_path / "plain.safetensors")


WRITER = """
import sys, torch
from ssog.train import save_checkpoint
step = 0
while True:
    step += 1
    weights = torch.full((1000 + step % 7,), float(step))
    save_checkpoint(sys.argv[1], {"progress": {"step": step}, "model": {"w": weights}})
"""


@pytest.mark.slow
def test_readers_racing_a_writer_see_whole_checkpoints(tmp_path):
    """Every read of a checkpoint that another process keeps replacing returns one version:
    its JSON (the counter) and its tensors (filled with the counter, of a length that
    changes with it) agree. safetensors' own torch loader reopens the file by name for the
    data, so it could pair one version's header with the next version's data."""
    path = tmp_path / "last.safetensors"
    save_checkpoint(path, {"progress": {"step": 0}, "model": {"w": torch.zeros(1000)}})
    with subprocess.Popen([sys.executable, "-c", WRITER, str(path)]) as writer:
        try:
            start = time.monotonic()
            deadline, reads, first_write = start + 300, 0, None  # a loaded machine imports torch slowly
            while time.monotonic() < deadline and writer.poll() is None:
                state = load_checkpoint(path)
                step, weights = state["progress"]["step"], state["model"]["w"]
                assert weights.numel() == 1000 + step % 7 and bool((weights == step).all()), step
                reads += 1
                if step > 0 and first_write is None:
                    first_write = time.monotonic()
                    deadline = first_write + 3.0
        finally:
            writer.kill()
    assert reads > 10 and step > 10, (reads, step)


def test_state_dict_mismatch_lists_keys_and_shapes():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    state = model.state_dict()
    state["1.weight"] = torch.zeros(5, 8)
    del state["1.bias"]
    state["2.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"missing keys: 1\.bias; unexpected keys: 2\.weight; "
                                         r"shape mismatches: 1\.weight: checkpoint \(5, 8\) vs model \(3, 8\)"):
        check_state_dict(model, state, "test checkpoint")


# ---------------------------------------------------------------- resume through the engine
def _metrics(history):
    return [{k: r[k] for k in METRICS} for r in history]


@pytest.mark.slow
def test_resume_mid_epoch_reproduces_uninterrupted_run(tmp_path, monkeypatch, tiny_config):
    """Mixup, drop-path and EMA all draw random numbers: a resume must restore every stream."""
    options = dict(epochs=3, augment="strong", drop_path=0.1, ema_decay=0.9, checkpoint_every=3)
    reference = train(tiny_config(tmp_path / "ref", **options))

    crash_after_save(monkeypatch, 6)  # mid-epoch 2 (4 steps per epoch)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(tmp_path / "run", **options))
    monkeypatch.undo()
    info = read_checkpoint_info(tmp_path / "run" / "last.safetensors")
    assert (info["progress"]["epoch"], info["progress"]["step_in_epoch"]) == (1, 2)

    resumed = train(resume=tmp_path / "run")
    assert _metrics(run_history(tmp_path / "run")) == _metrics(run_history(tmp_path / "ref"))
    for key in ("acc1", "acc3", "acc5", "loss", "ema_acc1", "ema_loss", "train_loss", "steps", "params"):
        assert resumed[key] == reference[key], key


def test_resume_errors(tmp_path, tiny_config):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train(resume=tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="last.safetensors"):
        train(resume=tmp_path / "empty")
    train(tiny_config(tmp_path / "run", epochs=1))
    with pytest.raises(ValueError, match="'best' checkpoint"):
        train(resume=tmp_path / "run" / "best.safetensors")
    with pytest.raises(ValueError, match="already holds a run.*--resume"):
        train(tiny_config(tmp_path / "run", epochs=1))

    # the checkpoint of a different architecture: a clear mismatch, never a silent restart
    state = load_checkpoint(tmp_path / "run" / "last.safetensors")
    state["config"]["model_kwargs"]["embed_dim"] = 32
    save_checkpoint(tmp_path / "other" / "last.safetensors", state)
    with pytest.raises(ValueError, match="does not match the model.*shape mismatches"):
        train(resume=tmp_path / "other")


def test_sigkill_mid_epoch_then_resume(tmp_path, tiny_config, ssog_cli, capsys):
    """A run killed with SIGKILL loses only the steps since its last checkpoint and then ends
    exactly where an uninterrupted run ends."""
    options = dict(epochs=3, img_size=16, synthetic_size=96, batch_size=8)  # 12 steps per epoch
    cfg = tiny_config(tmp_path / "run", checkpoint_every=2, **options)
    last = tmp_path / "run" / "last.safetensors"
    seen = None
    with ssog_cli.popen("train", *ssog_cli.config_args(cfg), stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE) as process:
        deadline = time.monotonic() + 600  # a loaded machine can take minutes to import torch
        while time.monotonic() < deadline and process.poll() is None:
            if last.exists():
                progress = read_checkpoint_info(last)["progress"]  # read while the run replaces it
                if progress["global_step"] >= 4 and progress["step_in_epoch"] > 0:
                    process.send_signal(signal.SIGKILL)
                    seen = progress
                    break
            time.sleep(0.01)
        process.wait(timeout=60)
        assert seen is not None and process.returncode == -signal.SIGKILL, process.stderr.read()[-2000:]
    assert not (tmp_path / "run" / "summary.json").exists()

    # the resume itself runs in this process: only the kill needs a process of its own
    assert main(["train", "--resume", str(tmp_path / "run")]) == 0
    resumed_at = re.search(r"resumed at epoch \d+, step (\d+)", "".join(capsys.readouterr()))
    assert resumed_at and int(resumed_at.group(1)) >= seen["global_step"]
    step = read_checkpoint_info(last)["progress"]["global_step"]
    reference = train(tiny_config(tmp_path / "ref", **options))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert step == reference["steps"] == summary["steps"]
    assert _metrics(run_history(tmp_path / "run")) == _metrics(run_history(tmp_path / "ref"))
    assert [p.name for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")] == []
