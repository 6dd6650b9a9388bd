"""What a researcher runs first on a paper recipe: the step limit, the command line's data
source beating the recipe's, and ``ssog train --dry-run`` (issue 28)."""
import json
from pathlib import Path

import pytest

from ssog.train import resolve_config, train
from ssog.train.builders import ModelBuildError
from ssog.train.dry_run import dry_run, format_dry_run
from ssog.train.engine import Trainer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_max_steps_ends_the_run_evaluated_and_saved(tiny_config, tmp_path):
    summary = train(tiny_config(tmp_path / "run", epochs=3, max_steps=6))  # 4 steps per epoch
    assert summary["steps"] == 6 and summary["epochs"] == 2 and summary["max_steps"] == 6
    history = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [(row["epoch"], row["step"]) for row in history] == [(1, 4), (2, 6)]
    assert (tmp_path / "run" / "best.safetensors").is_file()
    # the schedule is the recipe's (3 epochs, 12 steps), not shortened to the limit: at step 6
    # its cosine is still above where the whole run is at step 8, far from min_lr
    full = train(tiny_config(tmp_path / "full", epochs=3))
    full_history = [json.loads(line) for line in (tmp_path / "full" / "log.jsonl").read_text().splitlines()]
    assert full["steps"] == 12 and history[1]["lr"] > full_history[1]["lr"] > 10 * 1e-5


def test_max_steps_is_checked(tiny_config, tmp_path):
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        tiny_config(tmp_path, max_steps=0)


def test_a_dataset_on_the_command_line_beats_the_recipes_data_source(tmp_path):
    recipe = CONFIGS / "_base/cifar100_224.yaml"
    cfg = resolve_config(recipe, None, [("dataset", "synthetic")])
    assert (cfg.dataset, cfg.data_dir, cfg.download) == ("synthetic", None, False)
    # the same dataset keeps the recipe's folder; a folder alone keeps the recipe's dataset
    # unless it visibly holds another source
    assert resolve_config(recipe, None, [("dataset", "cifar100")]).data_dir == "data/cifar100"
    assert resolve_config(recipe, None, [("data_dir", str(tmp_path / "new"))]).dataset == "cifar100"
    (tmp_path / "folder" / "train" / "cat").mkdir(parents=True)
    assert resolve_config(recipe, None, [("data_dir", str(tmp_path / "folder"))]).dataset == "imagefolder"
    (tmp_path / "c10" / "cifar-10-batches-py").mkdir(parents=True)
    assert resolve_config(recipe, None, [("data_dir", str(tmp_path / "c10"))]).dataset == "cifar10"
    # --set counts as the command line too
    assert resolve_config(CONFIGS / "cifar10_tiny.yaml", "ssog", [("dataset", "synthetic")]).data_dir is None


