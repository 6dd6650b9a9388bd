"""Hostile input to the command line: every case ends in one clear line and exit 2 (130/143
for an interruption), creates nothing and loses nothing."""
from __future__ import annotations

import io
import json
import logging
import re
import signal
import stat
import subprocess
import time

import numpy as np
import pytest
import torch
from PIL import Image

from support import image_tree, run_history
from ssog.cli import main
from ssog.train import load_checkpoint, save_checkpoint, train
from ssog.train.checkpoint import read_checkpoint_info


def _error_line(capsys, command: str = "train", err: str | None = None) -> str:
    """The last line of stderr, which must be the command's one-line error."""
    lines = (capsys.readouterr().err if err is None else err).strip().splitlines()
    assert lines and lines[-1].startswith(f"ssog {command}: error:"), lines
    return lines[-1]


def _image_bytes(seed: int, fmt: str) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def _tiny_args(tiny_config, output) -> list[str]:
    cfg = tiny_config(output)
    args = ["--model", cfg.model, "--img-size", "8", "--epochs", "1", "--batch-size", "4", "--no-progress",
            "--output", str(output)]
    return args + [a for k, v in cfg.model_kwargs.items() for a in ("--set", f"model_kwargs.{k}={v}")]


# ---------------------------------------------------------------- bad settings: nothing is created
@pytest.mark.parametrize("args, message", [
    (["--data-dir", "missing"], "/missing does not exist"),  # imagefolder inferred
    (["--dataset", "digits", "--data-dir", "."], "dataset 'digits' reads no files"),
    (["--set", "lr=[1"], "override 'lr=[1': the value is not valid YAML"),
    (["--img-size", "0"], "img_size must be >= 1"),
    (["--weight-decay", "-1"], "weight_decay must be >= 0"),
    (["--seed", "-1"], "seed (--seed) must be in [0, 4294967295]"),
    (["--seed", "4294967296"], "seed (--seed) must be in [0, 4294967295] (numpy and scikit-learn take 32-bit seeds"),
    (["--lr", "inf"], "lr must be a finite number, got inf"),
    (["--set", "clip_grad=0"], "clip_grad must be > 0 or null"),
    (["--output", "a_file"], "--output a_file is an existing file"),
    (["--output", "a_file/run"], "a_file is a file, not a folder"),
    (["--output", "finished"], "finished already holds a run (best.safetensors): choose another --output"),
    # second round (issue 23): every message names the user's setting
    (["--model", "ssog_vit_digits_patch2_9"],
     "unknown model 'ssog_vit_digits_patch2_9' (--model); did you mean ssog_vit_digits_patch2_8"),
    (["--config", "finished"], "finished is a folder, not a YAML file; give the recipe file itself"),
    (["--data-dir", "a_file"], "a_file is a file, not a folder"),
    (["--val-split", "0.001"], "val_split 0.001 (--val-split) holds out 2 of 1797 images, and a stratified split "
                               "of 10 classes needs at least 10 on each side: give a count in [10, 1787] or a "
                               "fraction in [0.0056, 0.9944]"),
    (["--val-split", "1790"], "val_split 1790 (--val-split) holds out 1790 of 1797 images"),
    (["--set", "model_kwargs.steer=[mu, far]"], "with model_kwargs {'steer': ['mu', 'far']}: cannot steer ['far']"),
    # fourth round (issue 45): nothing a run stores makes a later command read a file; names stay one line
    (["--set", "model_kwargs.checkpoint_path=/etc/hostname"],
     "model_kwargs may not set 'checkpoint_path': it comes from init_from"),
    (["--dataset", "digits\nlicense: evil"], "dataset (--dataset) must be a data source's name"),
])
def test_bad_settings_fail_in_one_line_and_create_nothing(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "finished").mkdir()
    (tmp_path / "finished" / "best.safetensors").write_bytes(b"a best checkpoint without last")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["train", *args]) == 2
    assert message in _error_line(capsys)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "finished" / "best.safetensors").read_bytes() == b"a best checkpoint without last"


def test_malformed_yaml_recipe_names_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("epochs: [1\n")
    assert main(["train", "--config", "bad.yaml"]) == 2
    assert re.search(r"config file \S*bad.yaml is not valid YAML: .* at line 2", _error_line(capsys))
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--img-size", "0"], "img_size must be >= 1, got 0"),
    (["--patch-size", "-2"], "patch_size must be >= 1, got -2"),
    (["--batch-size", "0"], "batch_size must be >= 1, got 0"),
])
def test_eval_refuses_bad_sizes(args, message, tmp_path, capsys):
    assert main(["eval", "--checkpoint", str(tmp_path), *args]) == 2
    assert message in _error_line(capsys, "eval")


# ---------------------------------------------------------------- data
def test_imagefolder_needs_two_classes(tmp_path, monkeypatch, capsys, tiny_config):
    data = image_tree(tmp_path / "data", classes=("only",), per_class=4, size=8)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data-dir", str(data), *_tiny_args(tiny_config, tmp_path / "run")]) == 2
    assert "has 1 class folder (only); classification needs at least 2 classes" in _error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_bad_images_are_refused_by_path_or_skipped_with_a_warning(tmp_path, monkeypatch, capsys, tiny_config):
    data = image_tree(tmp_path / "data", classes=("a", "b"), per_class=4, size=8)
    truncated = data / "train" / "a" / "cut.jpg"
    truncated.write_bytes(_image_bytes(7, "JPEG")[:-20])  # cut inside the scan data
    garbage = data / "val" / "b" / "garbage.png"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    monkeypatch.chdir(tmp_path)
    args = ["train", "--data-dir", str(data), *_tiny_args(tiny_config, tmp_path / "run")]

    assert main(args) == 2
    line = _error_line(capsys)
    assert str(truncated) in line and "truncated JPEG" in line and "--skip-bad-images" in line
    assert not (tmp_path / "run").exists()

    assert main([*args, "--skip-bad-images"]) == 0
    err = capsys.readouterr().err
    for path in (truncated, garbage):
        assert f"warning: skipping unreadable image {path}" in err
    assert "skipped 1 unreadable image(s)" in err
    assert read_checkpoint_info(tmp_path / "run" / "last.safetensors")["progress"]["global_step"] == 2


