"""What timm's train.py users expect of the trainer: gradient accumulation (with exact resume),
layer-wise lr decay, timm's schedules, per-step logging, W&B run ids, environment.json, and
curves readable after one epoch."""
import importlib.metadata
import json
import platform
import re
import subprocess
from pathlib import Path

import pytest
import torch

from support import crash_after_save, run_history
from ssog.train import evaluate_checkpoint, load_checkpoint, train
from ssog.train import api as api_module
from ssog.train import builders as builders_module
from ssog.train import engine as engine_module
from ssog.train import logger as logger_module
from ssog.train.checkpoint import read_checkpoint_info
from ssog.train.logger import WANDB_ID_FILE, curves_figure

REPO = Path(__file__).resolve().parents[2]
METRICS = ("train_loss", "val_loss", "acc1", "acc3", "acc5", "lr", "step", "grad_norm")


def _metrics(run):
    return [{k: r[k] for k in METRICS} for r in run_history(run)]


def test_grad_accumulation_takes_the_same_steps_as_one_batch(tmp_path, tiny_config):
    """Two micro-batches of 8 per step give the update of one batch of 16 (the loss of each is
    divided by the number of micro-batches)."""
    options = dict(epochs=1, label_smoothing=0.0, clip_grad=None)
    whole = train(tiny_config(tmp_path / "whole", **options))
    accumulated = train(tiny_config(tmp_path / "accum", grad_accum_steps=2, **options))
    assert whole["steps"] == accumulated["steps"] == 4
    a = load_checkpoint(tmp_path / "whole" / "last.safetensors", only=("model",))["model"]
    b = load_checkpoint(tmp_path / "accum" / "last.safetensors", only=("model",))["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=2e-5, rtol=1e-4, msg=name)
    # evaluation accumulates nothing: its --batch-size is the images at once, whatever the run's grad_accum_steps
    assert evaluate_checkpoint(tmp_path / "accum", batch_size=5, progress=False)["samples"] == 16
    with pytest.raises(ValueError, match="divisible by the number of processes 1 x grad_accum_steps 3"):
        train(tiny_config(tmp_path / "bad", grad_accum_steps=3))


@pytest.mark.slow
def test_resume_with_grad_accumulation_reproduces_uninterrupted_run(tmp_path, monkeypatch, tiny_config):
    """Checkpoints fall on optimizer-step boundaries; a resume from one (mid-epoch, with mixup,
    drop-path and EMA drawing random numbers) ends exactly as the uninterrupted run."""
    options = dict(epochs=2, augment="strong", drop_path=0.1, ema_decay=0.9, checkpoint_every=3, grad_accum_steps=2)
    reference = train(tiny_config(tmp_path / "ref", **options))
    crash_after_save(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(tmp_path / "run", **options))
    monkeypatch.undo()
    progress = read_checkpoint_info(tmp_path / "run" / "last.safetensors")["progress"]
    assert (progress["epoch"], progress["step_in_epoch"], progress["global_step"]) == (0, 3, 3)
    resumed = train(resume=tmp_path / "run")
    assert _metrics(tmp_path / "run") == _metrics(tmp_path / "ref")
    for key in ("acc1", "loss", "ema_acc1", "train_loss", "steps"):
        assert resumed[key] == reference[key], key


def test_layer_decay_scales_the_lr_per_group(tmp_path, tiny_config):
    train(tiny_config(tmp_path / "run", epochs=1, layer_decay=0.5))
    groups = load_checkpoint(tmp_path / "run" / "last.safetensors", only=("optimizer",))["optimizer"]["param_groups"]
    scales = sorted({group["lr_scale"] for group in groups})
    assert scales == [0.5 ** k for k in (3, 2, 1, 0)]  # stem, 2 blocks, head (timm's group_matcher order)
    assert run_history(tmp_path / "run")[0]["lr"] == max(group["lr"] for group in groups)


@pytest.mark.slow
def test_timm_schedules(tmp_path, monkeypatch, tiny_config):
    options = dict(epochs=2, warmup_epochs=0, lr=1e-2)
    train(tiny_config(tmp_path / "step", sched="step", decay_epochs=1, decay_rate=0.5, **options))
    assert [r["lr"] for r in run_history(tmp_path / "step")] == pytest.approx([5e-3, 2.5e-3])
    train(tiny_config(tmp_path / "multi", sched="multistep", decay_milestones=[1], decay_rate=0.1, **options))
    assert [r["lr"] for r in run_history(tmp_path / "multi")] == pytest.approx([1e-3, 1e-3])
    # plateau: stepped at epoch ends on validation Acc@1; patience 0 decays after an epoch without
    # gain, here every epoch after the first (the same Acc@1 each time); an improving loss does not count
    losses = iter([3.0, 2.0, 1.0])
    monkeypatch.setattr(engine_module, "evaluate",
                        lambda *args, **kwargs: {"loss": next(losses), "acc1": 50.0, "acc3": 70.0, "acc5": 90.0})
    train(tiny_config(tmp_path / "plateau", sched="plateau", patience_epochs=0, decay_rate=0.5,
                      **{**options, "epochs": 3}))
    assert [r["lr"] for r in run_history(tmp_path / "plateau")] == pytest.approx([1e-2, 1e-2, 5e-3])
    losses = iter([3.0, 2.0])  # plateau_mode min watches the validation loss, which improves every epoch
    train(tiny_config(tmp_path / "plateau_min", sched="plateau", patience_epochs=0, decay_rate=0.5,
                      sched_kwargs={"plateau_mode": "min"}, **options))
    assert [r["lr"] for r in run_history(tmp_path / "plateau_min")] == pytest.approx([1e-2] * 2)
    monkeypatch.undo()
    # cooldown epochs are trained after `epochs`, at min_lr
    summary = train(tiny_config(tmp_path / "cool", cooldown_epochs=1, **{**options, "epochs": 1}))
    assert summary["epochs"] == 2 and run_history(tmp_path / "cool")[1]["lr"] == pytest.approx(1e-5)
    with pytest.raises(ValueError, match="sched must be one of"):
        tiny_config(tmp_path / "x", sched="linear")
    with pytest.raises(ValueError, match="sched_kwargs .* unexpected keyword"):
        train(tiny_config(tmp_path / "y", sched_kwargs={"gamma": 2}))
    with pytest.raises(ValueError, match="sched_kwargs may not set \\['decay_rate'\\]"):
        tiny_config(tmp_path / "z", sched_kwargs={"decay_rate": 2})


def test_an_unset_decay_epochs_is_left_to_timm(tmp_path, monkeypatch, tiny_config):
    # timm before 1.0.31 multiplies decay_epochs by the updates per epoch without a None check
    seen = []
    real = builders_module.create_scheduler_v2
    monkeypatch.setattr(builders_module, "create_scheduler_v2", lambda *args, **kwargs: seen.append(kwargs) or real(
        *args, **kwargs))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    builders_module.build_scheduler(optimizer, tiny_config(tmp_path / "a"), 4)
    builders_module.build_scheduler(optimizer, tiny_config(tmp_path / "b", sched="step", decay_epochs=1), 4)
    assert "decay_epochs" not in seen[0] and seen[1]["decay_epochs"] == 1


class FakeWriter:
    """TensorBoard's SummaryWriter as the run calls it."""

    instances = []

    def __init__(self, log_dir, purge_step=None):
        self.log_dir, self.purge_step, self.scalars = log_dir, purge_step, []
        FakeWriter.instances.append(self)

    def add_scalar(self, key, value, step):
        self.scalars.append((key, step))

    def flush(self):
        pass

    def close(self):
        pass


class FakeWandb:
    """The wandb module as the run calls it: init(...) returns a run with log and finish."""

    def __init__(self):
        self.inits, self.logged = [], []

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, scalars, step):
        self.logged.append((step, sorted(scalars)))

    def finish(self):
        pass


