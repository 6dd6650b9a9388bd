"""ssog.analysis and `ssog analyze`: sink metrics, Lipschitz bounds and estimates, kernels, the
continuous field's branches."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from ssog.analysis import (
    AnalysisModel, field_branches, field_lipschitz_bound, high_norm_counts, image_batches, kernel_maps,
    kernel_statistics, lipschitz_analysis, load_model, local_lipschitz, mixer_lipschitz_bound, most_attended_keys,
    prefix_mass, residual_rollout, run_field, run_kernels, run_lipschitz, run_sinks, same_key_percent, sink_diagnostics,
    kernels_table, sink_scores, sinks_table, token_rms,
)
from ssog.cli import main
from ssog.layers import SSoGAttention
from ssog.models import create_model
from ssog.models.odevit import timestep_embedding

SMALL = dict(embed_dim=16, num_heads=2)  # on the 8x8 single-channel preset: 65 tokens
DEPTH = {"vit": "depth", "loopvit": "num_loops", "odevit": "nfe"}


def small_model(op: str, family: str, applications: int = 3, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    model = create_model(f"{op}_{family}_micro_patch1_8", **SMALL, **{DEPTH[family]: applications}, **kwargs)
    return model.eval()


def noise(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def open_field_gates(model: torch.nn.Module) -> None:
    """A fresh ODE field is zero (adaLN-Zero); random modulation makes it a real test (with
    ``time_kernels``, kernels that move with t too)."""
    torch.manual_seed(2)
    for modulation in (model.field.adaLN_modulation, model.field.kernel_modulation):
        if modulation is not None:
            torch.nn.init.normal_(modulation[1].weight, std=0.3)
            torch.nn.init.normal_(modulation[1].bias, std=0.3)


# ---------------------------------------------------------------------------- sink metrics
def test_uniform_attention_has_sink_score_one():
    uniform = torch.full((3, 2, 10, 10), 0.1)
    assert torch.allclose(sink_scores(uniform), torch.ones(3))


def test_one_key_sink_scores_the_token_count_and_is_the_most_attended():
    attn = torch.zeros(2, 3, 10, 10)
    attn[..., 4] = 1.0
    assert torch.allclose(sink_scores(attn), torch.full((2,), 10.0))
    assert (most_attended_keys(attn) == 4).all()


def test_rollout_of_identity_maps_is_identity():
    eye = torch.eye(7).expand(2, 7, 7)
    assert torch.equal(residual_rollout([eye, eye, eye]), eye)


def test_rollout_multiplies_later_layers_on_the_left_and_stays_stochastic():
    a, b = torch.rand(2, 2, 5, 5).softmax(-1).unbind(0)
    half = lambda m: (m + torch.eye(5)) / 2  # noqa: E731
    rollout = residual_rollout([a, b])
    assert torch.allclose(rollout, half(b) @ half(a))
    assert torch.allclose(rollout.sum(-1), torch.ones(2, 5))


def test_same_key_percent_averages_the_share_of_each_heads_mode():
    keys = torch.tensor([[0, 1], [0, 2], [1, 2], [0, 2]])  # modes 0 and 2, each 3 of 4 images
    assert same_key_percent(keys) == pytest.approx(75.0)


def test_prefix_mass_reads_only_patch_queries():
    attn = torch.zeros(1, 1, 3, 3)
    attn[0, 0, 0, 0] = 1.0  # the prefix query reading itself does not count
    attn[0, 0, 1:, 0] = torch.tensor([0.5, 0.1])
    assert prefix_mass(attn, 1).item() == pytest.approx(0.3)


def test_high_norm_counts_tokens_above_three_medians():
    tokens = torch.ones(2, 5, 4)
    tokens[0, 2] *= 10
    assert high_norm_counts(tokens) == (1, 10)


@pytest.mark.parametrize("family", ["vit", "loopvit", "odevit"])
def test_fixed_ssog_same_key_is_100_and_patches_never_read_cls(family):
    result = sink_diagnostics(small_model("ssog", family), [noise(), noise(3)])
    assert result["layers"] == 3  # every block / loop iteration / solver step is a layer
    assert result["images"] == 7
    assert result["same_key_percent"] == 100.0
    assert result["cls_percent"] is None
    assert result["sink_worst"] >= result["sink_mean"] >= 1.0
    assert 0.0 <= result["high_norm_percent"] <= 100.0


def test_mha_sinks_report_cls_mass_and_a_layer_per_application():
    result = sink_diagnostics(small_model("mha", "odevit", 4), [noise()])
    assert result["layers"] == 4
    assert [row["module"] for row in result["per_layer"]] == ["field.attn"] * 4
    assert 0.0 < result["cls_percent"] < 100.0


def test_sinks_refuse_a_varying_layer_sequence():
    model = small_model("ssog", "vit", 2)
    calls = iter([model.forward_features, lambda x: model.blocks[0].attn(*model.embed(x))])

    class Switching(torch.nn.Module):  # second batch applies one mixer instead of two
        def __init__(self):
            super().__init__()
            self.inner, self.norm, self.num_prefix_tokens = model, model.norm, 1

        def forward_features(self, x):
            return next(calls)(x)

    with pytest.raises(ValueError, match="fixed sequence of layers"):
        sink_diagnostics(Switching(), [noise(), noise()])


# ---------------------------------------------------------------------------- Lipschitz
def test_power_iteration_finds_the_operator_norm_of_a_fixed_ssog_mixer():
    torch.manual_seed(0)
    mixer = SSoGAttention(8, 2, num_prefix_tokens=1).double()
    with torch.no_grad():
        mixer.mu.normal_(std=1.0)
    grid = (3, 4)
    x = torch.randn(1, 13, 8, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda z: mixer(z, grid), x).reshape(13 * 8, 13 * 8)
    exact = torch.linalg.matrix_norm(jac, ord=2).item()
    estimate = local_lipschitz(lambda z: mixer(z, grid), x, iters=50).item()
    assert estimate == pytest.approx(exact, rel=1e-6)
    assert exact <= mixer_lipschitz_bound(mixer, grid) * (1 + 1e-9)


@pytest.mark.parametrize("family,options", [("vit", {}), ("odevit", {}), ("odevit", {"time_kernels": True})])
def test_fixed_ssog_estimates_never_exceed_the_bound(family, options):
    """The bound and the estimates take each call's kernels: with ``time_kernels``, those at its t."""
    model = small_model("ssog", family, 2, **options)
    if family == "odevit":
        open_field_gates(model)
    result = lipschitz_analysis(model, noise(2), scales=(1, 10, 1000), iters=8)
    targets = result["mixers"] + result["field"]
    assert len(result["mixers"]) == (2 if family == "vit" else 1)
    assert len(result["field"]) == (2 if family == "odevit" else 0)
    for target in targets:
        assert target["bound"] is not None and target["within_bound"]
        assert 0 < max(target["local"]) <= target["bound"]
    summary = result["summary"]["field" if family == "odevit" else "mixer"]
    assert summary["within_bound"] and max(summary["ball"]) <= summary["bound"]