# ---------------------------------------------------------------- divergence and resume
@pytest.fixture
def one_epoch_run(tmp_path, tiny_config):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1))
    return run


@pytest.mark.parametrize("clip", [None, 1.0])
def test_divergence_keeps_the_last_finite_checkpoint(clip, tmp_path, tiny_config, capsys):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1, clip_grad=clip))
    assert main(["train", "--resume", str(run), "--epochs", "3", "--lr", "1e6"]) == 2
    captured = capsys.readouterr()
    assert "note: lr changed from 0.003 to 1000000.0 on resume" in captured.out
    line = _error_line(capsys, err=captured.err)
    assert re.search(r"training diverged at epoch [23] step \d+: (the loss is nan|parameter \S+ is no longer finite) "
                     r"\(lr 1e\+06\)", line), line
    assert f"the last finite checkpoint {run / 'last.safetensors'} (epoch 1, step 4) is kept" in line
    assert f"ssog train --resume {run} --lr 100000" in line
    assert ("clip_grad" in line) == (clip is None)
    state = load_checkpoint(run / "last.safetensors", only=("model", "progress"))
    assert state["progress"]["global_step"] == 4
    assert all(torch.isfinite(w).all() for w in state["model"].values())


def test_resume_accepts_run_independent_options_and_notes_lr_and_epochs(one_epoch_run, capsys):
    run = str(one_epoch_run)
    assert main(["train", "--resume", run, "--no-progress", "--threads", "1", "--device", "cpu",
                 "--num-workers", "0"]) == 0
    assert "no longer bit-identical" not in capsys.readouterr().out
    assert main(["train", "--resume", run, "--epochs", "2"]) == 0
    assert "note: epochs changed from 1 to 2 on resume: the run is no longer bit-identical" \
        in capsys.readouterr().out
    assert read_checkpoint_info(one_epoch_run / "last.safetensors")["progress"]["epoch"] == 2
    assert main(["train", "--resume", run, "--model", "mha_vit_micro_patch1_8", "--set", "seed=3"]) == 2
    assert "model, seed cannot change (allowed: progress, threads" in _error_line(capsys)
    assert main(["train", "--resume", run, "--epochs", "1"]) == 2
    assert "epochs=1 is fewer than the 2 epochs this run has done" in _error_line(capsys)


def test_non_finite_weights_are_refused_on_load(one_epoch_run, capsys):
    state = load_checkpoint(one_epoch_run / "best.safetensors")
    name = next(iter(state["model"]))
    state["model"][name] = torch.full_like(state["model"][name], float("nan"))
    save_checkpoint(one_epoch_run.parent / "nan.safetensors", state)
    assert main(["eval", "--checkpoint", str(one_epoch_run.parent / "nan.safetensors")]) == 2
    assert f"holds non-finite weights ({state['model'][name].numel()} NaN/inf values in {name})" \
        in _error_line(capsys, "eval")


# ---------------------------------------------------------------- signals (a real process)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_saves_the_step_and_says_how_to_resume(signum, tmp_path, tiny_config, ssog_cli):
    run = tmp_path / "run"
    cfg = tiny_config(run, epochs=1000, checkpoint_every=0)
    with ssog_cli.popen("train", *ssog_cli.config_args(cfg), stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE) as process:
        deadline = time.monotonic() + 600  # a loaded machine can take minutes to import torch
        while not (run / "last.safetensors").exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert (run / "last.safetensors").exists(), "the run saved no checkpoint to interrupt"
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, err[-2000:]
    line = err.strip().splitlines()[-1]
    stopped = re.fullmatch(rf"ssog train: interrupted at epoch (\d+) step (\d+); resume with ssog train --resume {run}",
                           line)
    assert stopped, line
    progress = read_checkpoint_info(run / "last.safetensors")["progress"]
    epoch = progress["epoch"] + (1 if progress["step_in_epoch"] else 0)
    assert (epoch, progress["global_step"]) == (int(stopped.group(1)), int(stopped.group(2)))
    assert "Traceback" not in err


# ================================================================ second round (issue 23)
def _synthetic_args(tiny_config, output) -> list[str]:
    """:func:`_tiny_args` on 32 synthetic images of 4 classes: 8 steps of 4 images per epoch."""
    return [*_tiny_args(tiny_config, output), "--dataset", "synthetic", "--set", "synthetic_size=32",
            "--set", "synthetic_classes=4"]


