"""Weights the timm way: timm's Hugging Face layout (ssog export --format hf) with its model
card, local-dir: loading with pretrained=True, a released folder evaluated and analysed by
ssog's own commands, checkpoint_path at another image size, dynamic_img_size."""
import json
import os
import re
from pathlib import Path

import pytest
import timm
import torch
import yaml
from timm.layers import resample_abs_pos_embed

import ssog  # noqa: F401  (registers the models)
from support import image_tree
from ssog.cli import main
from ssog.export import LIBRARY_TITLE, model_card, training_recipe
from ssog.models import count_flops
from ssog.train import evaluate_checkpoint, load_checkpoint, train
from ssog.train.transfer import model_from_checkpoint

ROOT = Path(__file__).resolve().parents[2]

MODEL = "ssog_vit_micro_patch1_8"
KWARGS = dict(embed_dim=16, num_heads=2, depth=2)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_config):
    folder = tmp_path_factory.mktemp("share") / "run"
    train(tiny_config(folder, epochs=1, mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.25]))
    return folder


def test_export_hf_loads_back_with_local_dir(run, tmp_path, capsys):
    out = tmp_path / "hf"
    umask = os.umask(0o022)
    try:
        assert main(["export", "--format", "hf", "--checkpoint", str(run), "--output", str(out)]) == 0
    finally:
        os.umask(umask)
    assert f"local-dir:{out}" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert out.stat().st_mode & 0o777 == 0o755  # a folder others can read, as the files in it
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {"README.md": 0o644, "config.json": 0o644,
                                                                        "model.safetensors": 0o644}
    assert not [p for p in tmp_path.iterdir() if "ssog-tmp" in p.name]
    config = json.loads((out / "config.json").read_text())
    data_config = load_checkpoint(run / "best.safetensors", only=("data_config",))["data_config"]
    for key in ("mean", "std", "input_size"):
        assert tuple(config["pretrained_cfg"][key]) == tuple(data_config[key]), key
    assert config["pretrained_cfg"]["crop_pct"] == data_config["crop_pct"]
    assert config["label_names"] == ["0", "1", "2", "3"] and config["num_classes"] == 4

    loaded = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    trained = model_from_checkpoint(run).eval()
    images = torch.randn(2, 3, 8, 8)
    assert torch.equal(loaded(images), trained(images))
    assert tuple(timm.data.resolve_data_config(model=loaded)["mean"]) == (0.4, 0.5, 0.6)
    # a folder that holds a model is not replaced
    assert main(["export", "--format", "hf", "--checkpoint", str(run), "--output", str(out)]) == 2
    assert "already holds a model (config.json)" in capsys.readouterr().err
    assert main(["export", "--format", "hf", "--checkpoint", str(run), "--output", str(out), "--overwrite"]) == 2
    assert "--format hf writes a new folder and never replaces one" in capsys.readouterr().err


def test_card_names_the_data_folder_not_the_trainers_path(run, monkeypatch):
    import ssog.train.checkpoint as checkpoint

    read = checkpoint.read_checkpoint_info

    def read_from_a_folder(path):
        info = read(path)
        info["config"] |= {"dataset": "imagefolder", "data_dir": "/home/someone/data/cifar100"}
        return info

    monkeypatch.setattr(checkpoint, "read_checkpoint_info", read_from_a_folder)
    assert training_recipe(run)["Data"] == "imagefolder, 8 px (folder cifar100)"


def _front_matter_and_body(card: str) -> tuple[dict, str]:
    empty, front, body = card.split("---\n", 2)
    assert empty == ""  # the card starts with its YAML front matter, as the hub reads it
    return yaml.safe_load(front), body


