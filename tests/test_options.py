"""Model and mixer options: nested YAML numbers read as numbers, every bad value an error that
names the model and its options, and a non-finite first forward pass blamed on the model or
the data, not the learning rate (issue 30, item 1)."""
import pytest
import torch

from ssog.layers import SSoGAttention
from ssog.ops import ssog_mix
from ssog.train import TrainingDiverged, resolve_config, train
from ssog.train.builders import build_model


def test_yaml_floats_without_a_dot_are_numbers_at_any_depth(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("lr: 1e-3\nmodel_kwargs: {sigma_min: 5e-1}\nsched_kwargs: {noise_std: 1e-2}\n")
    cfg = resolve_config(recipe, None, [("model_kwargs.centre_radius", 2e0)])
    assert cfg.model_kwargs == {"sigma_min": 0.5, "centre_radius": 2.0} and cfg.lr == 1e-3
    assert cfg.sched_kwargs == {"noise_std": 0.01}
    from ssog.train import parse_override
    assert parse_override("model_kwargs.sigma_min=1e-1") == ("model_kwargs.sigma_min", 0.1)


@pytest.mark.parametrize("option, value", [("num_heads", 0), ("patch_size", 0), ("embed_dim", -8),
                                           ("mlp_ratio", -1.0), ("steer_gate_init", float("nan"))])
def test_a_bad_model_option_names_the_model_and_its_options(option, value, tiny_config, tmp_path):
    cfg = tiny_config(tmp_path, model_kwargs={"embed_dim": 16, "num_heads": 2, "depth": 2, "patch_size": 2,
                                              option: value})
    with pytest.raises(ValueError, match=rf"cannot create {cfg.model} with model_kwargs .*'{option}'"):
        build_model(cfg, 4, 3, 8)


def test_a_non_finite_first_forward_pass_is_not_blamed_on_the_learning_rate(tiny_config, tmp_path):
    cfg = tiny_config(tmp_path / "run", model_kwargs={**tiny_config(tmp_path).model_kwargs, "centre_radius": 1e7})
    with pytest.raises(TrainingDiverged, match="first forward pass is not finite.*not the learning rate") as error:
        train(cfg)
    assert "lower lr" not in str(error.value)


def test_a_fractional_grid_is_refused_not_truncated():
    with pytest.raises(ValueError, match=r"grid_size must be a pair \(Hg, Wg\) of positive ints, got \(4.5, 5\)"):
        ssog_mix(torch.zeros(1, 1, 20, 4), torch.zeros(1, 1, 2), torch.ones(1, 1, 2), torch.ones(1, 1), (4.5, 5))
    with pytest.raises(ValueError, match="steer_gate_init must be a finite number"):
        SSoGAttention(dim=8, num_heads=2, steer=("mu",), steer_gate_init=float("inf"))