# ---------------------------------------------------------------- run folders are owned
def test_default_run_folders_never_collide(tmp_path, monkeypatch, capsys, tiny_config):
    from ssog.train import run_folder

    class SameSecond(run_folder.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(run_folder, "datetime", SameSecond)
    monkeypatch.chdir(tmp_path)
    args = [arg for arg in _synthetic_args(tiny_config, "unused") if arg not in ("--output", "unused")]
    assert main(["train", *args]) == 0 and main(["train", *args]) == 0
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(re.fullmatch(r"20260102-030405-[0-9a-f]{6}", name) for name in runs), runs
    assert all((tmp_path / "runs" / name / "last.safetensors").is_file() for name in runs)


def test_a_folder_in_use_by_another_run_is_refused(tmp_path, capsys, tiny_config):
    import os

    from ssog.files import FolderLock

    run = tmp_path / "run"
    run.mkdir()
    with FolderLock(run):  # another training of this machine, alive, holds the folder
        assert main(["train", *_synthetic_args(tiny_config, run)]) == 2
        assert f"{run} is in use by process {os.getpid()} on" in _error_line(capsys)
        assert sorted(p.name for p in run.iterdir()) == [FolderLock.NAME]
    assert main(["train", *_synthetic_args(tiny_config, run)]) == 0
    assert not (run / FolderLock.NAME).exists()  # released at the end


def test_a_users_recipe_in_the_output_folder_is_never_replaced(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    recipe = "# my recipe\nepochs: 1\nvariants:\n  short: {epochs: 1}\n"
    (tmp_path / "config.yaml").write_text(recipe)
    for extra in ([], ["--overwrite"]):
        assert main(["train", "--config", "config.yaml", "--variant", "short", "--output", ".", *extra]) == 2
        assert "--output . holds a config.yaml that is not a run's (a recipe?)" in _error_line(capsys)
        assert (tmp_path / "config.yaml").read_text() == recipe
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_another_runs_files_are_refused_unless_overwrite_which_replaces_only_those(tmp_path, capsys, tiny_config):
    import yaml

    from ssog.train import TrainConfig

    run = tmp_path / "run"
    run.mkdir()
    older_config = yaml.safe_dump(TrainConfig(output=str(run)).to_dict())  # as runs wrote it before its header
    earlier = {"summary.json": "{}", "log.jsonl": "{}\n", "curves.png": "png", "config.yaml": older_config}
    users = {"notes.txt": "mine", "model.tmp": "mine too", ".cache.tmp": "and this"}
    for name, text in {**earlier, **users}.items():
        (run / name).write_text(text)
    assert main(["train", *_synthetic_args(tiny_config, run)]) == 2
    assert (f"{run} already holds a run (config.yaml, log.jsonl, curves.png, summary.json): choose another --output, "
            "or pass --overwrite to replace that run's files") in _error_line(capsys)
    assert all((run / name).read_text() == text for name, text in earlier.items())

    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events").write_text("an earlier run's")
    assert main(["train", *_synthetic_args(tiny_config, run), "--overwrite"]) == 0
    assert all((run / name).read_text() == text for name, text in users.items())
    assert not (run / "tensorboard").exists()  # the earlier run's, and this run writes none
    assert json.loads((run / "summary.json").read_text())["epochs"] == 1
    assert main(["train", "--resume", str(run), "--overwrite"]) == 2
    assert "--overwrite starts a new run" in _error_line(capsys)


def test_a_run_stopped_before_its_first_checkpoint_says_how_to_start_it_again(tmp_path, capsys, tiny_config):
    run = tmp_path / "run"
    assert main(["train", *_synthetic_args(tiny_config, run)]) == 0
    for name in ("last.safetensors", "best.safetensors", "log.jsonl", "log.csv", "curves.png", "summary.json"):
        (run / name).unlink()  # what a run stopped in its first epoch leaves: config, environment, marker
    assert main(["train", "--resume", str(run)]) == 2
    restart = f"--config {run / 'config.yaml'} --output {run} --overwrite"
    assert _error_line(capsys).endswith("so there is nothing to resume (if it still runs, its first checkpoint is to "
                                        f"come); start it again with {restart}")
    assert main(["train", *_synthetic_args(tiny_config, run)]) == 2
    assert (f"{run} already holds a run (config.yaml, environment.json, .ssog-run): that run saved no checkpoint "
            "(last.safetensors is written at every epoch's end, and every --checkpoint-every N optimizer steps), so "
            "it cannot be resumed; choose another --output, or pass --overwrite") in _error_line(capsys)
    assert main(["train", *restart.split(), "--no-progress"]) == 0
    assert json.loads((run / "summary.json").read_text())["epochs"] == 1


def test_only_the_command_line_asks_to_overwrite(tmp_path, capsys, tiny_config):
    import yaml

    run = tmp_path / "run"
    assert main(["train", *_synthetic_args(tiny_config, run), "--overwrite"]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["overwrite"] is True
    # the run's own record of --overwrite, reused as a recipe, replaces nothing
    assert main(["train", "--config", str(run / "config.yaml"), "--no-progress"]) == 2
    assert f"{run} already holds a run" in _error_line(capsys)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("overwrite: true\nepochs: 1\n")
    assert main(["train", "--config", str(recipe), "--output", str(run)]) == 2
    assert _error_line(capsys).endswith(f"{recipe} sets overwrite: true; replacing an earlier run's files is asked "
                                        "for on the command line only (--overwrite)")


def test_checkpoints_get_the_permissions_of_the_other_run_files(tmp_path, tiny_config):
    import os

    old = os.umask(0o022)
    try:
        train(tiny_config(tmp_path / "run", epochs=1))
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "run").iterdir()}
    assert set(modes.values()) == {0o644}, modes
    assert {"last.safetensors", "best.safetensors", "config.yaml", "log.jsonl"} <= set(modes)


# ---------------------------------------------------------------- resources: one line, resumable
def test_a_full_disk_stops_in_one_line_and_the_run_resumes(tmp_path, monkeypatch, capsys, tiny_config):
    import errno

    from ssog.train import checkpoint

    run = tmp_path / "run"
    opened = []

    def disk_full_at_the_second_epoch(path, mode="r", *args, **kwargs):
        opened.append(mode)
        if opened.count("xb") > 2 and mode == "xb":  # best and last of epoch 1 fit
            raise OSError(errno.ENOSPC, "No space left on device")
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", disk_full_at_the_second_epoch, raising=False)
    assert main(["train", *_synthetic_args(tiny_config, run), "--epochs", "2"]) == 2
    line = _error_line(capsys)
    assert re.search(rf"disk full \(ENOSPC\) writing {run}/(best|last).safetensors; the previous file is kept; the "
                     rf"last checkpoint {run}/last.safetensors \(epoch 1, step 8\) is kept; resume it with ssog train "
                     rf"--resume {run}$", line), line
    for name in ("last.safetensors", "best.safetensors"):
        assert read_checkpoint_info(run / name)["progress"]["epoch"] == 1
    assert [row['epoch'] for row in run_history(run)] == [1]
    assert not [p for p in run.iterdir() if "ssog-tmp" in p.name]
    monkeypatch.undo()

    from ssog import files

    def full(path, mode="r", *rest, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "open", full, raising=False)  # still full when resuming
    assert main(["train", "--resume", str(run)]) == 2
    assert _error_line(capsys) == f"ssog train: error: disk full (ENOSPC) writing {run}/config.yaml; the previous " \
                                  "file is kept"
    assert not (run / ".ssog-run.lock").exists()
    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0
    assert [row['epoch'] for row in run_history(run)] == [1, 2]


def test_out_of_memory_stops_in_one_line_and_the_resumed_run_matches(tmp_path, monkeypatch, capsys, tiny_config):
    from ssog.models.vit import ViT

    reference = train(tiny_config(tmp_path / "reference"))
    forward, calls = ViT.forward, []

    def out_of_memory_in_epoch_two(self, x):
        if self.training:
            calls.append(1)
            if len(calls) == 6:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(self, x)

    monkeypatch.setattr(ViT, "forward", out_of_memory_in_epoch_two)
    run = tmp_path / "run"
    with pytest.raises(MemoryError) as caught:
        train(tiny_config(run))
    assert str(caught.value) == (f"out of memory on cpu at epoch 2 step 6 ({tiny_config(run).model}, batch 16, 8px); "
                                 f"the last checkpoint {run}/last.safetensors (epoch 1, step 4) is kept; resume it "
                                 f"with ssog train --resume {run}")
    monkeypatch.undo()
    resumed = train(resume=run)  # nothing of the failed step was kept: exactly the uninterrupted run
    assert {k: resumed[k] for k in ("acc1", "loss", "train_loss")} == \
        {k: reference[k] for k in ("acc1", "loss", "train_loss")}


def test_a_failing_plot_loses_no_checkpoint_and_a_bad_mplbackend_stops_at_once(tmp_path, monkeypatch, capsys,
                                                                               tiny_config, run_child, ssog_cli):
    from ssog.train import logger

    def broken(history, path):
        raise ValueError("matplotlib failed")

    monkeypatch.setattr(logger, "plot_curves", broken)
    run = tmp_path / "run"
    assert main(["train", *_synthetic_args(tiny_config, run)]) == 2
    assert "matplotlib failed" in _error_line(capsys)
    assert read_checkpoint_info(run / "last.safetensors")["progress"]["epoch"] == 1

    # matplotlib reads MPLBACKEND when imported, so this needs a fresh process
    env = {**ssog_cli.env(), "MPLBACKEND": "nonsense"}
    result = run_child(ssog_cli.command("train", "--epochs", "1", "--output", str(tmp_path / "other")), 300,
                       env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert ("ssog train: error: MPLBACKEND='nonsense' is not a matplotlib backend, and matplotlib does not import "
            "with it; unset MPLBACKEND") in result.stderr
    assert not (tmp_path / "other").exists()


# ---------------------------------------------------------------- results are never replaced unasked
def test_eval_output_never_replaces_a_file_unasked_nor_leaves_a_partial_one(one_epoch_run, monkeypatch, capsys):
    import errno

    from ssog import files

    earlier = one_epoch_run.parent / "earlier.json"
    earlier.write_text("{}")
    args = ["eval", "--checkpoint", str(one_epoch_run), "--output", str(earlier)]
    assert main(args) == 2
    assert f"{earlier} already exists (--output); pass --overwrite" in _error_line(capsys, "eval")
    assert earlier.read_text() == "{}"
    assert main([*args, "--overwrite"]) == 0
    assert json.loads(earlier.read_text())["checkpoint"] == str(one_epoch_run / "best.safetensors")

    def full(path, mode="r", *rest, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "open", full, raising=False)
    metrics = one_epoch_run.parent / "metrics.json"
    assert main(["eval", "--checkpoint", str(one_epoch_run), "--output", str(metrics)]) == 2
    assert f"disk full (ENOSPC) writing {metrics}; nothing was written" in _error_line(capsys, "eval")
    assert not metrics.exists() and not list(one_epoch_run.parent.glob(".metrics*"))


def test_eval_output_writes_into_a_pipe_and_through_a_link_never_replacing_them(one_epoch_run, capsys):
    import os
    import threading

    fifo = one_epoch_run.parent / "metrics.fifo"  # as /dev/stdout or /dev/null: what is written is passed on
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    assert main(["eval", "--checkpoint", str(one_epoch_run), "--output", str(fifo)]) == 0
    reader.join(timeout=60)
    assert json.loads(received[0])["checkpoint"] == str(one_epoch_run / "best.safetensors")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)

    kept = one_epoch_run.parent / "kept"
    kept.mkdir()
    (kept / "metrics.json").write_text("{}")
    link = one_epoch_run.parent / "metrics.json"
    link.symlink_to(kept / "metrics.json")
    assert main(["eval", "--checkpoint", str(one_epoch_run), "--output", str(link)]) == 2
    assert "already exists (--output); pass --overwrite" in _error_line(capsys, "eval")
    assert main(["eval", "--checkpoint", str(one_epoch_run), "--output", str(link), "--overwrite"]) == 0
    assert link.is_symlink() and json.loads((kept / "metrics.json").read_text())["acc1"] >= 0
    (one_epoch_run.parent / "to_summary.json").symlink_to(one_epoch_run / "summary.json")  # a run's file, by a link
    assert main(["eval", "--checkpoint", str(one_epoch_run), "--output", str(one_epoch_run.parent / "to_summary.json"),
                 "--overwrite"]) == 2
    assert "is a file of the run in" in _error_line(capsys, "eval")


@pytest.mark.slow
def test_bench_and_analyze_refuse_earlier_results_before_working(tmp_path, monkeypatch, capsys):
    from ssog.bench import sweep

    bench_args = ["bench", "--size", "micro", "--families", "vit", "--resolutions", "4", "--batch-sizes", "1",
                  "--width-sizes", "--warmup", "1", "--iters", "1", "--device", "cpu", "--no-plots",
                  "--output", str(tmp_path)]
    assert main(bench_args) == 0
    stale = tmp_path / "fig1_width.png"
    stale.write_text("a figure of an earlier sweep")
    (tmp_path / "notes.md").write_text("the user's")
    monkeypatch.setattr(sweep, "run_model_sweep", lambda *a, **k: pytest.fail("measured before refusing"))
    assert main(bench_args) == 2
    assert "already exist (results of an earlier ssog bench); pass --overwrite" in _error_line(capsys, "bench")
    monkeypatch.undo()
    assert main([*bench_args, "--overwrite"]) == 0
    assert not stale.exists() and (tmp_path / "notes.md").exists() and (tmp_path / "results.json").exists()

    analyze = ["analyze", "kernels", "--model", "ssog_vit_micro_patch1_8", "--output", str(tmp_path / "a")]
    assert main(analyze) == 0
    assert main(analyze) == 2
    line = _error_line(capsys, "analyze")
    assert "kernels.json" in line and "(results of an earlier ssog analyze kernels); pass --overwrite" in line
    assert main([*analyze, "--overwrite"]) == 0


def test_export_refuses_an_existing_file_and_a_negative_class_count(tmp_path, capsys):
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"an earlier export")
    assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--output", str(onnx)]) == 2
    assert f"{onnx} already exists (--output); pass --overwrite" in _error_line(capsys, "export")
    assert onnx.read_bytes() == b"an earlier export"
    new = tmp_path / "new.onnx"
    for command in (["export", "--model", "ssog_vit_micro_patch1_8", "--output", str(new)],
                    ["info", "ssog_vit_micro_patch1_8"]):
        assert main([*command, "--num-classes", "-3"]) == 2
        assert "--num-classes must be >= 0 (0: no classifier" in _error_line(capsys, command[0])
    assert not new.exists()


