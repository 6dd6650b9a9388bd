"""Model and mixer options: nested YAML numbers read as numbers; every numeric option checked
by its constructor (the mixer's by the model too) before any module is built, a bad value an
error that names the option and the expected range (and, in a run, the model and its options); a
non-finite first forward pass blamed on the model or the data, not the learning rate (issue
30, item 1)."""
import inspect
import math

import pytest
import timm
import torch

from ssog.cli import main
from ssog.layers import MultiHeadAttention, SSoGAttention
from ssog.models import LoopViT, OdeViT, ViT, create_model
from ssog.models._base import ViTBase
from ssog.ops import ssog_mix
from ssog.train import TrainingDiverged, resolve_config, train
from ssog.train.builders import build_model

#: Numeric constructor arguments checked otherwise, and how.
NOT_OPTIONS = {
    "kernel_scale": "computed by the models from their grid; SSoGAttention checks it as a (y, x) pair of numbers > 0",
}
GRID_EXTENT = ("(kernel_units='image': 8 is the extent of this model's 8x8 token grid; a longer offset places every "
               "kernel outside the image)")
#: (options, the whole error): the cases of issue 30 and one of each kind of rule.
BAD_OPTIONS = [
    (dict(num_heads=0), "num_heads=0: expected an integer >= 1"),
    (dict(patch_size=0), "patch_size=0: expected an integer >= 1 or a (height, width) pair of them"),
    (dict(embed_dim=-8), "embed_dim=-8: expected an integer >= 1"),
    (dict(mlp_ratio=-1.0), "mlp_ratio=-1.0: expected a finite number > 0"),
    (dict(steer_gate_init=math.nan), "steer_gate_init=nan: expected a finite number (the steering gates' starting "
                                     "logit)"),
    (dict(centre_radius=1e7), "centre_radius=10000000.0: expected a number in [0, 8] " + GRID_EXTENT),
    (dict(steer=["mu"], steer_radius=9.0), "steer_radius=9.0: expected a number in (0, 8] " + GRID_EXTENT),
    (dict(img_size=36, patch_size=8), "img_size=36 is not divisible by patch_size=8: expected a whole number of "
                                      "patches per side, not a 4.5 x 4.5 token grid"),
    (dict(embed_dim=30, num_heads=4), "embed_dim=30 is not divisible by num_heads=4: expected embed_dim a multiple "
                                      "of num_heads (heads of equal width, e.g. embed_dim=28, or num_heads=3)"),
    (dict(embed_dim=4, num_heads=8), "embed_dim=4 is not divisible by num_heads=8: expected embed_dim a multiple "
                                     "of num_heads (heads of equal width, e.g. embed_dim=8, or num_heads=4)"),
    (dict(depth=2.5), "depth=2.5: expected an integer >= 1"),
    (dict(drop_path_rate=1.0), "drop_path_rate=1.0: expected a probability in [0, 1)"),
    (dict(sigma_min=0.0), "sigma_min=0.0: expected a finite number > 0 (the width floor in tokens)"),
]


def _numeric_arguments(cls: type) -> set[str]:
    """Names of ``cls``'s constructor arguments annotated as numbers (``int``, ``float``, sizes)."""
    return {name for name, parameter in inspect.signature(cls).parameters.items()
            if any(word in str(parameter.annotation) for word in ("int", "float"))}


#: Each class with the smallest arguments it builds with; the families' arguments include the base's.
BUILT = {
    ViT: dict(img_size=8, patch_size=2, embed_dim=8, num_heads=2, depth=1, num_classes=3),
    LoopViT: dict(img_size=8, patch_size=2, embed_dim=8, num_heads=2, num_loops=1, num_classes=3),
    OdeViT: dict(img_size=8, patch_size=2, embed_dim=8, num_heads=2, num_classes=3),
    SSoGAttention: dict(dim=8, num_heads=2),
    MultiHeadAttention: dict(dim=8, num_heads=2),
}
NUMERIC = [(cls, name) for cls in BUILT for name in sorted(_numeric_arguments(cls) | (
    _numeric_arguments(ViTBase) if issubclass(cls, ViTBase) else set())) if name not in NOT_OPTIONS]