def test_dry_run_measures_and_projects_without_writing(tiny_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = dry_run(tiny_config(tmp_path / "never", epochs=5), steps=2)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the run folder
    assert report["params"] > 0 and report["gflops_per_image"] > 0 and report["step_s"] > 0
    assert report["steps_per_epoch"] == 4 and report["epochs"] == 5
    assert report["schedule_s"] == pytest.approx(5 * report["epoch_s"])
    assert report["fits_micro_batch"] == 16 and report["grad_accum_steps_needed"] is None
    text = format_dry_run(report)
    for line in ("parameters", "GFLOPs / image", "step time", "data loader", "peak memory", "per epoch",
                 "whole schedule"):
        assert line in text


def test_dry_run_finds_the_micro_batch_that_fits(tiny_config, tmp_path, monkeypatch):
    real = Trainer.forward_backward

    def small_memory(self, images, targets, sync):
        if len(images) > 4:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 bytes")
        return real(self, images, targets, sync)

    monkeypatch.setattr(Trainer, "forward_backward", small_memory)
    report = dry_run(tiny_config(tmp_path / "run"), steps=1)
    assert report["fits_micro_batch"] == 4 and report["grad_accum_steps_needed"] == 4
    assert "--set grad_accum_steps=4" in format_dry_run(report)


def test_dry_run_of_a_recipe_without_its_data_measures_a_stand_in(tmp_path, monkeypatch, ssog_log):
    monkeypatch.chdir(tmp_path)
    cfg = resolve_config(CONFIGS / "cifar10_tiny.yaml", "ssog",
                         [("data_dir", str(tmp_path / "absent")), ("batch_size", 8), ("num_workers", 0)])
    cfg.dataset = "cifar10"  # a CIFAR recipe whose data is not here
    report = dry_run(cfg, steps=1)
    assert report["stand_in"] == "cifar10" and report["train_images"] == 45_000 and report["val_images"] == 5_000
    assert report["steps_per_epoch"] == 45_000 // 8
    assert "generated images" in ssog_log.text
    assert list(tmp_path.iterdir()) == []


def test_dry_run_reports_a_model_setting_as_it_is_not_as_missing_data(tmp_path, monkeypatch):
    """A bad model option is the user's to fix: the model's error, without the hint to measure without the data."""
    monkeypatch.chdir(tmp_path)
    cfg = resolve_config(CONFIGS / "cifar10_tiny.yaml", "ssog_odevit",
                         [("dataset", "synthetic"), ("model_kwargs.weight_init", "bogus")])
    with pytest.raises(ModelBuildError, match=r"weight_init='bogus': expected one of timm's ViT modes.*\)$") as error:
        dry_run(cfg, steps=1)
    assert "measure without the data" not in str(error.value)


def _absent_cifar(tmp_path, *settings):
    cfg = resolve_config(CONFIGS / "cifar10_tiny.yaml", "ssog",
                         [("data_dir", str(tmp_path / "absent")), ("batch_size", 8), ("num_workers", 0), *settings])
    cfg.dataset = "cifar10"
    return cfg


def test_the_stand_in_checks_val_split_against_the_real_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = dry_run(_absent_cifar(tmp_path, ("val_split", 0.2)), steps=1)
    assert (report["train_images"], report["val_images"]) == (40_000, 10_000)
    with pytest.raises(ValueError, match=r"val_split 0.99999 \(--val-split\) holds out 50000 of 50000 images"):
        dry_run(_absent_cifar(tmp_path, ("val_split", 0.99999)), steps=1)


def test_the_stand_in_of_an_image_folder_that_names_its_validation_folder(tmp_path, monkeypatch):
    """A val_split that names the folder to validate on splits nothing: the source's own sizes."""
    monkeypatch.chdir(tmp_path)
    cfg = resolve_config(None, None, [("dataset", "imagefolder"), ("data_dir", str(tmp_path / "cifar100")),
                                      ("val_split", "validation"), ("batch_size", 8), ("num_workers", 0)])
    report = dry_run(cfg, steps=1)
    assert report["stand_in"] == "cifar100" and (report["train_images"], report["val_images"]) == (50_000, 10_000)


def test_a_setting_error_is_the_real_runs_not_missing_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for cfg in (_absent_cifar(tmp_path, ("grad_accum_steps", 3)),  # known source, its data absent
                resolve_config(None, None, [("dataset", "imagefolder"), ("data_dir", str(tmp_path)),
                                            ("batch_size", 8), ("grad_accum_steps", 3)])):
        with pytest.raises(ValueError, match=r"batch_size 8 must be divisible by the number of processes 1 x "
                                             r"grad_accum_steps 3$"):
            dry_run(cfg, steps=1)
    cfg = resolve_config(None, None, [("dataset", "imagefolder"), ("data_dir", str(tmp_path / "absent"))])
    with pytest.raises(ValueError, match=r"does not exist.*\(measure without the data: add --dataset synthetic\)$"):
        dry_run(cfg, steps=1)


def test_a_batchnorm_model_is_measured_on_its_stand_in(tmp_path, monkeypatch):
    """The FLOPs are counted on one image: in evaluation mode, where BatchNorm takes it (in
    training mode it raised)."""
    monkeypatch.chdir(tmp_path)
    cfg = resolve_config(None, None, [("model", "test_resnet"), ("dataset", "cifar10"), ("img_size", 32),
                                      ("data_dir", str(tmp_path / "absent")), ("batch_size", 8)])
    report = dry_run(cfg, steps=1)
    assert report["stand_in"] == "cifar10" and report["step_s"] > 0


def test_dry_run_on_the_command_line(ssog_cli, run_child, tmp_path):
    report = tmp_path / "report.json"
    result = run_child(ssog_cli.command("train", "--dry-run", "1", "--dataset", "synthetic", "--epochs", "2",
                                        "--dry-run-report", str(report)), timeout=300, cwd=tmp_path,
                       env=ssog_cli.env())
    assert result.returncode == 0, result.stderr
    assert "whole schedule" in result.stdout and json.loads(report.read_text())["epochs"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_dry_run_says_when_the_run_would_refuse_its_output(ssog_cli, run_child, tmp_path):
    held = tmp_path / "held"
    held.mkdir()
    (held / "summary.json").write_text("{}")
    result = run_child(ssog_cli.command("train", "--dry-run", "1", "--dataset", "synthetic", "--output", str(held)),
                       timeout=300, cwd=tmp_path, env=ssog_cli.env())
    assert result.returncode == 0, result.stderr
    assert f"note: the run itself would stop before training: {held} already holds a run (summary.json)" \
        in result.stdout
    assert sorted(p.name for p in held.iterdir()) == ["summary.json"]  # a dry run writes nothing there


def test_dry_run_of_the_imagenet_recipe_without_its_data_projects_imagenet(tmp_path, monkeypatch, ssog_log):
    monkeypatch.chdir(tmp_path)  # the recipe's data/imagenet is not here
    cfg = resolve_config(CONFIGS / "imagenet/table02_imagenet.yaml", "vit_ssog",
                         [("model", "ssog_vit_micro_patch1_8"), ("model_kwargs.depth", 1), ("img_size", 8),
                          ("batch_size", 8), ("num_workers", 0), ("amp", "none")])
    report = dry_run(cfg, steps=1)
    assert report["stand_in"] == "imagenet" and report["train_images"] == 1_281_167
    assert report["val_images"] == 50_000 and report["steps_per_epoch"] == 1_281_167 // 8
    assert "imagenet is not readable here" in ssog_log.text and "1,281,167 training images" in ssog_log.text


def test_dry_run_projects_for_several_devices_and_prints_the_launch_line(tiny_config, tmp_path, monkeypatch, capsys):
    import os
    import warnings

    from ssog.cli import main

    monkeypatch.chdir(tmp_path)
    cpus = os.cpu_count()
    cfg = tiny_config(tmp_path / "never", synthetic_size=64, batch_size=16, num_workers=cpus + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = dry_run(cfg, steps=1, nproc=2, nnodes=2)
    assert not [w for w in caught if "DataLoader will create" in str(w.message)]  # said once, in the report
    assert report["workers_over_cpus"] == cpus and f"more than this machine's {cpus} CPUs" in format_dry_run(report)
    assert (report["devices"], report["batch_size"], report["global_batch"]) == (4, 4, 16)
    assert report["steps_per_epoch"] == 64 // 16 and report["peak_memory_bytes"] > 0
    with pytest.raises(ValueError, match=r"batch_size 16 must be divisible by the 3 devices \(--nproc 3 x "):
        dry_run(cfg, steps=1, nproc=3)
    args = ["--model", cfg.model, "--dataset", "synthetic", "--img-size", "8", "--batch-size", "16",
            "--set", "model_kwargs.embed_dim=16", "--set", "model_kwargs.depth=1", "--num-workers", "0"]
    assert main(["train", *args, "--dry-run", "1", "--nproc", "2", "--nnodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "batch 4 per device of 4 (2 x 2: global batch 16)" in out
    assert ("  launch           torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint HEAD_NODE:29500 --rdzv-id "
            f"RUN_NAME --nproc-per-node 2 -m ssog train {' '.join(args)}") in out
    assert main(["train", *args, "--nproc", "2"]) == 2  # a projection goes with --dry-run
    assert "--nproc and --nnodes go with --dry-run" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