# ---------------------------------------------------------------- messages name the setting
def test_steer_given_as_one_name_and_a_linear_probe_without_init_from(tmp_path, capsys, tiny_config):
    run = tmp_path / "run"
    assert main(["train", *_synthetic_args(tiny_config, run), "--set", "model_kwargs.steer=mu", "--linear-probe"]) == 0
    assert "warning: --linear-probe without --init-from trains a classifier on a randomly initialised, frozen " \
           "backbone" in capsys.readouterr().err
    weights = load_checkpoint(run / "best.safetensors", only=("model",))["model"]
    assert any(".steer_proj.mu." in name for name in weights) and not any("steer_proj.sigma" in n for n in weights)


@pytest.mark.slow
def test_a_timm_model_without_img_size_trains_and_evaluates(tmp_path, capsys, tiny_config):
    run = tmp_path / "run"
    assert main(["train", "--model", "test_resnet", "--dataset", "synthetic", "--set", "synthetic_size=32",
                 "--set", "synthetic_classes=4", "--img-size", "8", "--epochs", "1", "--batch-size", "4",
                 "--no-progress", "--output", str(run)]) == 0
    assert main(["eval", "--checkpoint", str(run)]) == 0
    assert "test_resnet on synthetic val (8 images, 8px): Acc@1" in capsys.readouterr().out
    from ssog.export import missing_export_packages

    if not missing_export_packages():  # exported at the size it trained at (it has no patch embedding to ask)
        assert main(["export", "--checkpoint", str(run), "--output", str(tmp_path / "cnn.onnx")]) == 0
        assert "input (batch, 3, 8, 8)" in capsys.readouterr().out