def test_mha_estimates_grow_with_scale_and_have_no_bound():
    model = small_model("mha", "odevit", 2)
    open_field_gates(model)
    # from 0.1 to 10 the softmax goes from nearly uniform to sharp (much larger, it saturates and
    # the local estimate falls again; the "ball" curve keeps the largest so far)
    result = lipschitz_analysis(model, noise(2), scales=(0.1, 10), iters=8)
    for target in ("mixer", "field"):
        curve = result["summary"][target]
        assert curve["bound"] is None
        assert curve["ball"][-1] > 10 * curve["ball"][0]


def test_no_bound_for_steered_ssog_or_a_layernorm_field():
    steered = small_model("ssog", "vit", 1, steer=("mu",))
    assert mixer_lipschitz_bound(steered.blocks[0].attn, (8, 8)) is None
    layernorm = small_model("ssog", "odevit", 1, field_norm="layernorm")
    assert field_lipschitz_bound(layernorm.field, 0.0, (8, 8)) is None
    fresh = small_model("ssog", "odevit", 1)
    assert field_lipschitz_bound(fresh.field, 0.5, (8, 8)) == 0.0  # adaLN-Zero: f = 0


def test_lipschitz_rejects_bad_scales():
    with pytest.raises(ValueError, match="scales"):
        lipschitz_analysis(small_model("ssog", "vit", 1), noise(1), scales=(0, 1))


