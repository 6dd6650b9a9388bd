"""ssog export and eval refuse what they cannot honour, in one line: --num-classes for a run, an
--atol that is no tolerance, a file that does not compute the model (nothing written), an empty
--output; and export's paths mean what the user reads (a link, a/../b)."""
import pytest
import torch

from ssog.cli import main
from ssog.export import ExportMismatch
from ssog.models import create_model
from ssog.train import save_checkpoint


@pytest.mark.parametrize("atol", ["-1", "nan", "inf"])
def test_atol_must_be_a_tolerance(atol, tmp_path, capsys):
    assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--output", str(tmp_path / "m.onnx"),
                 "--atol", atol]) == 2
    assert "--atol must be a finite number >= 0" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


def test_num_classes_is_refused_for_a_run(tmp_path, capsys):
    checkpoint = save_checkpoint(tmp_path / "run" / "best.safetensors", {
        "kind": "best", "model": create_model("ssog_vit_micro_patch1_8", num_classes=3).state_dict()})
    assert main(["export", "--checkpoint", str(checkpoint), "--num-classes", "5",
                 "--output", str(tmp_path / "m.onnx")]) == 2
    assert "a run's checkpoint keeps the classes it trained on" in capsys.readouterr().err


@pytest.mark.slow
def test_an_export_that_does_not_match_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    def differs(*args, **kwargs):
        raise ExportMismatch("onnxruntime's output differs from eager PyTorch by 1 (> 0.0001)")

    monkeypatch.setattr("ssog.export.onnx_file.verify_onnx", differs)
    assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--output", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not compute the model" in err and "nothing was written" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_hf_export_writes_through_a_link_and_creates_no_folder_on_the_way(tmp_path):
    target = tmp_path / "models" / "empty"
    target.mkdir(parents=True)
    (tmp_path / "link").symlink_to(target)
    assert main(["export", "--format", "hf", "--model", "ssog_vit_micro_patch1_8", "--output",
                 str(tmp_path / "link")]) == 0
    assert (target / "model.safetensors").is_file() and (tmp_path / "link").is_symlink()
    assert main(["export", "--format", "hf", "--model", "ssog_vit_micro_patch1_8", "--output",
                 str(tmp_path / "a" / ".." / "b")]) == 0
    assert (tmp_path / "b" / "model.safetensors").is_file() and not (tmp_path / "a").exists()


def test_eval_output_that_names_no_file_is_refused(capsys):
    assert main(["eval", "--checkpoint", "anything", "--output", ""]) == 2
    assert "--output is empty" in capsys.readouterr().err


@pytest.mark.slow
def test_export_takes_a_runs_ema_weights(tiny_config, tmp_path, capsys):
    from ssog.train import train

    train(tiny_config(tmp_path / "run", epochs=1, ema_decay=0.5))
    assert main(["export", "--format", "hf", "--checkpoint", str(tmp_path / "run"), "--ema",
                 "--output", str(tmp_path / "hf")]) == 0
    from safetensors.torch import load_file

    from ssog.train import load_checkpoint
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    ema = load_checkpoint(tmp_path / "run" / "last.safetensors", only=("ema",))["ema"]  # a 1-epoch run's best
    assert all(torch.equal(exported[name], ema[name]) for name in ema)
    assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--ema", "--output", str(tmp_path / "m.onnx")]) == 2
    assert "--ema exports a run's EMA weights" in capsys.readouterr().err