def test_export_hf_writes_a_model_card_with_the_runs_metrics(run, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", "--format", "hf", "--checkpoint", str(run), "--output", str(out),
                 "--hub-id", "someone/tiny-ssog"]) == 0
    meta, body = _front_matter_and_body((out / "README.md").read_text())
    assert meta["library_name"] == "timm" and meta["license"] == "mit" and meta["datasets"] == ["synthetic"]
    assert {"image-classification", "timm", "ssog"} <= set(meta["tags"])

    model, summary = model_from_checkpoint(run), json.loads((run / "summary.json").read_text())
    assert body.startswith(f"# Model card for {MODEL}\n")
    assert f"Params: {sum(p.numel() for p in model.parameters()):,}" in body
    assert f"GFLOPs: {count_flops(model)['total_gflops']:.4g} (one 8x8 image, 2 per multiply-add)" in body
    assert f"Final (epoch 1): Acc@1 {summary['acc1']:.2f}, Acc@3 {summary['acc3']:.2f}" in body
    assert f"Best: Acc@1 {summary['best_acc1']:.2f} at epoch {summary['best_epoch']}" in body
    assert "**Weights:** a run's best.safetensors" in body and "**Dataset:** synthetic" in body
    # the training recipe, as timm's cards give theirs (tiny_config: synthetic 8 px, 1 epoch, batch 16, adamw 3e-3)
    assert "**Training recipe:**" in body
    for line in ("Data: synthetic, 8 px", "Epochs: 1", "Batch size: 16",
                 "Optimizer: adamw, lr 0.003, weight decay 0.05, gradient clipping 1.0",
                 "Schedule: cosine, 1 warmup epochs from 1e-05, min lr 1e-05", "Augmentation: level none",
                 "Regularisation: label smoothing 0.1, drop path 0.0", "EMA: none", "Precision: float32", "Seed: 0",
                 "Validation: the data set's own validation split"):
        assert f"  - {line}\n" in body, line
    assert "Evaluation:" not in body  # generated data of the run's own size: no ssog eval flag names it
    assert 'timm.create_model("hf-hub:someone/tiny-ssog", pretrained=True)' in body and "local-dir:" in body
    # the citations: the paper as CITATION.cff gives it, and this library
    paper = yaml.safe_load((ROOT / "CITATION.cff").read_text())["preferred-citation"]
    assert f"title={{{paper['title']}}}" in body and "arXiv:2611.08236" in body
    assert " and ".join(f"{a['family-names']}, {a['given-names']}" for a in paper["authors"]) in body
    assert f"title={{{LIBRARY_TITLE}}}" in body and f"version={{{ssog.__version__}}}" in body

    pretrained_cfg = json.loads((out / "config.json").read_text())["pretrained_cfg"]
    assert pretrained_cfg["paper_ids"] == "arXiv:2611.08236" and pretrained_cfg["license"] == "mit"
    assert pretrained_cfg["origin_url"] == paper["url"] and pretrained_cfg["paper_name"] == paper["title"]
    loaded = timm.create_model(f"local-dir:{out}", pretrained=True)
    assert loaded.pretrained_cfg["paper_ids"] == "arXiv:2611.08236"


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory, tiny_config):
    """A run trained on an ImageFolder (3 classes of 8 images in DATA/train, 6 of them held out
    by val_split, split_seed 3), and its export in timm's hub layout: ``(run, released, data)``."""
    root = tmp_path_factory.mktemp("folder_share")
    data = root / "data"
    image_tree(data / "train", splits=("",), classes=("cat", "dog", "fox"), per_class=8, size=8)
    run = root / "run"
    train(tiny_config(run, dataset="imagefolder", data_dir=str(data), val_split=6, split_seed=3, batch_size=6,
                      epochs=1, mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.25]))
    assert main(["export", "--format", "hf", "--checkpoint", str(run), "--output", str(root / "released")]) == 0
    return run, root / "released", data


