"""ssog.analysis.steering and `ssog analyze steering`: how far steering moves the mixtures."""
from __future__ import annotations

import json
import math

import pytest
import torch

from ssog.analysis import mixture_moves, steering_moves
from ssog.cli import main
from ssog.models import create_model

SMALL = dict(embed_dim=16, num_heads=2)  # on the 8x8 single-channel preset: 65 tokens


def steered_model(family: str = "vit", steer=("mu", "sigma", "lambda"), gate: float | None = None, **kwargs):
    torch.manual_seed(0)
    depth = {"vit": "depth", "loopvit": "num_loops"}[family]
    model = create_model(f"ssog_{family}_micro_patch1_8", **SMALL, **{depth: 2}, steer=steer, **kwargs).eval()
    if gate is not None:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "steer_gate" in name:
                    parameter.fill_(gate)
                elif "steer_proj" in name:
                    parameter.normal_(0, 0.5)
    return model


def images(batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def test_mixture_moves_by_hand():
    heads, atoms, batch, queries = 2, 3, 2, 4
    mu, sigma = torch.zeros(heads, atoms, 2), torch.ones(heads, atoms, 2)
    weight = torch.tensor([1.0, 0.0, 0.0]).expand(heads, atoms)
    mu_q = torch.tensor([3.0, 4.0]).expand(batch, heads, queries, atoms, 2).clone()
    mu_q[:, 1] = 0  # head 1 keeps its centres
    sigma_q = torch.full((batch, heads, queries, atoms, 2), 2.0)
    weight_q = torch.tensor([0.0, 0.5, 0.5]).expand(batch, heads, queries, atoms)
    moves = mixture_moves(mu, sigma, weight, (mu_q, sigma_q, weight_q))
    assert moves["mu_shift"].tolist() == pytest.approx([5.0, 0.0])
    assert moves["sigma_log_ratio"].tolist() == pytest.approx([math.log(2)] * 2)
    assert moves["weight_tv"].tolist() == pytest.approx([1.0, 1.0])


def test_closed_gates_barely_move_and_open_ones_do():
    cold = steering_moves(steered_model(), images())
    opened = steering_moves(steered_model(gate=0.0), images())
    assert [m["module"] for m in cold["mixers"]] == ["blocks.0.attn", "blocks.1.attn"]
    for closed, open_ in zip(cold["mixers"], opened["mixers"]):
        assert closed["gates"]["mu"] == pytest.approx(torch.sigmoid(torch.tensor(-8.0)).item())
        assert open_["gates"]["lambda"] == pytest.approx(0.5)
        for key in ("mu_shift", "sigma_log_ratio", "weight_tv"):
            assert 0 <= closed[key] < 1e-2 < open_[key] <= open_[key + "_top_head"]


def test_a_projection_of_zero_moves_nothing_whatever_the_gate():
    model = steered_model(gate=4.0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "steer_proj" in name:
                parameter.zero_()
    for mixer in steering_moves(model, images())["mixers"]:
        assert mixer["mu_shift"] == mixer["sigma_log_ratio"] == mixer["weight_tv"] == 0.0


def test_only_the_steered_parameters_are_measured_and_a_shared_mixer_at_each_application():
    result = steering_moves(steered_model("loopvit", steer=("sigma",), gate=0.0), images())
    (mixer,) = result["mixers"]
    assert mixer["applications"] == 2 and mixer["steer"] == ["sigma"] and set(mixer["gates"]) == {"sigma"}
    assert "sigma_log_ratio" in mixer and "mu_shift" not in mixer and "weight_tv" not in mixer


def test_a_model_without_steering_is_refused():
    with pytest.raises(ValueError, match="no steered SSoG mixer"):
        steering_moves(steered_model(steer=()), images())
    with pytest.raises(ValueError, match="no SSoGAttention"):
        steering_moves(create_model("mha_vit_micro_patch1_8", **SMALL, depth=1), images())


def test_command_writes_the_table_of_a_trained_steered_model(tmp_path, capsys):
    from ssog.train import TrainConfig, save_checkpoint

    model = steered_model(gate=0.0)
    config = TrainConfig(model="ssog_vit_micro_patch1_8",
                         model_kwargs={**SMALL, "depth": 2, "steer": ["mu", "sigma", "lambda"]}, dataset="digits")
    save_checkpoint(tmp_path / "run" / "best.safetensors",
                    {"kind": "best", "config": config.to_dict(), "model": model.state_dict()})
    out = tmp_path / "out"
    code = main(["analyze", "steering", "--checkpoint", str(tmp_path / "run"), "--num-images", "8",
                 "--device", "cpu", "--output", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    (result,) = json.loads((out / "steering.json").read_text())
    assert result["images"] == 8 and result["data"] == "digits" and len(result["mixers"]) == 2
    markdown = (out / "steering.md").read_text().splitlines()
    assert markdown[0] == ("| model | mixer | applications | gates open | \\|d mu\\| tokens | \\|log sigma ratio\\| "
                           "| weights TV |")
    assert len(markdown) == 4 and "mu 0.5 sigma 0.5 lambda 0.5" in markdown[2]
    assert f"{result['mixers'][0]['mu_shift']:.3g}" in printed
    assert (out / "steering.png").read_bytes()[:4] == b"\x89PNG"
    again = main(["analyze", "steering", "--checkpoint", str(tmp_path / "run"), "--device", "cpu",
                  "--output", str(out)])
    assert again != 0 and "--overwrite" in capsys.readouterr().err  # an earlier result is kept


def test_the_script_measures_a_fresh_model_of_a_runs_recipe(tmp_path, tiny_config, run_child, ssog_cli):
    """scripts/steering_at_init.py: a fresh model of the run's config, on its validation images."""
    import sys

    from ssog.train import train

    config = tiny_config(tmp_path / "run", epochs=1, val_split=16)
    config.model_kwargs = {**config.model_kwargs, "steer": ["mu"], "steer_gate_init": 0.0}
    train(config)
    script = ssog_cli.repo / "scripts" / "steering_at_init.py"
    done = run_child([sys.executable, str(script), str(tmp_path / "run"), "--num-images", "8"], 120,
                     env=ssog_cli.env())
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "(run at init)" in line]
    assert len(rows) == 2 and all("mu 0.5" in row for row in rows), done.stdout
    assert all(row.split()[-2:] == ["-", "-"] for row in rows)  # sigma, lambda: not steered