# ---------------------------------------------------------------------------- kernels
def test_kernel_statistics_and_maps_follow_the_parameters():
    model = small_model("ssog", "vit", 2)
    mixer = model.blocks[1].attn
    with torch.no_grad():
        mixer.mu.zero_()
        mixer.mu[1, 0] = torch.tensor([3.0, 4.0])  # |mu| = 5 for one of 2 x 4 atoms
        mixer.rho.fill_(-30.0)  # sigma -> sigma_min
        mixer.logits.zero_()
        mixer.logits[1, 0] = 50.0  # head 1 is (almost) only its shifted atom
        model.blocks[0].attn.logits.zero_()
    stats = kernel_statistics(model)["mixers"][1]
    assert stats["min_sigma"] == pytest.approx(0.25)
    assert stats["mean_abs_mu"] == pytest.approx(5 / 8)
    assert stats["weight"][0] == pytest.approx([0.25] * 4)
    assert stats["effective_atoms"] == pytest.approx((4 + 1) / 2)  # head 0 spreads over all 4, head 1 over 1
    assert kernel_statistics(model)["effective_atoms"] == pytest.approx((4 + 4 + 4 + 1) / 4)
    maps = kernel_maps(mixer, (8, 8), query=(2, 2))
    assert torch.allclose(maps.sum(dim=(1, 2)), torch.ones(2, dtype=maps.dtype))
    assert divmod(int(maps[1].argmax()), 8) == (5, 6)  # query + mu


def test_kernels_that_move_with_t_are_shown_along_the_flow(tmp_path):
    """With ``time_kernels`` the statistics and maps are the mixture at t = 0, 1/2 and 1 (what the
    field uses there), not the unmoved parameters; a fixed field's mixer is listed once."""
    model = small_model("ssog", "odevit", 4, time_kernels=True)
    open_field_gates(model)
    mixers = kernel_statistics(model)["mixers"]
    assert [m["module"] for m in mixers] == ["field.attn@t=0.00", "field.attn@t=0.50", "field.attn@t=1.00"]
    for stats in mixers:
        t = torch.tensor(float(stats["module"].rpartition("=")[2]))
        mu, sigma, weight = model.field.kernels_at(t)
        for key, value in (("mu", mu), ("sigma", sigma), ("weight", weight)):
            assert torch.allclose(torch.tensor(stats[key], dtype=torch.float64), value.double(), atol=1e-6)
    assert not torch.allclose(torch.tensor(mixers[0]["mu"]), torch.tensor(mixers[2]["mu"]))
    offset = model.field.kernel_offset(torch.tensor(1.0))
    moved = kernel_maps(model.field.attn, (8, 8), kernel_offset=offset)
    assert not torch.allclose(moved, kernel_maps(model.field.attn, (8, 8)))
    assert torch.allclose(moved.sum(dim=(1, 2)), torch.ones(2, dtype=moved.dtype))
    assert [m["module"] for m in kernel_statistics(small_model("ssog", "odevit", 4))["mixers"]] == ["field.attn"]
    from ssog.analysis.plots import plot_kernels
    assert plot_kernels(model, tmp_path / "kernels.png").stat().st_size > 0


def test_kernels_need_an_ssog_model():
    with pytest.raises(ValueError, match="no SSoGAttention"):
        kernel_statistics(small_model("mha", "vit", 1))


# ---------------------------------------------------------------------------- field branches
@pytest.mark.parametrize("op", ["mha", "ssog"])
def test_field_branches_are_the_gated_mixer_and_mlp_at_each_euler_time(op):
    model = small_model(op, "odevit", 4)
    open_field_gates(model)
    images = noise()
    result = field_branches(model, images)
    steps = result["evaluations"]
    assert [e["t"] for e in steps] == [0.0, 0.25, 0.5, 0.75] and result["images"] == 4
    field = model.field
    x, grid = model.embed(images)  # recompute the first evaluation by hand
    with torch.no_grad():
        emb = timestep_embedding(torch.tensor(0.0), 16)[None]
        s_a, b_a, g_a, s_m, b_m, g_m = field.adaLN_modulation(emb).chunk(6, -1)
        h = field.norm(x)
        mixer, mlp = g_a * field.attn(h * (1 + s_a) + b_a, grid), g_m * field.mlp(h * (1 + s_m) + b_m)
    first = steps[0]
    assert first["gate_mixer"] == pytest.approx(float(g_a.abs().mean()))
    assert first["gate_mlp"] == pytest.approx(float(g_m.abs().mean()))
    assert first["mixer"] == pytest.approx(token_rms(mixer)) and first["mlp"] == pytest.approx(token_rms(mlp))
    assert first["field"] == pytest.approx(token_rms(mixer + mlp)) and first["state"] == pytest.approx(token_rms(x))
    assert result["mean"]["mlp"] == pytest.approx(sum(e["mlp"] for e in steps) / 4)
    share = result["mean"]["mlp"] / (result["mean"]["mixer"] + result["mean"]["mlp"])
    assert result["mlp_share"] == pytest.approx(share) and 0 < share < 1