def test_eval_names_patch_size_and_a_run_folder_without_best(one_epoch_run, capsys):
    assert main(["eval", "--checkpoint", str(one_epoch_run), "--patch-size", "64"]) == 2
    assert "--patch-size 64 is larger than the 8px image; choose a patch size of at most 8" \
        in _error_line(capsys, "eval")
    only_last = one_epoch_run.parent / "stopped"
    only_last.mkdir()
    (only_last / "last.safetensors").write_bytes((one_epoch_run / "last.safetensors").read_bytes())
    assert main(["eval", "--checkpoint", str(only_last)]) == 2
    assert (f"the run folder {only_last} has no best.safetensors (it holds last.safetensors); pass one of those "
            f"files, e.g. {only_last / 'last.safetensors'}") in _error_line(capsys, "eval")
    assert main(["eval", "--checkpoint", str(only_last / "last.safetensors")]) == 0


def test_seed_beyond_32_bits_is_refused_not_wrapped():
    from ssog.train import TrainConfig

    TrainConfig(seed=2**32 - 1)
    for field in ("seed", "split_seed"):
        with pytest.raises(ValueError, match=rf"{field}.* must be in \[0, 4294967295\]"):
            TrainConfig(**{field: 2**32})


@pytest.fixture
def cpp_switch(monkeypatch):
    """Set SSOG_CPP for one test; the cpp backend's cached availability follows it."""
    from ssog.ops import cpp_kernels

    def clear():
        cpp_kernels._library.cache_clear()
        cpp_kernels.head_dims.cache_clear()

    def switch(value: str):
        monkeypatch.setenv("SSOG_CPP", value)
        clear()
        return cpp_kernels

    yield switch
    monkeypatch.undo()
    clear()


def test_ssog_cpp_accepts_false_and_warns_on_nonsense(cpp_switch, caplog):
    for value in ("false", "No", "OFF", "0"):
        assert not cpp_switch(value).available()
        assert cpp_switch(value).unavailable_reason() == f"disabled by SSOG_CPP={value}"
    with caplog.at_level(logging.WARNING, logger="ssog.ops.cpp_kernels"):
        assert not cpp_switch("maybe").available()
    assert [r.levelno for r in caplog.records if "SSOG_CPP='maybe' is not 0/1" in r.getMessage()] == [logging.WARNING]


OP_TINY = ["bench-op", "--grids", "2", "--batch", "1", "--heads", "1", "--head-dim", "8", "--atoms", "1",
           "--rounds", "1", "--warmup", "1", "--forward-only", "--steered-grid", "0"]


