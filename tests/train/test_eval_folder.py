"""``ssog eval --data-dir DIR`` on a folder of class folders (or DIR/val), for an ImageFolder run, and
``--compare``: two models paired on the same images."""
from __future__ import annotations

import json
import math

import pytest
import torch

from support import image_tree
from ssog.cli import main
from ssog.train import compare_checkpoints, evaluate_checkpoint
from ssog.train.builders import build_model
from ssog.train.checkpoint import save_checkpoint


def _untrained_run(run, data, tiny_config, val_split=2):
    """The best checkpoint of a run on ``data``/train with ``val_split``, without training it."""
    cfg = tiny_config(run, dataset="imagefolder", data_dir=str(data), val_split=val_split, batch_size=4)
    return save_checkpoint(run / "best.safetensors", {
        "kind": "best", "config": cfg.to_dict(), "classes": ["cat", "dog"],
        "model": build_model(cfg, 2, 3, 8).state_dict(),
    })


@pytest.fixture
def imagefolder_run(tmp_path, tiny_config):
    """A run trained on DIR/train with val_split (its checkpoint, without training it)."""
    image_tree(tmp_path / "data" / "train", splits=("",), size=8, per_class=4)
    return _untrained_run(tmp_path / "run", tmp_path / "data", tiny_config)


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


def test_paired_difference_counts_the_images_only_one_model_gets_right():
    from ssog.train.metrics import paired_difference

    both, neither = [True] * 80, [False] * 8
    a = torch.tensor(both + [True] * 10 + [False] * 2 + neither)  # 100 images: 10 only A, 2 only B
    b = torch.tensor(both + [False] * 10 + [True] * 2 + neither)
    paired = paired_difference(a, b)
    assert (paired["only_a"], paired["only_b"], paired["images"]) == (10, 2, 100)
    assert (paired["acc1_a"], paired["acc1_b"], paired["difference"]) == pytest.approx((90.0, 82.0, 8.0))
    assert paired["p_value"] == pytest.approx(2 * (1 + 12 + 66) / 2 ** 12)  # McNemar exact: P(X <= 2), X ~ B(12, 1/2)
    half_width = 1.96 * math.sqrt(12 - 8 ** 2 / 100) / 100 * 100
    assert paired["ci95"] == pytest.approx([8.0 - half_width, 8.0 + half_width])
    swapped = paired_difference(b, a)
    assert swapped["difference"] == pytest.approx(-8.0) and swapped["p_value"] == paired["p_value"]
    same = paired_difference(a, a)
    assert (same["difference"], same["p_value"], same["ci95"]) == (0.0, 1.0, [0.0, 0.0])


def test_paired_difference_stays_exact_at_thousands_of_discordant_images():
    from ssog.train.metrics import paired_difference

    a = torch.tensor([True] * 3000 + [False] * 2900)
    paired = paired_difference(a, ~a)
    z = (3000 - 2900 - 1) / math.sqrt(5900)  # the normal approximation, with continuity correction
    assert paired["p_value"] == pytest.approx(math.erfc(z / math.sqrt(2)), abs=2e-3)
    with pytest.raises(ValueError, match="one flag per image"):
        paired_difference(a, a[:10])


@pytest.fixture
def second_run(tmp_path, tiny_config):
    """Another model of imagefolder_run's recipe: other weights, the same data."""
    torch.manual_seed(1)
    return _untrained_run(tmp_path / "run2", tmp_path / "data", tiny_config)


def test_two_models_are_compared_on_the_same_images(tmp_path, imagefolder_run, second_run):
    folder = image_tree(tmp_path / "photos", splits=("",), size=8, per_class=6)
    data = {"data_dir": str(folder)}
    result = compare_checkpoints(imagefolder_run, second_run, data=data, progress=False, device="cpu")
    alone = [evaluate_checkpoint(run, data=data, progress=False, device="cpu") for run in (imagefolder_run, second_run)]
    assert [result["a"], result["b"]] == alone  # each model's own metrics, untouched by the pairing
    paired = result["paired"]
    assert paired["images"] == 12
    assert paired["difference"] == pytest.approx(alone[0]["acc1"] - alone[1]["acc1"])
    itself = compare_checkpoints(imagefolder_run, imagefolder_run, data=data, progress=False, device="cpu")["paired"]
    assert (itself["difference"], itself["only_a"], itself["only_b"], itself["p_value"]) == (0.0, 0, 0, 1.0)


def test_models_that_read_different_images_are_not_compared(tmp_path, imagefolder_run, tiny_config):
    image_tree(tmp_path / "data3" / "train", splits=("",), size=8, per_class=4)
    other = _untrained_run(tmp_path / "run3", tmp_path / "data3", tiny_config, val_split=4)
    with pytest.raises(ValueError, match=r"different images \(data_dir .*val_split 2 against 4.*samples 2 against 4"):
        compare_checkpoints(imagefolder_run, other, progress=False, device="cpu")


def test_cli_compare_prints_the_paired_difference(tmp_path, imagefolder_run, second_run, capsys):
    folder = str(image_tree(tmp_path / "photos", splits=("",), size=8))
    assert main(["eval", "--checkpoint", str(imagefolder_run), "--compare", str(second_run), "--data-dir", folder,
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"A: {imagefolder_run}\n") and f"\nB: {second_run}\n" in out
    assert "Acc@1 on the same 6 images (95% interval" in out and "McNemar p = " in out
    assert main(["eval", "--checkpoint", str(imagefolder_run), "--compare", str(second_run), "--data-dir", folder,
                 "--device", "cpu", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"a", "b", "paired"}
    assert main(["eval", "--checkpoint", str(imagefolder_run), "--compare", str(second_run), "--per-class"]) == 2
    assert "--per-class and --compare do not combine" in capsys.readouterr().err