def test_field_branches_follow_the_kernels_along_the_flow():
    """``kernel_reach`` (SSoG only) is the mixture's RMS reach at each evaluation's t: constant
    with fixed kernels, moving with ``time_kernels``; the sinks analysis reads the moved maps."""
    fixed, moving = small_model("ssog", "odevit", 4), small_model("ssog", "odevit", 4, time_kernels=True)
    for model in (fixed, moving):
        open_field_gates(model)
    reach = {}
    for name, model in (("fixed", fixed), ("moving", moving)):
        steps = field_branches(model, noise())["evaluations"]
        reach[name] = [e["kernel_reach"] for e in steps]
        for e in steps:
            mu, sigma, weight = (p.double() for p in model.field.kernels_at(torch.tensor(e["t"])))
            by_head = (weight * (mu.square() + sigma.square()).sum(-1)).sum(-1).sqrt()
            assert e["kernel_reach_by_head"] == pytest.approx(by_head.tolist())
    assert max(reach["fixed"]) - min(reach["fixed"]) < 1e-12
    assert max(reach["moving"]) - min(reach["moving"]) > 1e-3
    assert "kernel_reach" not in field_branches(small_model("mha", "odevit", 2), noise())["evaluations"][0]
    maps = {}
    for name, model in (("fixed", fixed), ("moving", moving)):
        maps[name] = sink_diagnostics(model, [noise()])["per_layer"]
    assert maps["fixed"][0]["sink_score"] == pytest.approx(maps["fixed"][1]["sink_score"])
    assert maps["moving"][0]["sink_score"] != pytest.approx(maps["moving"][1]["sink_score"])


def test_a_fresh_field_has_shut_gates_and_no_mlp_share():
    result = field_branches(small_model("mha", "odevit", 2), noise())
    assert all(e["gate_mixer"] == e["gate_mlp"] == e["mixer"] == e["mlp"] == e["field"] == 0
               for e in result["evaluations"])
    assert result["mlp_share"] is None and result["mean"]["state"] > 0


def test_field_branches_need_a_continuous_model():
    with pytest.raises(ValueError, match="continuous"):
        field_branches(small_model("mha", "loopvit", 2), noise())


# ---------------------------------------------------------------------------- end to end
def test_runs_write_json_and_plots(tmp_path):
    sinks = run_sinks(["ssog_loopvit_micro_patch1_8"], num_images=6, batch_size=4, device="cpu", output=tmp_path)
    assert sinks[0]["images"] == 6 and sinks[0]["data"] == "noise"
    lip = run_lipschitz(["mha_odevit_micro_patch1_8", "ssog_odevit_micro_patch1_8"], num_images=1, scales=(1, 100),
                        iters=2, device="cpu", output=tmp_path)
    assert lip[1]["summary"]["mixer"]["within_bound"]
    kernels = run_kernels(["ssog_odevit_micro_patch1_8"], output=tmp_path)
    field = run_field(["mha_odevit_micro_patch1_8"], num_images=3, device="cpu", output=tmp_path)
    assert field[0]["images"] == 3 and field[0]["label"] == "mha_odevit_micro_patch1_8 (random)"
    for name in ("sinks.json", "lipschitz.json", "kernels.json", "field.json"):
        assert json.loads((tmp_path / name).read_text())
    for figure in (tmp_path / "lipschitz.png", tmp_path / kernels[0]["figure"], tmp_path / "field.png"):
        assert figure.read_bytes()[:4] == b"\x89PNG"
    # the sinks and kernels tables, ready for a paper: CSV and Markdown, the terminal table's rows
    import csv

    for name, table, rows in (("sinks", sinks_table(sinks), 1), ("kernels", kernels_table(kernels), 2)):
        parsed = list(csv.reader((tmp_path / f"{name}.csv").read_text().splitlines()))
        markdown = (tmp_path / f"{name}.md").read_text().splitlines()
        assert len(parsed) == len(markdown) - 1 == 1 + rows, (parsed, markdown)
        assert markdown[1] == "| " + " | ".join(["---"] * len(parsed[0])) + " |"
        for cells, line in zip(parsed[1:], markdown[2:]):
            assert line == "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
            assert all(cell in table for cell in cells if cell)
    assert list(csv.reader((tmp_path / "kernels.csv").read_text().splitlines()))[0][3:5] == ["min sigma", "mean |mu|"]
    assert "| mean \\|mu\\| |" in (tmp_path / "kernels.md").read_text()


@pytest.fixture
def checkpoint(tmp_path):
    from ssog.train import TrainConfig, save_checkpoint

    model = small_model("ssog", "vit", 2)
    config = TrainConfig(model="ssog_vit_micro_patch1_8", model_kwargs={**SMALL, "depth": 2}, dataset="digits")
    path = tmp_path / "run" / "best.safetensors"
    save_checkpoint(path, {"kind": "best", "config": config.to_dict(), "model": model.state_dict()})
    return path, model


