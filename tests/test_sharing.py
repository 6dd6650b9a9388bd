"""Weights the timm way: timm's Hugging Face layout (ssog export --format hf), local-dir:
loading with pretrained=True, checkpoint_path at another image size, dynamic_img_size."""
import json
import os

import pytest
import timm
import torch
from timm.layers import resample_abs_pos_embed

import ssog  # noqa: F401  (registers the models)
from ssog.cli import main
from ssog.train import load_checkpoint, train
from ssog.train.transfer import model_from_checkpoint

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
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert out.stat().st_mode & 0o777 == 0o755  # a folder others can read, as the files in it
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {"config.json": 0o644,
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