def test_bench_op_names_a_backend_or_device_it_cannot_use(tmp_path, capsys, cpp_switch):
    args = [*OP_TINY, "--device", "cpu", "--output", str(tmp_path)]
    assert main([*args, "--backends", "triton"]) == 2
    assert "--backends triton cannot run here: it needs a CUDA device and the triton package (device cpu)" \
        in _error_line(capsys, "bench-op")
    cpp_switch("false")
    assert main([*args, "--backends", "cpp", "dense"]) == 2
    assert "--backends cpp cannot run here: disabled by SSOG_CPP=false" in _error_line(capsys, "bench-op")
    assert not list(tmp_path.iterdir())
    assert main(args) == 0  # every backend that can run, and a note for the others
    out = capsys.readouterr().out
    assert "note: not timing cpp: disabled by SSOG_CPP=false" in out and "note: not timing triton" in out
    if not torch.cuda.is_available():
        assert main([*OP_TINY, "--device", "cuda", "--output", str(tmp_path / "gpu")]) == 2
        assert "device 'cuda' requested but CUDA is not available on this machine; use --device cpu" \
            in _error_line(capsys, "bench-op")


def test_flops_at_any_size_is_quick_or_one_line(capsys):
    assert main(["flops", "ssog_vit_micro_patch1_8", "--img-size", "100000"]) == 0
    assert "(10000000000 tokens)" in capsys.readouterr().out
    assert main(["flops", "mha_vit_micro_patch1_8", "--img-size", "100000"]) == 2
    assert "--img-size 100000: a tensor of mha_vit_micro_patch1_8 at this size has more elements than PyTorch " \
           "can count" in _error_line(capsys, "flops")


def _allocations_fail_fast() -> bool:
    """Whether a request for far more memory than the machine has fails at once (Linux's default
    heuristic overcommit) rather than being granted and then killing the process."""
    try:
        with open("/proc/sys/vm/overcommit_memory") as mode:
            return mode.read().strip() in ("0", "2")
    except OSError:
        return False


@pytest.mark.skipif(not _allocations_fail_fast(), reason="needs an allocator that refuses impossible requests")
def test_an_impossible_image_size_is_one_line_or_an_oom_point(one_epoch_run, tmp_path, capsys):
    assert main(["train", "--img-size", "100000", "--epochs", "1", "--output", str(tmp_path / "huge")]) == 2
    assert re.search(r"out of memory on cpu preparing ssog_vit_digits_patch2_8 and its data at img_size 100000 "
                     r"with batch_size 64; lower --img-size or --batch-size$", _error_line(capsys))
    assert not (tmp_path / "huge").exists()
    assert main(["eval", "--checkpoint", str(one_epoch_run), "--img-size", "100000"]) == 2
    assert "out of memory on cpu evaluating ssog_vit_micro_patch1_8 at 100000px (--img-size)" \
        in _error_line(capsys, "eval")
    assert main(["bench", "--size", "micro", "--families", "vit", "--resolutions", "8", "1000000",
                 "--batch-sizes", "1", "--width-sizes", "--warmup", "1", "--iters", "1", "--device", "cpu",
                 "--no-plots", "--output", str(tmp_path / "bench")]) == 0
    rows = json.loads((tmp_path / "bench" / "results.json").read_text())["rows"]
    assert [(row["resolution"], row["status"]) for row in rows] == [(8, "ok")] * 2 + [(1000000, "oom")] * 2


# ================================================================ fourth round (issue 45)
# ---------------------------------------------------------------- files owned by a run
@pytest.mark.parametrize("name, message", [
    ("best.safetensors", "is the file this command reads"),
    ("summary.json", "is a file of the run in {run}, which is never replaced"),
    ("config.yaml", "is a file of the run in {run}, which is never replaced"),
    ("tensorboard/events.json", "is a file of the run in {run}, which is never replaced"),
])
def test_eval_never_writes_over_a_file_the_run_owns_or_reads(name, message, one_epoch_run, capsys):
    owned = one_epoch_run / name
    before = owned.read_bytes() if owned.exists() else None
    assert main(["eval", "--checkpoint", str(one_epoch_run), "--output", str(owned), "--overwrite"]) == 2
    assert f"--output {owned} {message.format(run=one_epoch_run)}" in _error_line(capsys, "eval")
    assert (owned.read_bytes() if owned.exists() else None) == before
    copy = one_epoch_run.parent / "copy.safetensors"
    copy.write_bytes((one_epoch_run / "best.safetensors").read_bytes())
    assert main(["eval", "--checkpoint", str(copy), "--output", str(copy), "--overwrite"]) == 2
    assert f"--output {copy} is the file this command reads" in _error_line(capsys, "eval")
    assert copy.read_bytes() == (one_epoch_run / "best.safetensors").read_bytes()


def test_export_never_writes_over_the_checkpoint_it_reads(one_epoch_run, capsys):
    best = one_epoch_run / "best.safetensors"
    before = best.read_bytes()
    assert main(["export", "--checkpoint", str(one_epoch_run), "--output", str(best), "--overwrite"]) == 2
    assert f"--output {best} is the file this command reads" in _error_line(capsys, "export")
    assert main(["export", "--checkpoint", str(one_epoch_run), "--output", " "]) == 2
    assert "--output is empty" in _error_line(capsys, "export")
    assert best.read_bytes() == before