def _eval_json(capsys, *args: str) -> dict:
    assert main(["eval", *args, "--json", "--device", "cpu"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_released_folder_evaluates_as_its_run_on_the_same_held_out_images(folder_run, capsys):
    run, released, data = folder_run
    by_run = _eval_json(capsys, "--checkpoint", str(run), "--batch-size", "4", "--per-class")
    split = ["--dataset", "imagefolder", "--data-dir", str(data), "--val-split", "6", "--split-seed", "3"]
    by_release = _eval_json(capsys, "--checkpoint", str(released), *split, "--batch-size", "4", "--per-class")
    assert by_run["samples"] == by_release["samples"] == 6
    assert by_release["per_class"] == by_run["per_class"]  # the same images of each class
    assert by_release["acc1"] == by_run["acc1"] and by_release["acc5"] == by_run["acc5"]
    assert by_release["loss"] == pytest.approx(by_run["loss"], rel=1e-6)
    assert by_release["model"] == MODEL and by_release["img_size"] == 8
    # timm's name of the folder reads the same model
    again = evaluate_checkpoint(f"local-dir:{released}", data=dict(dataset="imagefolder", data_dir=str(data),
                                val_split=6, split_seed=3), batch_size=4, device="cpu", progress=False)
    assert again["loss"] == pytest.approx(by_run["loss"], rel=1e-6)
    # another split seed holds out other images: the flags reach the run's splitter
    other = _eval_json(capsys, "--checkpoint", str(released), *split[:-1], "4", "--batch-size", "4")
    assert other["samples"] == 6 and other["loss"] != pytest.approx(by_run["loss"], rel=1e-6)
    # without --val-split the folder is evaluated whole, as for a run: DATA/train has no val/ beside it
    assert main(["eval", "--checkpoint", str(released), "--data-dir", str(data / "train"), "--device", "cpu"]) == 0
    assert "(24 images, 8px" in capsys.readouterr().out


def test_the_card_names_the_held_out_images_and_the_command_that_scores_them(folder_run, capsys):
    run, released, data = folder_run
    _, body = _front_matter_and_body((released / "README.md").read_text())
    assert "  - Validation: 6 images held out of the training folder (stratified), split_seed 3\n" in body
    command = re.search(r"  - Evaluation: `(ssog eval [^`]*)` \(FOLDER: this folder; DATA_DIR: the data folder "
                        r"\(the one with train/\)\) gives the metrics above\n", body).group(1)
    assert command == ("ssog eval --checkpoint FOLDER --dataset imagefolder --data-dir DATA_DIR --val-split 6 "
                       "--split-seed 3")
    args = command.replace("FOLDER", str(released)).replace("DATA_DIR", str(data)).split()[2:]
    result = _eval_json(capsys, *args)
    summary = json.loads((run / "summary.json").read_text())  # the card's metrics
    assert f"Acc@1 {summary['best_acc1']:.2f} at epoch" in body
    assert result["acc1"] == pytest.approx(summary["best_acc1"]) and result["samples"] == 6


def test_a_released_folder_needs_its_data_named_in_one_line(folder_run, tmp_path, capsys):
    _, released, data = folder_run
    assert main(["eval", "--checkpoint", str(released), "--device", "cpu"]) == 2
    printed = capsys.readouterr().err
    error = printed.strip().splitlines()[-1]  # after the tiny model's own warning
    assert "is a released model" in error and "--dataset" in error and "--data-dir" in error
    assert "--val-split" in error and "Traceback" not in printed
    assert main(["eval", "--checkpoint", str(released), "--ema", "--data-dir", str(data), "--device", "cpu"]) == 2
    assert "no separate EMA weights; leave out --ema" in capsys.readouterr().err
    other = image_tree(tmp_path / "pets", splits=("",), classes=("cat", "dog", "emu"), size=8)
    assert main(["eval", "--checkpoint", str(released), "--data-dir", str(other), "--device", "cpu"]) == 2
    assert "not the classes the run of local-dir:" in capsys.readouterr().err


@pytest.mark.parametrize("files, held", [((), "it holds neither"), (("config.json",), "holds config.json only"),
                                         (("model.safetensors",), "holds model.safetensors only")])
def test_a_folder_that_is_neither_a_run_nor_a_release_is_one_line(files, held, folder_run, tmp_path, capsys):
    _, released, _ = folder_run
    folder = tmp_path / "neither"
    folder.mkdir()
    for name in files:
        (folder / name).write_bytes((released / name).read_bytes())
    for command in (["eval", "--checkpoint", str(folder)], ["analyze", "kernels", "--checkpoint", str(folder)]):
        assert main([*command, "--device", "cpu"]) == 2
        error = capsys.readouterr().err
        assert f"{folder} is neither a run folder of ssog train" in error and held in error, error
        assert "timm's hub layout (config.json and model.safetensors" in error and "Traceback" not in error


def test_released_weights_are_checked_as_a_runs_are(folder_run, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    _, released, data = folder_run
    diverged, reshaped = tmp_path / "diverged", tmp_path / "reshaped"
    for copy in (diverged, reshaped):
        copy.mkdir()
        for name in ("config.json", "model.safetensors"):
            (copy / name).write_bytes((released / name).read_bytes())
    weights = load_file(diverged / "model.safetensors")
    weights["head.bias"][1] = float("nan")
    save_file(weights, diverged / "model.safetensors")
    config = json.loads((reshaped / "config.json").read_text())
    config["model_args"]["embed_dim"] = 32  # weights of width 16
    (reshaped / "config.json").write_text(json.dumps(config))
    for copy, message in ((diverged, "holds non-finite weights (1 NaN/inf values in head.bias)"),
                          (reshaped, "cannot build the released model local-dir:")):
        assert main(["eval", "--checkpoint", str(copy), "--data-dir", str(data), "--device", "cpu"]) == 2
        printed = capsys.readouterr().err
        assert message in printed.strip().splitlines()[-1] and "Traceback" not in printed


def _edited_release(released: Path, copy: Path, edit=None) -> Path:
    """A copy of the folder ``released`` whose ``config.json`` ``edit(config)`` changed in place."""
    copy.mkdir()
    for name in ("config.json", "model.safetensors"):
        (copy / name).write_bytes((released / name).read_bytes())
    if edit is not None:
        config = json.loads((copy / "config.json").read_text())
        edit(config)
        (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_a_release_without_class_names_says_its_classes_cannot_be_checked(folder_run, tmp_path, capsys):
    _, released, _ = folder_run

    def no_label_names(config):
        del config["label_names"], config["pretrained_cfg"]["label_names"]

    unnamed = _edited_release(released, tmp_path / "unnamed", no_label_names)
    other = image_tree(tmp_path / "pets", splits=("",), classes=("ant", "bee", "cow"), size=8)
    assert main(["eval", "--checkpoint", str(unnamed), "--data-dir", str(other), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert (f"warning: local-dir:{unnamed} names no classes (its config.json has no label_names), so the class "
            f"folders of {other} cannot be checked against the classes it was trained on: they are taken in sorted "
            "order as its classes 0..2 (ant, bee, cow)") in captured.err
    assert "on imagefolder val from" in captured.out


def test_a_release_whose_data_config_disagrees_with_its_model_is_read_at_the_models_size(folder_run, tmp_path,
                                                                                         capsys):
    _, released, data = folder_run
    folder = ["--data-dir", str(data / "train"), "--device", "cpu", "--json"]
    assert main(["eval", "--checkpoint", str(released), *folder]) == 0
    expected = json.loads(capsys.readouterr().out)

    def twice_the_size(config):
        config["pretrained_cfg"]["input_size"] = [3, 16, 16]  # the model and its weights are 8 px

    larger = _edited_release(released, tmp_path / "larger", twice_the_size)
    assert main(["eval", "--checkpoint", str(larger), *folder]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert (result["img_size"], result["grid"], result["loss"]) == (8, [4, 4], expected["loss"])
    assert (f"the released model local-dir:{larger} was built for 8x8 images, the size its weights fit, but its "
            "config.json's pretrained_cfg input_size is [3, 16, 16]; its data is read at the model's size"
            ) in captured.err

    def no_crop(config):
        config["pretrained_cfg"]["crop_pct"] = None

    uncropped = _edited_release(released, tmp_path / "uncropped", no_crop)
    assert main(["eval", "--checkpoint", str(uncropped), *folder]) == 0
    assert (f"the released model local-dir:{uncropped} gives no crop_pct in its config.json's pretrained_cfg; "
            "timm's default 0.875 is used") in capsys.readouterr().err


def test_a_truncated_release_is_one_line(folder_run, tmp_path, capsys):
    _, released, data = folder_run
    cut = _edited_release(released, tmp_path / "cut")
    weights = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    assert main(["eval", "--checkpoint", str(cut), "--data-dir", str(data), "--device", "cpu"]) == 2
    printed = capsys.readouterr().err
    assert f"cannot build the released model local-dir:{cut} through timm: SafetensorError: " in \
        printed.strip().splitlines()[-1]
    assert "Traceback" not in printed


def test_a_released_folder_is_analysed_as_its_run(folder_run, tmp_path, capsys):
    run, released, _ = folder_run
    rows = {}
    for name, source in (("run", run), ("released", released)):
        assert main(["analyze", "kernels", "--checkpoint", str(source), "--device", "cpu",
                     "--output", str(tmp_path / name)]) == 0
        rows[name] = json.loads((tmp_path / name / "kernels.json").read_text())[0]
        assert f"{MODEL} ({name})" in capsys.readouterr().out  # the row names the folder
    assert rows["released"]["kernels"] == rows["run"]["kernels"] and rows["released"]["model"] == MODEL
    assert rows["released"]["source"] == f"local-dir:{released}"
    assert main(["analyze", "sinks", "--checkpoint", str(released), "--num-images", "4", "--device", "cpu",
                 "--output", str(tmp_path / "sinks")]) == 0
    assert json.loads((tmp_path / "sinks" / "sinks.json").read_text())[0]["data"] == "noise"


def test_a_released_folder_is_analysed_on_the_images_its_run_held_out(folder_run, tmp_path, capsys):
    from ssog.analysis import image_batches, load_model

    run, released, data = folder_run
    own = torch.cat(list(image_batches(load_model(checkpoint=run), num_images=6)))
    release = load_model(checkpoint=released)
    folder = dict(data_dir=str(data), val_split=6, num_images=6)
    assert torch.equal(torch.cat(list(image_batches(release, "imagefolder", split_seed=3, **folder))), own)
    assert not torch.equal(torch.cat(list(image_batches(release, "imagefolder", split_seed=4, **folder))), own)
    # the command line passes them on: DATA has no val/ folder, so without --val-split there is nothing to read
    assert main(["analyze", "lipschitz", "--checkpoint", str(released), "--data", "imagefolder", "--data-dir",
                 str(data), "--val-split", "6", "--split-seed", "3", "--num-images", "6", "--scales", "1",
                 "--iters", "3", "--device", "cpu", "--output", str(tmp_path / "lipschitz")]) == 0
    row = json.loads((tmp_path / "lipschitz" / "lipschitz.json").read_text())[0]
    assert (row["data"], row["points"], row["label"]) == ("imagefolder", 6, f"{MODEL} (released)")
    # a data folder named without a data set is not quietly replaced by noise
    assert main(["analyze", "sinks", "--checkpoint", str(released), "--data-dir", str(data), "--device", "cpu",
                 "--output", str(tmp_path / "noise")]) == 2
    assert "data_dir say which images of a data set to read" in capsys.readouterr().err


def test_a_released_folder_is_no_run_to_export_again(folder_run, tmp_path, capsys):
    _, released, _ = folder_run
    assert main(["export", "--format", "hf", "--checkpoint", str(released), "--output", str(tmp_path / "x")]) == 2
    assert "is a released model already" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_released_folder_exports_to_onnx(folder_run, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    _, released, _ = folder_run
    assert main(["export", "--checkpoint", str(released), "--output", str(tmp_path / "model.onnx"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["source"] == str(released) and result["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_the_files_of_a_release_being_read_are_never_written(name, folder_run, capsys):
    _, released, data = folder_run
    before = (released / name).read_bytes()
    for command in (["eval", "--data-dir", str(data), "--device", "cpu"], ["export"]):
        assert main([*command, "--checkpoint", str(released), "--output", str(released / name), "--overwrite"]) == 2
        assert "is the file this command reads" in capsys.readouterr().err
    assert (released / name).read_bytes() == before


def test_model_card_of_untrained_weights_says_so():
    meta, body = _front_matter_and_body(model_card(timm.create_model(MODEL, **KWARGS)))
    assert "datasets" not in meta and meta["license"] == "mit"
    assert "initial (random) weights of the architecture, not trained" in body and "Metrics" not in body
    assert 'hf-hub:USER/REPO' in body


@pytest.mark.parametrize("hub_id", ['a/b")\nimport os', "a/b/c", "a", "../b", "a/b c", "-a/b"])
def test_a_hub_id_that_is_no_user_repo_is_refused_before_the_work(hub_id, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ssog.models.create_model", lambda *a, **k: pytest.fail("built before refusing"))
    assert main(["export", "--format", "hf", "--model", MODEL, "--output", str(tmp_path / "hf"),
                 f"--hub-id={hub_id}"]) == 2
    assert f"--hub-id must be a hub repository USER/REPO (letters, digits and - _ .), got {hub_id!r}" \
        in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_card_header_is_yaml_whatever_the_summary_and_licence_say(run, tmp_path):
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("best.safetensors", "summary.json"):
        (copy / name).write_bytes((run / name).read_bytes())
    summary = json.loads((run / "summary.json").read_text())
    model = model_from_checkpoint(copy)
    model.pretrained_cfg = dict(model.pretrained_cfg, license="mit\nextra: injected\n---\n# not a heading")
    meta, body = _front_matter_and_body(model_card(model, copy))
    assert meta["license"] == "mit\nextra: injected\n---\n# not a heading" and "extra" not in meta
    assert meta["datasets"] == ["synthetic"] and body.startswith(f"# Model card for {MODEL}\n")

    for key, value, message in [("dataset", "digits\nlicense: evil", "dataset must be a data source's name"),
                                ("acc1", None, "is not a run's summary: it has no 'acc1'"),
                                ("epochs", "1\nlicense: evil", "epochs must be a whole number")]:
        broken = {k: v for k, v in summary.items() if k != key}
        if value is not None:
            broken[key] = value
        (copy / "summary.json").write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=re.escape(message)):
            model_card(model, copy)
        assert main(["export", "--format", "hf", "--checkpoint", str(copy), "--output", str(tmp_path / "hf")]) == 2
        assert not (tmp_path / "hf").exists()
    (copy / "summary.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a run's summary: a list, not a mapping"):
        model_card(model, copy)


def test_options_of_the_other_format_are_refused(tmp_path, capsys):
    assert main(["export", "--format", "hf", "--model", MODEL, "--img-size", "16", "--output", str(tmp_path)]) == 2
    assert "--img-size and --dynamic-size shape an ONNX file" in capsys.readouterr().err
    assert main(["export", "--model", MODEL, "--hub-id", "a/b", "--output", str(tmp_path / "b.onnx")]) == 2
    assert "--hub-id names the hub repository in the model card of --format hf" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_presets_without_weights_still_refuse_pretrained():
    with pytest.raises(ValueError, match="has no pretrained weights.*local-dir"):
        timm.create_model(MODEL, pretrained=True)


def test_checkpoint_path_at_another_img_size_resamples_pos_embed(run):
    source = load_checkpoint(run / "best.safetensors", only=("model",))["model"]
    model = timm.create_model(MODEL, num_classes=4, in_chans=3, img_size=16, patch_size=2, global_pool="token",
                              checkpoint_path=str(run / "best.safetensors"), **KWARGS)
    assert model.pos_embed.shape == (1, 1 + 8 * 8, 16) and source["pos_embed"].shape == (1, 1 + 4 * 4, 16)
    expected = resample_abs_pos_embed(source["pos_embed"], new_size=[8, 8], num_prefix_tokens=1)
    torch.testing.assert_close(model.pos_embed.detach(), expected)
    assert torch.equal(model.blocks[0].attn.mu, source["blocks.0.attn.mu"])
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 4)


def test_dynamic_img_size():
    model = timm.create_model(MODEL, dynamic_img_size=True, **KWARGS)
    assert model(torch.randn(2, 1, 12, 12)).shape == (2, 10) and model(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    fixed = timm.create_model(MODEL, dynamic_img_size=False, **KWARGS)
    assert fixed(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    with pytest.raises(ValueError, match="12x12 is not the model's 8x8.*dynamic_img_size=False"):
        fixed(torch.randn(2, 1, 12, 12))