@pytest.mark.slow
def test_per_step_logging_wandb_ids_and_progress_lines(tmp_path, monkeypatch, tiny_config, ssog_log):
    wandb = FakeWandb()

    def backends(tensorboard, wandb_project):
        return (FakeWriter if tensorboard else None), (wandb if wandb_project else None)

    monkeypatch.setattr(logger_module, "logging_backends", backends)
    monkeypatch.setattr(api_module, "logging_backends", backends)
    options = dict(epochs=2, log_every=2, tensorboard=True, wandb_project="ssog-tests", progress=True)
    train(tiny_config(tmp_path / "a" / "base", **options))
    writer = FakeWriter.instances[-1]
    steps = sorted({step for key, step in writer.scalars if key == "train/loss"})
    assert steps == [2, 4, 6, 8] and ("acc1", 4) in writer.scalars and ("acc1", 8) in writer.scalars
    assert {key for key, _ in writer.scalars} >= {"train/lr", "train/images_per_s", "epoch", "val_loss"}
    assert [step for step, _ in wandb.logged] == sorted(step for step, _ in wandb.logged)  # W&B needs order
    # a plain line every 2 steps when stderr is not a terminal (pytest captures it)
    lines = re.findall(r"epoch (\d)/2 step (\d)/4 \(step (\d)\): loss [\d.]+, lr", ssog_log.text)
    assert [int(step) for *_, step in lines] == [2, 4, 6, 8]

    # W&B ids: unique per run folder, even with the same folder name; kept for --resume only
    train(tiny_config(tmp_path / "b" / "base", **{**options, "epochs": 1}))
    first, second = wandb.inits[0], wandb.inits[1]
    assert first["name"] == second["name"] == "base" and first["id"] != second["id"]
    assert first["resume"] is None and (tmp_path / "a" / "base" / WANDB_ID_FILE).read_text().strip() == first["id"]
    train(resume=tmp_path / "b" / "base", resume_changes={"epochs": 2})
    assert wandb.inits[2]["id"] == second["id"] and wandb.inits[2]["resume"] == "must"
    assert FakeWriter.instances[-1].purge_step == 4 + 1  # events past the checkpoint's step are dropped
    # and with --no-progress (no bar at all), on a terminal too
    ssog_log.clear()
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    train(tiny_config(tmp_path / "c" / "base", **{**options, "progress": False, "epochs": 1}))
    assert len(re.findall(r"epoch 1/1 step \d/4 \(step \d\): loss", ssog_log.text)) == 2


