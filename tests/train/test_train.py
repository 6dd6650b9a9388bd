"""Training engine, configs, transfer (init-from, linear probe), evaluation and the CLI."""
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from scipy import stats

from ssog.cli import main
from ssog.layers import ssog_mixers
from ssog.train import (
    TrainConfig, evaluate_checkpoint, freeze_backbone, init_from_checkpoint, load_checkpoint, load_recipe,
    parse_override, resolve_config, set_input_size, train,
)
from ssog.train.builders import build_model
from ssog.train.metrics import parameter_groups

ACCURACY_TABLE = Path(__file__).resolve().parents[2] / "scripts" / "accuracy_table.py"


# ---------------------------------------------------------------- configs and recipes
def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_recipe_inheritance_variants_and_overrides(tmp_path):
    _write(tmp_path / "base" / "a.yaml", "epochs: 5\nlr: 1e-3\nmodel_kwargs: {depth: 2, num_heads: 2}\n")
    recipe = _write(tmp_path / "exp.yaml",
                    "base: base/a.yaml\nepochs: 7\nmodel_kwargs: {depth: 3}\n"
                    "variants:\n  wide: {model_kwargs: {embed_dim: 32}}\n  deep: {model_kwargs: {depth: 6}}\n")
    assert load_recipe(recipe)["model_kwargs"] == {"depth": 3, "num_heads": 2}
    cfg = resolve_config(recipe, "wide", [parse_override("model_kwargs.num_heads=4"), ("batch_size", 8)])
    assert (cfg.epochs, cfg.lr, cfg.batch_size) == (7, 1e-3, 8)
    assert cfg.model_kwargs == {"depth": 3, "num_heads": 4, "embed_dim": 32}
    assert cfg.output == "runs/exp/wide"
    assert resolve_config(recipe, "deep", [("output", "elsewhere")]).output == "elsewhere"
    with pytest.raises(ValueError, match=r"defines variants \['wide', 'deep'\]: choose one with --variant"):
        resolve_config(recipe)
    with pytest.raises(ValueError, match="has no variant 'tall'"):
        resolve_config(recipe, "tall")


