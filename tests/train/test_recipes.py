"""Every recipe under configs/: its real model builds (on the meta device), its references
hold, and it keeps the paper's settings. tests/integration/test_recipe_tier.py trains each at its real size."""
from pathlib import Path

import pytest
import torch

from ssog.train import load_recipe, recipe_variants, resolve_config
from ssog.train.builders import build_model

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(p for p in CONFIGS.rglob("*.yaml") if "_base" not in p.parts)
RUNS = [(p, v) for p in RECIPES for v in (recipe_variants(p) or [None])]
CLASSES = {"cifar10": 10, "cifar100": 100, "imagefolder": 1000}


def _id(run):
    path, variant = run
    return f"{path.relative_to(CONFIGS)}:{variant}"


def test_there_is_a_recipe_for_every_experiment_family():
    names = {p.stem for p in RECIPES}
    tables = {"table01", "table02", "table06", "table07", "table08", "table09", "table11", "table12",
              "table14", "table15", "table16"}
    assert tables <= {n.split("_")[0] for n in names}
    assert {f"width_{f}_{op}" for f in ("vit", "loopvit", "odevit") for op in ("mha", "ssog")} <= names
    assert "cifar10_tiny" in names


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=[_id(r) for r in RUNS])
def test_recipe_model_builds_at_full_size(run):
    path, variant = run
    cfg = resolve_config(path, variant)
    with torch.device("meta"):  # the real size: checks the model constructs, allocates nothing
        model = build_model(cfg, CLASSES.get(cfg.dataset, 10), 3, cfg.img_size or 32)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_recipe_checkpoint_references_point_at_recipe_outputs():
    """init_from paths name the default output (runs/<recipe>/<variant>) of an existing recipe."""
    outputs = {str(Path("runs") / p.stem / (v or "run")) for p, v in RUNS}
    for path, variant in RUNS:
        source = resolve_config(path, variant).init_from
        if source is not None:
            assert str(Path(source).parent) in outputs, (path, variant, source)


def test_recipes_keep_the_papers_settings():
    for path in CONFIGS.glob("width/*.yaml"):
        settings = load_recipe(path)
        assert (settings["img_size"], settings["epochs"], settings["augment"]) == (224, 500, "strong")
    assert resolve_config(CONFIGS / "ablations/table01_steering.yaml", "fixed").model_kwargs["num_atoms"] == 4


def _initial_kernels(path: str, variant: str | None) -> dict:
    cfg = resolve_config(CONFIGS / path, variant)
    with torch.device("meta"):
        model = build_model(cfg, 100, 3, cfg.img_size or 32)
    return model.config()["initial_kernels"]


def test_paper_scale_recipes_start_kernels_in_image_units():
    """224 px at patch 16 (14x14 tokens): the 8x8 defaults scaled by 14/8, and the steering
    radii of Table 9 in the paper's own tokens."""
    start = _initial_kernels("width/width_vit_ssog.yaml", "base")
    assert start["centre_radius"] == [3.5, 3.5] and start["width_max"] == [7.0, 7.0]
    for variant, radius in (("radius_2", 2.0), ("radius_4", 4.0), ("radius_7", 7.0)):
        assert _initial_kernels("ablations/table09_radius.yaml", variant)["steer_radius"] == [radius, radius]
    assert _initial_kernels("ablations/table01_steering.yaml", "full_cold")["steer_radius"] == [7.0, 7.0]
    # the fine-grid recipe: twice the 8x8 start; its token-unit row and the old patch-2 row: the 8x8 start
    assert _initial_kernels("cifar10_fine.yaml", "ssog")["centre_radius"] == [4.0, 4.0]
    assert _initial_kernels("cifar10_fine.yaml", "ssog_token_units")["centre_radius"] == [2.0, 2.0]
    assert _initial_kernels("ablations/cpu_accuracy.yaml", "ssog_patch2")["centre_radius"] == [1.0, 1.0]


def test_cifar100_16x16_rows_are_the_cifar10_fine_models_at_its_rates():
    """The CIFAR-100 `*_p2` rows (issue 57): the CIFAR-10 16x16 study's models, rates and kernel
    start (image units: the 8x8 ring of 2 tokens doubled); the continuous pair's 5-epoch checks
    at half, one and double its rate."""
    fine = {"vit_mha": "mha", "vit_ssog": "ssog", "loopvit_mha": "mha_loopvit",
            "loopvit_ssog": "ssog_loopvit", "odevit_mha": "mha_odevit", "odevit_ssog": "ssog_odevit"}
    for row, source in fine.items():
        ours = resolve_config(CONFIGS / "cifar100.yaml", f"{row}_p2")
        theirs = resolve_config(CONFIGS / "cifar10_fine.yaml", source)
        assert (ours.model, ours.model_kwargs, ours.lr, ours.epochs) == (theirs.model, theirs.model_kwargs,
                                                                          theirs.lr, 15), row
    assert _initial_kernels("cifar100.yaml", "odevit_ssog_p2")["centre_radius"] == [4.0, 4.0]
    checks = {"odevit_mha_p2": ("2e-3", "4e-3", "8e-3"), "odevit_ssog_p2": ("4e-3", "8e-3", "1.6e-2")}
    for row, rates in checks.items():
        cfg = resolve_config(CONFIGS / "cifar100.yaml", row)
        for factor, rate in zip((0.5, 1, 2), rates):
            sweep = resolve_config(CONFIGS / "cifar100.yaml", f"sweep_{row}_lr{rate}")
            assert (sweep.model, sweep.model_kwargs, sweep.lr, sweep.epochs) == (cfg.model, cfg.model_kwargs,
                                                                                  cfg.lr * factor, 5)


@pytest.mark.parametrize("recipe, tarball", [("cifar100.yaml", "cifar100-train.tar.gz"),
                                             ("tinyimagenet.yaml", "tiny-imagenet-200-train.tar.gz")])
def test_a_recipe_run_without_its_data_names_the_tarball_and_the_flag(recipe, tarball, tmp_path, capsys):
    from ssog.cli import main

    variant = recipe_variants(CONFIGS / recipe)[0]
    assert main(["train", "--config", str(CONFIGS / recipe), "--variant", variant,
                 "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"needs --data-dir (data_dir): extract {tarball}" in err
    assert not (tmp_path / "run").exists()
