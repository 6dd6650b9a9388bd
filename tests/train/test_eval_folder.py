"""``ssog eval --data-dir DIR`` on a folder of class folders (or DIR/val), for an ImageFolder run."""
from __future__ import annotations

import pytest

from support import image_tree
from ssog.cli import main
from ssog.train import evaluate_checkpoint
from ssog.train.builders import build_model
from ssog.train.checkpoint import save_checkpoint


@pytest.fixture
def imagefolder_run(tmp_path, tiny_config):
    """A run trained on DIR/train with val_split (its checkpoint, without training it)."""
    image_tree(tmp_path / "data" / "train", splits=("",), size=8, per_class=4)
    cfg = tiny_config(tmp_path / "run", dataset="imagefolder", data_dir=str(tmp_path / "data"), val_split=2,
                      batch_size=4)
    model = build_model(cfg, 2, 3, 8)
    return save_checkpoint(tmp_path / "run" / "best.safetensors", {
        "kind": "best", "config": cfg.to_dict(), "classes": ["cat", "dog"], "model": model.state_dict(),
    })


def test_a_folder_of_class_folders_is_evaluated_whole(tmp_path, imagefolder_run):
    folder = image_tree(tmp_path / "photos", splits=("",), size=8, per_class=5)
    result = evaluate_checkpoint(imagefolder_run, data={"data_dir": str(folder)}, progress=False,
                                 device="cpu", per_class=True)
    assert result["samples"] == 10  # every image: no train folder needed, val_split not applied
    assert [(row["class"], row["images"]) for row in result["per_class"]] == [("cat", 5), ("dog", 5)]
    assert result["acc1"] == pytest.approx(sum(row["acc1"] * row["images"] for row in result["per_class"]) / 10)


def test_a_val_folder_beside_train_is_what_is_evaluated(tmp_path, imagefolder_run):
    image_tree(tmp_path / "other" / "train", splits=("",), size=8, per_class=4)
    image_tree(tmp_path / "other" / "val", splits=("",), size=8, per_class=3)
    result = evaluate_checkpoint(imagefolder_run, data={"data_dir": str(tmp_path / "other")}, progress=False,
                                 device="cpu")
    assert result["samples"] == 6


def test_the_run_own_data_still_uses_its_val_split(imagefolder_run):
    assert evaluate_checkpoint(imagefolder_run, progress=False, device="cpu")["samples"] == 2


def test_a_val_split_given_with_the_folder_holds_out_the_runs_images_again(tmp_path, imagefolder_run):
    """A copy of the run's data folder with --val-split reads as the run read it: the same held-out images."""
    own = evaluate_checkpoint(imagefolder_run, progress=False, device="cpu", per_class=True)
    copy = image_tree(tmp_path / "copy" / "train", splits=("",), size=8, per_class=4).parent
    again = evaluate_checkpoint(imagefolder_run, data={"data_dir": str(copy), "val_split": 2}, progress=False,
                                device="cpu", per_class=True)
    assert again["samples"] == 2 and again["per_class"] == own["per_class"] and again["loss"] == own["loss"]
    assert again["data_dir"] == str(copy.resolve())
    assert evaluate_checkpoint(imagefolder_run, data={"data_dir": str(copy / "train")}, progress=False,
                               device="cpu")["samples"] == 8  # without it, evaluated whole