def test_recipe_errors(tmp_path):
    loop = _write(tmp_path / "a.yaml", "base: b.yaml\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ValueError, match="inheritance cycle"):
        load_recipe(loop)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_recipe(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="must hold a mapping"):
        load_recipe(_write(tmp_path / "list.yaml", "- 1\n- 2\n"))
    with pytest.raises(ValueError, match="unknown training config keys \\['epoch'\\]"):
        resolve_config(overrides=[("epoch", 3)])
    with pytest.raises(ValueError, match="'batch_size' must be int, got 'big'"):
        resolve_config(overrides=[parse_override("batch_size=big")])
    with pytest.raises(ValueError, match="must look like key=value"):
        parse_override("lr")
    with pytest.raises(ValueError, match="amp must be none, bf16 or fp16"):
        TrainConfig(amp="fp8")


def test_field_names_are_the_keys_of_a_config_dump():
    assert TrainConfig.field_names() == tuple(TrainConfig().to_dict())


def _accuracy_table():
    """scripts/accuracy_table.py as a module (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location("accuracy_table", ACCURACY_TABLE)
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    return table


# ---------------------------------------------------------------- the engine
@pytest.mark.slow
def test_training_writes_summary_logs_and_checkpoints(tmp_path, capsys, tiny_config):
    summary = train(tiny_config(tmp_path / "run", epochs=2, ema_decay=0.9, augment="strong"))
    run = tmp_path / "run"
    for name in ("config.yaml", "summary.json", "log.jsonl", "log.csv", "curves.png",
                 "last.safetensors", "best.safetensors"):
        assert (run / name).is_file(), name
    assert json.loads((run / "summary.json").read_text()) == summary
    assert {"acc1", "acc3", "acc5", "loss", "epochs", "params", "ema_acc1"} <= set(summary)
    assert summary["epochs"] == 2 and summary["steps"] == 8
    assert summary["params"] == sum(p.numel() for p in build_model(
        tiny_config(tmp_path), 4, 3, 8).parameters())
    assert 0 <= summary["acc1"] <= summary["acc3"] <= summary["acc5"] == 100.0  # 4 classes: top-5 is all
    rows = (run / "log.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("epoch,step,lr,train_loss,val_loss,acc1,acc3,acc5")
    assert "grad_norm/mixer.kernel" in rows[0].split(",")
    groups = set(parameter_groups(build_model(tiny_config(tmp_path), 4, 3, 8)))
    for record in (json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()):
        assert set(record["grad_norm"]) == groups
        assert all(math.isfinite(norm) and norm > 0 for norm in record["grad_norm"].values()), record

    # scripts/accuracy_table.py --grad-plot draws it, skipping a run logged before grad_norm was
    table = _accuracy_table()
    old = tmp_path / "old"
    old.mkdir()
    (old / "log.jsonl").write_text(json.dumps({"epoch": 1, "acc1": 50.0}) + "\n")
    table.grad_plot([run, old], tmp_path / "grad.png", "tiny")
    assert (tmp_path / "grad.png").stat().st_size > 0
    assert f"note: {old} has no grad_norm records" in capsys.readouterr().out


def test_margin_plot_pairs_runs_by_family_grid_and_length(tmp_path, capsys):
    def fake_run(name, model, epochs, acc1s, patch_size=None):
        run = tmp_path / name
        run.mkdir()
        kwargs = {"embed_dim": 64} | ({"patch_size": patch_size} if patch_size else {})
        (run / "config.yaml").write_text(json.dumps({"model": model, "model_kwargs": kwargs,
                                                     "img_size": 32, "epochs": epochs}))
        (run / "log.jsonl").write_text("".join(json.dumps({"epoch": i + 1, "acc1": a}) + "\n"
                                               for i, a in enumerate(acc1s)))
        return run

    runs = [fake_run("m5", "mha_vit_tiny_patch4_32", 2, [40.0, 50.0]),
            fake_run("s5", "ssog_vit_tiny_patch4_32", 2, [45.0, 54.5]),
            fake_run("m15", "mha_vit_tiny_patch4_32", 3, [1.0, 2.0, 60.0]),
            fake_run("s15", "ssog_vit_tiny_patch4_32", 3, [1.0, 2.0, 66.0]),
            fake_run("fine", "ssog_vit_tiny_patch4_32", 3, [1.0, 2.0, 70.0], patch_size=2),
            fake_run("half", "mha_vit_tiny_patch4_32", 3, [1.0, 2.0], patch_size=2),
            fake_run("ode", "ssog_odevit_tiny_patch4_32", 2, [30.0, 35.0]),
            fake_run("mode", "mha_odevit_tiny_patch4_32", 2, [30.0, 36.0])]
    table = _accuracy_table()
    assert table.paired_acc1(runs) == {("odevit", "8x8"): [(2, 36.0, 35.0)],
                                       ("vit", "8x8"): [(2, 50.0, 54.5), (3, 60.0, 66.0)]}
    out = capsys.readouterr().out
    assert f"note: {tmp_path / 'half'} has 2 of its 3 epochs" in out
    assert "note: vit 16x16 tokens, 3 epochs has no MHA run" in out
    table.margin_plot(runs, tmp_path / "margin.png", "fake")
    assert (tmp_path / "margin.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="a second mha run of vit, 8x8 tokens, 2 epochs"):
        table.paired_acc1(runs + [fake_run("again", "mha_vit_tiny_patch4_32", 2, [1.0, 2.0])])


def test_paper_table_averages_seeds_and_plots_each_settings_margin(tmp_path, capsys):
    def fake_run(name, model, acc1, seed=0, epochs=2, lr=4e-3, **kwargs):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text(json.dumps({"model": model, "model_kwargs": {"embed_dim": 64} | kwargs,
                                                     "img_size": 32, "epochs": epochs, "seed": seed, "lr": lr}))
        (run / "log.jsonl").write_text("".join(json.dumps({"epoch": e + 1, "acc1": acc1 - 1 + e, "acc5": 90.0})
                                               + "\n" for e in range(2)))
        (run / "summary.json").write_text(json.dumps({"params": 1000 if model.startswith("mha") else 900,
                                                      "num_classes": 100}))
        return run

    runs = [fake_run("m0", "mha_vit_tiny_patch4_32", 40.0), fake_run("m1", "mha_vit_tiny_patch4_32", 42.0, seed=1),
            fake_run("s0", "ssog_vit_tiny_patch4_32", 44.0), fake_run("s1", "ssog_vit_tiny_patch4_32", 45.0, seed=1),
            fake_run("steer", "ssog_vit_tiny_patch4_32", 40.0, steer=["mu"]),
            fake_run("lonely", "ssog_loopvit_tiny_patch4_32", 50.0),
            fake_run("short", "ssog_vit_tiny_patch4_32", 60.0, epochs=3)]
    table = _accuracy_table()
    lines = table.paper_table(runs)
    assert f"note: {tmp_path / 'short'} has 2 of its 3 epochs: left out" in capsys.readouterr().out
    vit = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("| vit |")]
    # operator, seeds, params, saving, (GFLOPs), Acc@1, Acc@5, margin
    assert [row[4:8] + row[9:] for row in vit] == [
        ["MHA", "40.00, 42.00", "1,000", "", "41.00", "90.00", ""],
        ["SSoG", "44.00, 45.00", "900", "10.0%", "44.50", "90.00", "+3.50"],
        ["SSoG steer mu (cold)", "1", "900", "10.0%", "40.00", "90.00", "-1.00"]]
    # MHA at a second rate: each MHA row names its rate, and SSoG's margin is over the better one
    retuned = fake_run("m_lr", "mha_vit_tiny_patch4_32", 43.0, lr=2e-3)
    vit = [[cell.strip() for cell in line.strip("|").split("|")]
           for line in table.paper_table(runs + [retuned]) if line.startswith("| vit |")]
    assert [row[4:6] + row[11:] for row in vit] == [
        ["MHA, lr 0.002", "1", ""], ["MHA, lr 0.004", "40.00, 42.00", ""], ["SSoG", "44.00, 45.00", "+1.50"],
        ["SSoG steer mu (cold)", "1", "-3.00"]]
    # a setting an older config lacks ran at its default, and the label says so (not "None")
    flows = [fake_run("fixed", "ssog_odevit_tiny_patch4_32", 46.0),
             fake_run("moving", "ssog_odevit_tiny_patch4_32", 47.0, time_kernels=True)]
    labels = [line.split("|")[5].strip() for line in table.paper_table(flows) if line.startswith("| odevit |")]
    assert labels == ["SSoG, model_kwargs.time_kernels True", "SSoG, model_kwargs.time_kernels default"]
    # over seeds: Welch's interval of SSoG (44, 45) against MHA (40, 42), by hand
    intervals = table.seed_intervals(runs)
    assert "steer mu (cold) against MHA: fewer than two seeds a side" in capsys.readouterr().out
    squared_errors = (0.5 / 2, 2.0 / 2)  # each seed variance over its seed count
    dof = sum(squared_errors) ** 2 / sum(e ** 2 for e in squared_errors)
    half = stats.t.ppf(0.975, dof) * math.sqrt(sum(squared_errors))
    assert len(intervals) == 3
    *cells, p_value = [cell.strip() for cell in intervals[2].strip("|").split("|")]
    assert cells == ["vit", "64", "8x8", "2", "SSoG against MHA", "2 / 2", "+3.50",
                     f"{3.5 - half:+.2f} to {3.5 + half:+.2f}"]
    assert 3.5 - half < 0 and float(p_value) > 0.05  # 1.5 degrees of freedom: a 3.5 lead is not shown
    table.setting_margin_plot(runs, tmp_path / "margins.png", "fake", {"vit": 2.0})
    assert (tmp_path / "margins.png").stat().st_size > 0
    assert "note: loopvit width 64 8x8 tokens has no MHA run: not in the margin plot" in capsys.readouterr().out
    assert table._goals("vit=2,loopvit=5") == {"vit": 2.0, "loopvit": 5.0}
    with pytest.raises(SystemExit, match="--goals 'vit': expected FAMILY=POINTS"):
        table._goals("vit")


@pytest.mark.parametrize("family", ["vit", "loopvit", "odevit"])
@pytest.mark.parametrize("op", ["mha", "ssog"])
def test_parameter_groups_hold_every_trainable_parameter_once(family, op):
    steer = {"steer": ("mu", "sigma", "lambda")} if op == "ssog" else {}
    model = build_model(TrainConfig(model=f"{op}_{family}_micro_patch1_8", model_kwargs=dict(
        embed_dim=16, num_heads=2, patch_size=2, **steer)), 4, 3, 8)
    groups = parameter_groups(model)
    grouped = [id(p) for params in groups.values() for p in params]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # each once, shared ones too
    expected = {"patch_embed", "pos_cls", "mixer.proj", "mlp", "norms", "head"}
    expected |= {"mixer.kernel", "mixer.steer"} if op == "ssog" else set()
    expected |= {"modulation"} if family == "odevit" else set()
    assert set(groups) == expected
    names = {id(p): name.rsplit(".", 1)[-1] for name, p in model.named_parameters()}
    if op == "ssog":
        assert {names[id(p)] for p in groups["mixer.kernel"]} == {"mu", "rho", "logits"}
    assert {names[id(p)] for p in groups["mixer.proj"]} == {"weight", "bias"}
    freeze_backbone(model)
    assert list(parameter_groups(model)) == ["head"]


def test_tiny_model_learns_the_synthetic_classes(tmp_path, tiny_config):
    summary = train(tiny_config(tmp_path, epochs=6, synthetic_size=128, lr=5e-3))
    assert summary["acc1"] >= 90 and summary["train_loss"] < 1.0


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_runs(amp, tmp_path, tiny_config):
    summary = train(tiny_config(tmp_path, amp=amp, epochs=1, deterministic=False))
    assert math.isfinite(summary["loss"]) and summary["steps"] == 4


def test_bad_settings_fail_before_training(tmp_path, tiny_config):
    with pytest.raises(ValueError, match="per-process batch size must be even"):
        train(tiny_config(tmp_path / "a", batch_size=15, augment="strong"))
    with pytest.raises(ValueError, match="smaller than one batch"):
        train(tiny_config(tmp_path / "b", batch_size=128))
    with pytest.raises(ValueError, match="model_kwargs may not set 'num_classes'"):
        train(tiny_config(tmp_path / "c", model_kwargs={"num_classes": 3}))
    with pytest.raises(ValueError, match="unknown model 'ssog_vit_huge'"):
        train(tiny_config(tmp_path / "d", model="ssog_vit_huge"))


def test_optional_loggers_explain_missing_packages(tmp_path, tiny_config):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install 'ssog\\[logging\\]'"):
            train(tiny_config(tmp_path, epochs=1, tensorboard=True))
    else:
        pytest.skip("tensorboard is installed")


# ---------------------------------------------------------------- transfer
@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory, tiny_config):
    """A trained fixed-SSoG tiny model on 8x8 synthetic images with 4 classes."""
    run = tmp_path_factory.mktemp("fixed") / "run"
    train(tiny_config(run, epochs=1))
    return run


def test_init_from_loads_backbone_new_head_and_resamples_pos_embed(fixed_run, tiny_config):
    source = load_checkpoint(fixed_run / "best.safetensors", only=("model",))["model"]
    cfg = tiny_config(fixed_run, img_size=16)
    model = build_model(cfg, num_classes=7, in_chans=3, img_size=16)
    head_before = model.head.weight.clone()
    init_from_checkpoint(model, fixed_run / "best.safetensors")
    state = model.state_dict()
    assert state["pos_embed"].shape == (1, 1 + 8 * 8, 16) and source["pos_embed"].shape == (1, 1 + 4 * 4, 16)
    assert torch.equal(state["pos_embed"][:, 0], source["pos_embed"][:, 0])  # class token's entry kept
    assert torch.equal(model.head.weight, head_before)  # 7 classes: a fresh head
    backbone = [k for k in source if not k.startswith(("head.", "pos_embed"))]
    assert backbone and all(torch.equal(state[k], source[k]) for k in backbone)


def test_fixed_checkpoint_warm_starts_a_steered_model(fixed_run, tiny_config):
    kwargs = tiny_config(fixed_run).model_kwargs
    cfg = tiny_config(fixed_run, model_kwargs={**kwargs, "steer": ["mu", "sigma", "lambda"]})
    model = build_model(cfg, num_classes=4, in_chans=3, img_size=8)
    init_from_checkpoint(model, fixed_run / "best.safetensors", keep_head=True)
    fixed = build_model(tiny_config(fixed_run), num_classes=4, in_chans=3, img_size=8)
    fixed.load_state_dict(load_checkpoint(fixed_run / "best.safetensors", only=("model",))["model"])
    x = torch.randn(2, 3, 8, 8)
    model.eval(), fixed.eval()
    # cold gates (sigmoid(-8) ~ 3e-4): the warm-started steered model starts as the fixed one
    torch.testing.assert_close(model(x), fixed(x), atol=2e-2, rtol=0)


def test_init_from_a_different_architecture_is_an_error(fixed_run, tiny_config):
    kwargs = tiny_config(fixed_run).model_kwargs
    model = build_model(tiny_config(fixed_run, model_kwargs={**kwargs, "embed_dim": 32}), 4, 3, 8)
    with pytest.raises(ValueError, match="does not match the model.*shape mismatches"):
        init_from_checkpoint(model, fixed_run / "best.safetensors")
    with pytest.raises(FileNotFoundError):
        init_from_checkpoint(model, fixed_run / "none.safetensors")


def test_linear_probe_trains_only_the_head(fixed_run, tmp_path, tiny_config):
    summary = train(tiny_config(tmp_path / "probe", epochs=1, init_from=str(fixed_run / "best.safetensors"),
                                linear_probe=True, synthetic_classes=3))
    before = load_checkpoint(fixed_run / "best.safetensors", only=("model",))["model"]
    after = load_checkpoint(tmp_path / "probe" / "last.safetensors", only=("model",))["model"]
    assert all(torch.equal(before[k], after[k]) for k in after if not k.startswith("head."))
    assert after["head.weight"].shape == (3, 16) and summary["epochs"] == 1
    model = build_model(tiny_config(tmp_path), 4, 3, 8)
    assert freeze_backbone(model) == 16 * 4 + 4


# ---------------------------------------------------------------- evaluation
def test_eval_reproduces_the_runs_validation_metrics(fixed_run):
    record = json.loads((fixed_run / "log.jsonl").read_text().splitlines()[-1])
    result = evaluate_checkpoint(fixed_run / "last.safetensors", progress=False, device="cpu")
    assert result["acc1"] == record["acc1"] and result["loss"] == pytest.approx(record["val_loss"], rel=1e-6)
    assert result["samples"] == 16 and result["grid"] == [4, 4]


def test_eval_at_another_patch_size_rescales_kernels(fixed_run):
    result = evaluate_checkpoint(fixed_run, patch_size=1, rescale_kernels=True, progress=False, device="cpu")
    assert result["grid"] == [8, 8] and result["grid_ratio"] == 2.0 and result["rescaled_kernels"]
    with pytest.raises(ValueError, match="needs --img-size or --patch-size"):
        evaluate_checkpoint(fixed_run, rescale_kernels=True, progress=False)


def test_eval_on_another_grid_rescales_ssog_kernels_unless_told_not_to(fixed_run):
    """The default on a new grid is the image-unit rule: the same result as asking for it."""
    default = evaluate_checkpoint(fixed_run, img_size=16, progress=False, device="cpu")
    asked = evaluate_checkpoint(fixed_run, img_size=16, rescale_kernels=True, progress=False, device="cpu")
    kept = evaluate_checkpoint(fixed_run, img_size=16, rescale_kernels=False, progress=False, device="cpu")
    assert default["rescaled_kernels"] and not kept["rescaled_kernels"]
    assert default["loss"] == asked["loss"] and default["loss"] != kept["loss"]
    assert not evaluate_checkpoint(fixed_run, progress=False, device="cpu")["rescaled_kernels"]  # same grid


def test_set_input_size_scales_mu_and_sigma_by_the_grid_ratio(tiny_config):
    model = build_model(tiny_config("unused"), 4, 3, 8)
    mixer = ssog_mixers(model)[0]
    with torch.no_grad():
        mixer.mu.normal_()
    before = {k: v.clone() for k, v in mixer.kernel_parameters().items()}
    assert set_input_size(model, img_size=16, rescale_kernels=True) == 2.0
    after = mixer.kernel_parameters()
    torch.testing.assert_close(after["mu"], 2 * before["mu"])
    torch.testing.assert_close(after["sigma"], 2 * before["sigma"])
    assert tuple(model.patch_embed.grid_size) == (8, 8) and model(torch.randn(1, 3, 16, 16)).shape == (1, 4)


# ---------------------------------------------------------------- command line
def test_cli_train_then_eval(tmp_path, capsys, tiny_config):
    tiny = tiny_config(tmp_path / "run")
    args = ["train", "--model", tiny.model, "--dataset", "synthetic", "--img-size", "8", "--epochs", "1",
            "--batch-size", "16", "--augment", "none", "--no-progress", "--output", str(tmp_path / "run"),
            "--set", "synthetic_size=32", "--set", "synthetic_classes=4"]
    args += [a for k, v in tiny.model_kwargs.items() for a in ("--set", f"model_kwargs.{k}={v}")]
    assert main(args) == 0
    assert "final  Acc@1" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", str(tmp_path / "run"), "--json", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dataset"] == "synthetic" and result["samples"] == 8


@pytest.mark.parametrize("args, message", [
    (["train", "--dataset", "imagefolder", "--data-dir", "/nonexistent"], "data folder /nonexistent does not exist"),
    (["train", "--resume", "/nonexistent"], "checkpoint /nonexistent does not exist"),
    (["train", "--resume", "/tmp", "--config", "x.yaml"], "give no --config"),
    (["train", "--variant", "x"], "--variant needs --config"),
    (["train", "--config", "/nonexistent.yaml"], "config file /nonexistent.yaml does not exist"),
    (["eval", "--checkpoint", "/nonexistent"], "checkpoint /nonexistent does not exist"),
])
def test_cli_reports_bad_input_in_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"ssog {args[0]}: error:") and message in err[-1]


def test_img_size_goes_to_the_models_that_take_it():
    from ssog.train.builders import takes_img_size

    assert takes_img_size("vit_tiny_patch16_224") and takes_img_size("ssog_vit_tiny_patch4_32")
    assert not takes_img_size("resnet18") and not takes_img_size("test_resnet")


def test_init_from_a_run_without_a_model_takes_the_runs_architecture(tiny_config, tmp_path):
    train(tiny_config(tmp_path / "source", epochs=1))
    cfg = resolve_config(None, None, [("init_from", str(tmp_path / "source")), ("dataset", "synthetic"),
                                      ("img_size", 8)])
    source = tiny_config(tmp_path / "source")
    assert (cfg.model, cfg.model_kwargs) == (source.model, source.model_kwargs)
    with pytest.raises(ValueError, match="init_from .*nowhere: cannot read the model it was trained as"):
        resolve_config(None, None, [("init_from", str(tmp_path / "nowhere"))])
    # a model named with it is kept
    assert resolve_config(None, None, [("init_from", str(tmp_path / "source")),
                                       ("model", "ssog_vit_digits_patch2_8")]).model == "ssog_vit_digits_patch2_8"


def test_a_refused_resume_does_not_say_it_resumed(tiny_config, tmp_path, ssog_log):
    from ssog.files import FolderLock

    train(tiny_config(tmp_path / "run", epochs=1))
    ssog_log.clear()
    with FolderLock(tmp_path / "run", "training run"):  # another process's run holds the folder
        with pytest.raises(ValueError):
            train(resume=tmp_path / "run", resume_changes={"epochs": 2})
    assert "resumed at" not in ssog_log.text
    train(resume=tmp_path / "run", resume_changes={"epochs": 2})
    assert "resumed at epoch 2, step 4" in ssog_log.text


def test_threads_default_to_torchs_choice(monkeypatch):
    """A run leaves torch's thread count alone unless ``threads`` is set (recipes may set 1)."""
    from ssog.runtime import torch_settings
    from ssog.train import TrainConfig

    assert TrainConfig().threads is None
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    with torch_settings(torch.device("cpu"), TrainConfig().threads):
        assert calls == []
    with torch_settings(torch.device("cpu"), 1):
        assert calls[-1] == 1


def test_threads_beyond_the_cpus_are_capped_with_a_warning(monkeypatch, ssog_log, tmp_path, tiny_config):
    """More threads than cores only wait for one (``--threads 1000`` made a 5 s dry run take minutes)."""
    from ssog import runtime
    from ssog.train.dry_run import dry_run

    monkeypatch.setattr(runtime, "usable_cpus", lambda: 1)
    with runtime.torch_settings(torch.device("cpu"), 1000):
        assert torch.get_num_threads() == 1
    assert "threads 1000 is more than the 1 CPU this process may use, where the extra threads could only wait for " \
           "a core; using 1" in ssog_log.text
    assert dry_run(tiny_config(tmp_path / "run", threads=1000), steps=1)["threads"] == 1