def test_the_dry_run_report_refuses_an_existing_file_unless_overwrite(tmp_path, monkeypatch, capsys, tiny_config):
    from ssog.train import dry_run

    monkeypatch.chdir(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's notes")
    args = ["train", *_synthetic_args(tiny_config, tmp_path / "run"), "--dry-run", "1"]
    with monkeypatch.context() as patch:
        patch.setattr(dry_run, "dry_run", lambda *a, **k: pytest.fail("measured before refusing"))
        assert main([*args, "--dry-run-report", str(notes)]) == 2
        assert f"{notes} already exists (--dry-run-report); pass --overwrite to replace, or choose another " \
               "--dry-run-report" in _error_line(capsys)
        assert main([*args, "--dry-run-report", ""]) == 2
        assert "--dry-run-report is empty" in _error_line(capsys)
        assert main([*args, "--dry-run-report", str(tmp_path), "--overwrite"]) == 2
        assert f"--dry-run-report {tmp_path} is a folder, not a file; give the file to write" in _error_line(capsys)
        assert main([*args, "--dry-run-report", str(tmp_path / "reports" / "r.json")]) == 2
        assert f"its folder {tmp_path / 'reports'} does not exist; create it" in _error_line(capsys)
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text("epochs: 1\n")
        assert main([*args, "--config", str(recipe), "--dry-run-report", str(recipe), "--overwrite"]) == 2
        assert f"--dry-run-report {recipe} is the file this command reads" in _error_line(capsys)
        assert recipe.read_text() == "epochs: 1\n"
    assert notes.read_text() == "the user's notes"
    assert main([*args, "--dry-run-report", str(notes), "--overwrite"]) == 0
    assert json.loads(notes.read_text())["steps_timed"] == 1


def test_a_run_whose_folder_is_removed_stops_without_recreating_it(tmp_path, monkeypatch, capsys, tiny_config):
    import shutil

    from ssog.train.engine import Trainer

    run = tmp_path / "run"
    end_epoch = Trainer._end_epoch

    def removed(self):
        shutil.rmtree(run)
        return end_epoch(self)

    monkeypatch.setattr(Trainer, "_end_epoch", removed)
    assert main(["train", *_synthetic_args(tiny_config, run)]) == 2
    assert f"the run folder {run} (or its lock .ssog-run.lock) was removed while the run trained; stopped without " \
           "writing there" in _error_line(capsys)
    assert not run.exists()


def test_a_run_whose_lock_is_taken_over_stops_and_leaves_the_new_owners_lock(tmp_path, monkeypatch, capsys,
                                                                             tiny_config):
    from ssog.files import FolderLock
    from ssog.train.engine import Trainer

    run = tmp_path / "run"
    end_epoch = Trainer._end_epoch
    other = json.dumps({"pid": 4242, "host": "node17", "started": "later", "heartbeat_s": 60})

    def taken_over(self):  # its machine was thought lost, and a run on another took the folder over
        (run / FolderLock.NAME).write_text(other)
        return end_epoch(self)

    monkeypatch.setattr(Trainer, "_end_epoch", taken_over)
    assert main(["train", *_synthetic_args(tiny_config, run)]) == 2
    assert f"the run folder {run} (or its lock .ssog-run.lock) was taken over by another process while the run " \
           "trained; stopped without writing there" in _error_line(capsys)
    assert not (run / "last.safetensors").exists()
    assert (run / FolderLock.NAME).read_text() == other  # released: its own lock only


def test_a_full_disk_while_claiming_leaves_no_lock(tmp_path, monkeypatch, capsys, tiny_config):
    import errno
    import os

    from ssog import files

    run = tmp_path / "run"
    run.mkdir()
    real_write = os.write

    def full(descriptor, data):
        if b'"what": "training run"' in data:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(descriptor, data)

    with monkeypatch.context() as patch:
        patch.setattr(files.os, "write", full)
        assert main(["train", *_synthetic_args(tiny_config, run)]) == 2
        assert f"cannot write the run folder {run}: No space left on device" in _error_line(capsys)
    assert list(run.iterdir()) == []
    assert main(["train", *_synthetic_args(tiny_config, run)]) == 0


# ---------------------------------------------------------------- stored configs are data, not instructions
@pytest.mark.parametrize("model_kwargs, named", [
    ({"checkpoint_path": "SECRET"}, "model_kwargs.checkpoint_path"),
    ({"pretrained_cfg_overlay": {"file": "SECRET"}}, "model_kwargs.pretrained_cfg_overlay"),
    ({"pretrained": True}, "model_kwargs.pretrained"),
    ({"mixer_options": {"weights": "https://example.com/w.pth"}}, "model_kwargs.mixer_options.weights"),
])
def test_a_stored_config_naming_a_file_is_refused_before_anything_opens_it(model_kwargs, named, one_epoch_run,
                                                                          tmp_path, capsys, monkeypatch):
    secret = tmp_path / "secret.pth"
    secret.write_bytes(b"never read")
    state = load_checkpoint(one_epoch_run / "last.safetensors")
    state["config"]["model_kwargs"] = json.loads(json.dumps(model_kwargs).replace("SECRET", str(secret)))
    forged = tmp_path / "forged" / "last.safetensors"
    save_checkpoint(forged, state)
    save_checkpoint(forged.with_name("best.safetensors"), {**state, "kind": "best"})
    monkeypatch.setattr("timm.create_model", lambda *a, **k: pytest.fail("a model was built"))
    for command in (["eval", "--checkpoint", str(forged.parent)], ["train", "--resume", str(forged.parent)],
                    ["train", "--init-from", str(forged.parent), "--output", str(tmp_path / "new")],
                    ["export", "--format", "hf", "--checkpoint", str(forged.parent), "--output", str(tmp_path / "hf")]):
        assert main(command) == 2
        assert f"its stored config sets {named}, which names a file or URL to read" in _error_line(capsys, command[0])
    assert not (tmp_path / "new").exists() and not (tmp_path / "hf").exists()


@pytest.mark.parametrize("config, message", [
    ([1, 2], "its stored config is a list, not a mapping"),
    ("epochs: 3", "its stored config is a str, not a mapping"),
    ({"model_kwargs": [1]}, "its stored model_kwargs are a list, not a mapping"),
])
def test_a_stored_config_that_is_not_a_mapping_is_one_line(config, message, one_epoch_run, tmp_path, capsys):
    state = load_checkpoint(one_epoch_run / "best.safetensors")
    state["config"] = config
    forged = save_checkpoint(tmp_path / "forged.safetensors", state)
    for command in (["eval", "--checkpoint", str(forged)], ["train", "--resume", str(forged)]):
        assert main(command) == 2
        assert f"checkpoint {forged} is corrupt: {message}" in _error_line(capsys, command[0])


# ---------------------------------------------------------------- corrupt headers: one line, no hang
def _forged_headers(folder) -> dict[str, object]:
    import struct

    folder.mkdir(exist_ok=True)
    nested = b"[" * 200_000 + b"]" * 200_000
    files = {
        "overflow": struct.pack("<Q", 2**63 + 5) + b"{}",
        "beyond the file": struct.pack("<Q", 10**9) + b"{}",
        "nested": struct.pack("<Q", len(nested)) + nested,
        "text": b"hello, this is not a checkpoint at all",
    }
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name.replace(' ', '_')}.safetensors"
        paths[name].write_bytes(data)
    paths["timm .pth.tar"] = folder / "model.pth.tar"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, paths["timm .pth.tar"])
    return paths