def test_other_class_names_are_a_clear_error(tmp_path, imagefolder_run, capsys):
    folder = image_tree(tmp_path / "pets", splits=("",), size=8, classes=("cat", "fox"))
    assert main(["eval", "--checkpoint", str(imagefolder_run), "--data-dir", str(folder), "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert "not the classes the run" in error and "fox" in error and "dog" in error


def test_cli_per_class_table(tmp_path, imagefolder_run, capsys):
    folder = image_tree(tmp_path / "photos", splits=("",), size=8)
    assert main(["eval", "--checkpoint", str(imagefolder_run), "--data-dir", str(folder), "--device", "cpu",
                 "--per-class"]) == 0
    out = capsys.readouterr().out
    assert "class  images   Acc@1" in out and "\ncat         3" in out and "\ndog         3" in out


def test_progress_bars_only_on_a_terminal(monkeypatch):
    from ssog.train.logger import progress_bar

    assert progress_bar(True, total=3).disable  # pytest's captured stderr is no terminal
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert not progress_bar(True, total=3).disable
    assert progress_bar(False, total=3).disable


def test_a_run_stores_its_data_folder_resolved_and_eval_says_which_it_reads(tmp_path, monkeypatch, capsys,
                                                                             tiny_config):
    import yaml

    from ssog.train import train

    project = tmp_path / "project"
    image_tree(project / "data" / "train", splits=("",), size=8, per_class=4)
    monkeypatch.chdir(project)
    train(tiny_config("runs/a", dataset="imagefolder", data_dir="data", val_split=2, batch_size=4, epochs=1))
    config = yaml.safe_load((project / "runs" / "a" / "config.yaml").read_text())
    assert config["data_dir"] == str(project / "data")

    elsewhere = tmp_path / "elsewhere"
    # same name, other images
    image_tree(elsewhere / "data" / "train", splits=("",), size=8, classes=("cat", "dog"), per_class=9)
    monkeypatch.chdir(elsewhere)
    assert main(["eval", "--checkpoint", str(project / "runs" / "a"), "--device", "cpu"]) == 0
    assert f"on imagefolder val from {project / 'data'} (2 images" in capsys.readouterr().out


def test_an_older_runs_relative_data_folder_is_read_where_that_run_started(tmp_path, monkeypatch, imagefolder_run):
    from ssog.train import load_checkpoint

    state = load_checkpoint(imagefolder_run)
    state["config"].update(data_dir="data", output="run")  # written from tmp_path before paths were stored resolved
    save_checkpoint(imagefolder_run, state)
    image_tree(tmp_path / "cwd" / "data" / "train", splits=("",), size=8, per_class=30)
    monkeypatch.chdir(tmp_path / "cwd")
    result = evaluate_checkpoint(imagefolder_run, progress=False, device="cpu")
    assert (result["data_dir"], result["samples"]) == (str(tmp_path / "data"), 2)


def test_a_dataset_named_for_evaluation_beats_the_runs_folder(imagefolder_run):
    """--dataset on the command line wins over the run's data source, as in training."""
    result = evaluate_checkpoint(imagefolder_run, data={"dataset": "synthetic", "synthetic_classes": 2},
                                 progress=False, device="cpu")
    assert result["dataset"] == "synthetic" and result["data_dir"] is None


def test_a_folder_of_classes_with_a_class_named_train_works_in_every_command(tmp_path, capsys, tiny_config):
    """CIFAR-100 as class folders has a class ``train``: train with --val-split, eval and analyze read it as classes."""
    import json

    from ssog.train import load_checkpoint

    data = image_tree(tmp_path / "cifar", splits=("",), size=8, classes=("apple", "train", "val"), per_class=4)
    run = tmp_path / "run"
    cfg = tiny_config(run, epochs=1, batch_size=3)
    kwargs = [arg for key, value in cfg.model_kwargs.items() for arg in ("--set", f"model_kwargs.{key}={value}")]
    assert main(["train", "--model", cfg.model, *kwargs, "--img-size", "8", "--epochs", "1", "--batch-size", "3",
                 "--data-dir", str(data), "--val-split", "3", "--no-progress", "--output", str(run)]) == 0
    assert load_checkpoint(run / "best.safetensors", only=("classes",))["classes"] == ["apple", "train", "val"]
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--data-dir", str(data), "--device", "cpu", "--per-class"]) == 0
    out = capsys.readouterr().out
    assert "(12 images" in out and "\ntrain       4" in out and "\nval         4" in out
    assert main(["analyze", "sinks", "--checkpoint", str(run), "--data", "imagefolder", "--data-dir", str(data),
                 "--val-split", "3", "--num-images", "3", "--device", "cpu", "--output", str(tmp_path / "sinks")]) == 0
    row = json.loads((tmp_path / "sinks" / "sinks.json").read_text())[0]
    assert (row["data"], row["images"]) == ("imagefolder", 3)