def test_checkpoint_loads_its_weights_and_its_validation_images(checkpoint):
    path, model = checkpoint
    loaded = load_model(checkpoint=path.parent)  # a run folder means its best checkpoint
    assert loaded.name == "ssog_vit_micro_patch1_8" and loaded.source == str(path)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value)
    batches = list(image_batches(loaded, num_images=10, batch_size=4))
    assert [b.shape for b in batches] == [(4, 1, 8, 8), (4, 1, 8, 8), (2, 1, 8, 8)]


def test_cli_analyzes_a_checkpoint_beside_a_random_model(checkpoint, tmp_path, capsys):
    path, _ = checkpoint
    code = main(["analyze", "sinks", "--checkpoint", str(path), "--model", "mha_vit_micro_patch1_8",
                 "--num-images", "8", "--device", "cpu", "--output", str(tmp_path / "out")])
    assert code == 0
    out = capsys.readouterr().out
    assert "ssog_vit_micro_patch1_8" in out and "mha_vit_micro_patch1_8" in out
    rows = json.loads((tmp_path / "out" / "sinks.json").read_text())
    assert [r["data"] for r in rows] == ["digits", "noise"]
    assert rows[0]["same_key_percent"] == 100.0 and rows[0]["cls_percent"] is None


@pytest.mark.parametrize("args, message", [
    (["sinks"], "at least one checkpoint or model"),
    (["kernels", "--model", "ssog_vit_nope"], "unknown model"),
    (["kernels", "--model", "mha_vit_micro_patch1_8"], "no SSoGAttention"),
    (["field", "--model", "ssog_vit_micro_patch1_8"], "continuous (ODE-ViT) family"),
    (["sinks", "--model", "ssog_vit_micro_patch1_8", "--data", "mnist"], "unknown data 'mnist'"),
    (["sinks", "--model", "ssog_vit_tiny_patch4_32", "--data", "digits"], "3-channel images"),
    (["kernels", "--checkpoint", "/nonexistent/best.safetensors"], "does not exist"),
    (["kernels", "--model", "ssog_vit_micro_patch1_8", "--ema"], "ema applies to checkpoints"),
    (["lipschitz", "--model", "ssog_vit_micro_patch1_8", "--device", "tpu"], "unknown device"),
])
def test_bad_arguments_give_one_clear_error(args, message, tmp_path, capsys):
    assert main(["analyze", *args, "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["sinks", "--num-images", "0"], ["lipschitz", "--scales", "-1"], ["nope"]])
def test_bad_option_values_are_rejected_by_the_parser(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", *args])
    assert exit_info.value.code == 2


def test_analysis_model_describes_itself():
    loaded = AnalysisModel(small_model("ssog", "odevit", 1, steer=("sigma",)), "x", "here")
    assert loaded.describe() == {"model": "x", "source": "here", "family": "odevit", "op": "ssog",
                                 "steer": ["sigma"]}


def test_kernel_rows_name_the_run_of_a_trained_model(checkpoint, tmp_path, capsys):
    """Two runs of one model are told apart by their run folder, a random model by its name."""
    path, _ = checkpoint
    code = main(["analyze", "kernels", "--checkpoint", str(path), "--model", "ssog_vit_micro_patch1_8",
                 "--device", "cpu", "--output", str(tmp_path / "out")])
    assert code == 0
    rows = [line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if "(all)" in line]
    assert rows == ["ssog_vit_micro_patch1_8 (run)", "ssog_vit_micro_patch1_8"]
    named_after_its_model = tmp_path / "ssog_vit_micro_patch1_8"
    named_after_its_model.mkdir()
    shutil.copy(path, named_after_its_model)
    code = main(["analyze", "kernels", "--checkpoint", str(named_after_its_model), "--device", "cpu",
                 "--output", str(tmp_path / "out2")])
    assert code == 0
    rows = [line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if "(all)" in line]
    assert rows == ["ssog_vit_micro_patch1_8"]  # once, not "name (name)"


def test_lipschitz_estimates_pass_on_no_warning_of_torchs_own_internals():
    """torch.func.jvp's first call in a process scripts torch's decompositions (a FutureWarning
    in newer torch), so only a fresh interpreter can tell."""
    script = ("import torch; from ssog.analysis import local_lipschitz; "
              "local_lipschitz(lambda z: torch.tanh(z) * 2, torch.randn(2, 3), iters=2)")
    result = subprocess.run([sys.executable, "-W", "error", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