def test_corrupt_checkpoint_headers_are_one_line(tmp_path, capsys):
    for kind, path in _forged_headers(tmp_path / "bad").items():
        with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(path))} is truncated or not a safetensors "
                                             r"file \((its header claims [\d,]+ bytes of a [\d,]+-byte file|JSON "
                                             r"nested too deeply)\)"):
            load_checkpoint(path)
        assert main(["train", "--resume", str(path)]) == 2, kind
        assert f"checkpoint {path} is truncated or not a safetensors file" in _error_line(capsys)
        assert main(["train", "--init-from", str(path), "--epochs", "1", "--output", str(tmp_path / "r")]) == 2
        assert f"init_from {path}: cannot read the model it was trained as" in _error_line(capsys)
        assert main(["eval", "--checkpoint", str(path)]) == 2
        _error_line(capsys, "eval")
    assert not (tmp_path / "r").exists()


def test_a_state_nested_too_deeply_in_the_metadata_is_one_line(one_epoch_run, tmp_path):
    from safetensors.torch import save_file

    from ssog.train.checkpoint import FORMAT

    path = tmp_path / "deep.safetensors"
    save_file({"x": torch.zeros(1)}, str(path),
              metadata={"ssog_format": FORMAT, "ssog_state": "[" * 100_000 + "]" * 100_000})
    with pytest.raises(ValueError, match="has no readable ssog state in its metadata"):
        load_checkpoint(path)
    save_file({"x": torch.zeros(1)}, str(path), metadata={"ssog_format": FORMAT, "ssog_state": "[1, 2]"})
    with pytest.raises(ValueError, match="its ssog state is a list, not a mapping"):
        load_checkpoint(path)


# ---------------------------------------------------------------- YAML size
def _alias_bomb(levels: int) -> str:
    lines = ["x0: &a0 [v, v, v, v, v, v, v, v, v, v]"]
    lines += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "model_kwargs:\n" + "".join(f"  {line}\n" for line in lines)


def test_yaml_aliases_that_expand_beyond_a_recipe_are_refused_at_once(tmp_path, capsys):
    from ssog.train.recipes import MAX_YAML_VALUES, read_yaml_values

    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(_alias_bomb(9))  # a billion values once expanded
    bomb = "[" + ", ".join(f"&a{i} [{', '.join([f'*a{i - 1}'] * 10) if i else 'v'}]" for i in range(9)) + "]"
    start = time.monotonic()
    assert main(["train", "--config", str(recipe)]) == 2
    assert f"with its aliases expanded the YAML holds more than {MAX_YAML_VALUES:,} values" in _error_line(capsys)
    assert main(["train", "--set", f"model_kwargs.depth={bomb}"]) == 2
    assert f"the value is not valid YAML (with its aliases expanded the YAML holds more than {MAX_YAML_VALUES:,}" \
        in _error_line(capsys)
    assert main(["train", "--set", "model_kwargs.depth=&a [*a]"]) == 2
    assert "the YAML refers to itself" in _error_line(capsys)
    assert time.monotonic() - start < 60
    assert read_yaml_values("a: &x {b: 1}\nc: *x\n") == {"a": {"b": 1}, "c": {"b": 1}}  # aliases themselves are fine


# ---------------------------------------------------------------- one line instead of a traceback or a hang
@pytest.mark.parametrize("environment, message", [
    ({"WORLD_SIZE": "0"}, "the environment variable WORLD_SIZE='0' must be a whole number >= 1"),
    ({"WORLD_SIZE": "2", "RANK": "abc"}, "the environment variable RANK='abc' must be a whole number >= 0"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 must be below WORLD_SIZE=2"),
    ({"LOCAL_RANK": "-1"}, "the environment variable LOCAL_RANK='-1' must be a whole number >= 0"),
])
def test_torchrun_variables_that_make_no_sense_are_one_line(environment, message, tmp_path, monkeypatch, capsys,
                                                            tiny_config):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main(["train", *_synthetic_args(tiny_config, tmp_path / "run")]) == 2
    assert message in _error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_export_refuses_an_image_size_beyond_the_machines_memory_before_allocating(tmp_path, monkeypatch, capsys):
    from ssog.export import missing_export_packages

    if missing_export_packages():
        pytest.skip("needs the export extra")
    monkeypatch.setattr("ssog.runtime.available_memory_bytes", lambda: 2**30)
    monkeypatch.setattr(torch, "randn", lambda *a, **k: pytest.fail("allocated before refusing"))
    assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--img-size", "20000",
                 "--output", str(tmp_path / "big.onnx")]) == 2
    assert re.search(r"exporting at 20000x20000 px \(--img-size\) needs at least [\d.]+ GiB, more than the 1 GiB "
                     r"this machine has available; lower --img-size or --batch-size$", _error_line(capsys, "export"))
    for output_format in ("onnx", "hf"):
        assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--format", output_format, "--output", ""]) == 2
        assert "--output is empty" in _error_line(capsys, "export")
    assert list(tmp_path.iterdir()) == []
