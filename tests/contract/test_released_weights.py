"""The weights released in docs/results (timm's hub layout, written by `ssog export --format hf`)
load with `timm.create_model('local-dir:...', pretrained=True)` and are the model their card
and config describe."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import timm
import torch

import ssog  # noqa: F401  (registers the models)

ROOT = Path(__file__).resolve().parents[2]
RELEASES = sorted(config.parent for config in (ROOT / "docs" / "results").glob("*/weights/*/config.json"))


def test_releases_are_found():
    assert RELEASES, "docs/results holds no released weights"


@pytest.mark.parametrize("folder", RELEASES, ids=[str(f.relative_to(ROOT / "docs" / "results")) for f in RELEASES])
def test_released_weights_load_as_their_card_says(folder):
    config = json.loads((folder / "config.json").read_text())
    card = (folder / "README.md").read_text()
    assert (folder / "model.safetensors").stat().st_size < 2**20  # released weights stay small
    model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    assert model.pretrained_cfg["architecture"] == config["architecture"]
    assert model.num_classes == config["num_classes"] == len(config["label_names"])
    params = int(re.search(r"  - Params: ([\d,]+)", card).group(1).replace(",", ""))
    assert sum(p.numel() for p in model.parameters()) == params
    side = config["pretrained_cfg"]["input_size"][-1]
    with torch.no_grad():
        logits = model(torch.zeros(2, 3, side, side))
    assert logits.shape == (2, config["num_classes"]) and torch.isfinite(logits).all()
    # trained weights, not an initialisation: the classifier's bias is not the initial zeros
    assert model.get_classifier().bias.abs().max() > 0