def test_the_numeric_arguments_are_found():
    names = {name for _, name in NUMERIC}
    assert {"num_heads", "patch_size", "centre_radius", "rtol", "nfe", "attn_drop", "num_prefix_tokens"} <= names


@pytest.mark.parametrize("cls, name", NUMERIC, ids=[f"{cls.__name__}-{name}" for cls, name in NUMERIC])
def test_every_numeric_constructor_argument_is_checked(cls, name):
    """Each numeric argument of a mixer or family, given a value no range holds (NaN), is refused
    by the constructor in one line naming it."""
    with pytest.raises(ValueError) as error:
        cls(**{**BUILT[cls], name: math.nan})
    assert str(error.value).startswith(f"{name}=nan: expected ") and "\n" not in str(error.value)


@pytest.mark.parametrize("options, message", BAD_OPTIONS, ids=[next(iter(o)) for o, _ in BAD_OPTIONS])
def test_a_bad_option_is_one_line_naming_it_and_its_range_before_anything_is_built(options, message, monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("a module was built before the options were checked")

    monkeypatch.setattr("ssog.models._base.PatchEmbed", built)
    for create in (create_model, timm.create_model):
        with pytest.raises(ValueError) as error:
            create("ssog_vit_micro_patch1_8", **options)
        assert str(error.value) == message


@pytest.mark.parametrize("name, options, message", [
    ("ssog_loopvit_micro_patch1_8", dict(num_loops=0), "num_loops=0: expected an integer >= 1"),
    ("ssog_odevit_micro_patch1_8", dict(nfe=0), "nfe=0: expected an integer >= 1"),
    ("ssog_odevit_micro_patch1_8", dict(solver="dopri5", rtol=0.0), "rtol=0.0: expected a finite tolerance > 0"),
    ("mha_vit_micro_patch1_8", dict(proj_drop_rate=-0.1), "proj_drop_rate=-0.1: expected a probability in [0, 1)"),
])
def test_each_family_checks_its_own_options(name, options, message):
    with pytest.raises(ValueError) as error:
        timm.create_model(name, **options)
    assert str(error.value) == message


def test_the_mixers_check_their_options():
    with pytest.raises(ValueError, match=r"^num_atoms=0: expected an integer >= 1$"):
        SSoGAttention(dim=8, num_heads=2, num_atoms=0)
    with pytest.raises(ValueError, match=r"^dim=8 is not divisible by num_heads=3"):
        MultiHeadAttention(dim=8, num_heads=3)
    with pytest.raises(ValueError, match=r"^centre_radius=1e\+30: expected a number in \[0, 1048576\] \(tokens\)$"):
        SSoGAttention(dim=8, num_heads=2, centre_radius=1e30)  # no grid: the operator's furthest centre
    # a kernel length the model does not use is not held to the grid
    assert timm.create_model("ssog_vit_micro_patch1_8", centre_init="zero", centre_radius=20.0, steer_radius=20.0)


def test_a_bad_model_option_in_ssog_train_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--set", "model_kwargs.num_heads=0", "--output", "run"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ssog train: error: cannot create ssog_vit_digits_patch2_8 with "
                                                   "model_kwargs {'num_heads': 0}: ")
    assert lines[0].endswith(": num_heads=0: expected an integer >= 1")
    assert not (tmp_path / "run").exists()


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
    cfg = tiny_config(tmp_path / "run", std=[1e-45])  # images that normalise to inf
    with pytest.raises(TrainingDiverged, match="first forward pass is not finite.*not the learning rate") as error:
        train(cfg)
    assert "lower lr" not in str(error.value)


def test_a_fractional_grid_is_refused_not_truncated():
    with pytest.raises(ValueError, match=r"grid_size must be a pair \(Hg, Wg\) of positive ints, got \(4.5, 5\)"):
        ssog_mix(torch.zeros(1, 1, 20, 4), torch.zeros(1, 1, 2), torch.ones(1, 1, 2), torch.ones(1, 1), (4.5, 5))
    with pytest.raises(ValueError, match="steer_gate_init=inf: expected a finite number"):
        SSoGAttention(dim=8, num_heads=2, steer=("mu",), steer_gate_init=float("inf"))