def test_environment_json_records_versions_commit_and_resumes(tmp_path, tiny_config):
    train(tiny_config(tmp_path / "run", epochs=1))
    record = json.loads((tmp_path / "run" / "environment.json").read_text())
    for package in ("ssog", "torch", "timm", "numpy"):
        assert record["packages"][package] == importlib.metadata.version(package), package
    assert record["ssog"] == record["packages"]["ssog"] and isinstance(record["command"], list)
    assert record["python"] == platform.python_version() and record["hostname"]
    if (REPO / ".git").exists():  # a checkout, as the editable install of the tests is
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        assert record["git_commit"] == head and isinstance(record["git_dirty"], bool)
    train(resume=tmp_path / "run", resume_changes={"epochs": 2})
    again = json.loads((tmp_path / "run" / "environment.json").read_text())
    assert again["time"] == record["time"] and len(again["resumes"]) == 1


def test_curves_of_one_epoch_have_points():
    record = {"epoch": 1, "train_loss": 1.0, "val_loss": 1.1, "acc1": 50.0, "acc3": 80.0, "acc5": 90.0}
    fig = curves_figure([record])
    assert all(line.get_marker() == "o" for ax in fig.axes for line in ax.lines)
    fig = curves_figure([{**record, "epoch": e} for e in range(1, 101)])
    assert all(line.get_marker() in (None, "None", "") for ax in fig.axes for line in ax.lines)


def test_with_ema_the_best_checkpoint_is_chosen_by_the_emas_metric(tiny_config, tmp_path):
    summary = train(tiny_config(tmp_path / "run", epochs=3, ema_decay=0.5))
    history = run_history(tmp_path / "run")
    best = max(history, key=lambda row: row["ema_acc1"])
    assert summary["best_metric"] == "ema_acc1" and summary["best_acc1"] == best["ema_acc1"]
    assert summary["best_epoch"] == best["epoch"]


def test_timm_loads_the_weights_that_earned_best_the_emas(tiny_config, tmp_path):
    import timm

    from ssog.train.transfer import load_weights

    cfg = tiny_config(tmp_path / "run", epochs=1, ema_decay=0.5)
    train(cfg)
    last = load_checkpoint(tmp_path / "run" / "last.safetensors", only=("model", "ema"))
    assert any(not torch.equal(last["model"][k], last["ema"][k]) for k in last["ema"])  # they differ
    model = timm.create_model(cfg.model, num_classes=4, img_size=8, in_chans=3, **cfg.model_kwargs,
                              checkpoint_path=str(tmp_path / "run" / "best.safetensors"))
    assert all(torch.equal(value, last["ema"][name]) for name, value in model.state_dict().items())
    for ema in (False, True):  # ssog eval and --init-from read them, with --ema or without
        weights, _ = load_weights(tmp_path / "run" / "best.safetensors", ema=ema)
        assert all(torch.equal(weights[name], last["ema"][name]) for name in weights)
