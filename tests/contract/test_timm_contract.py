"""timm's own model tests, from the installed timm's source release, on every tiny preset.

The tests come from ``tests/test_models.py`` of the sdist of the installed timm version
(``pip download --no-binary :all: timm==<version>``), cached in ``~/.cache/ssog/timm-src``
(``SSOG_TIMM_SRC`` overrides the folder); without network and cache they are skipped with
the reason. timm parametrises them over its whole registry, so they are called directly
here with our model names.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest
import timm
import torch

import ssog.models  # noqa: F401  (registers the models)
from ssog.models import list_models

TIMM_TESTS = (
    "test_model_forward", "test_model_backward", "test_model_default_cfgs_non_std",
    "test_model_forward_features", "test_model_forward_intermediates_features",
    "test_model_forward_intermediates",
)
TINY_MODELS = sorted({name for pattern in ("*_micro_*", "*_digits_*", "*_tiny_*") for name in list_models(pattern)})
#: Arguments beyond the model name, as timm's parametrisation gives them.
_EXTRA_ARGS = {
    "test_model_backward": dict(batch_size=2),
    "test_model_default_cfgs_non_std": dict(batch_size=1, cfg_device="meta"),
}


def _timm_test_models(run_child: Callable[..., subprocess.CompletedProcess]) -> ModuleType | str:
    """timm's ``tests/test_models.py`` as a module, or why it cannot be had."""
    cache = Path(os.environ.get("SSOG_TIMM_SRC", Path.home() / ".cache" / "ssog" / "timm-src"))
    source = cache / f"timm-{timm.__version__}-test_models.py"
    if not source.is_file():
        archive = cache / f"timm-{timm.__version__}.tar.gz"
        if not archive.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            fetch = run_child(
                [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                 f"timm=={timm.__version__}", "-d", str(cache)],
                120,
            )
            if fetch.returncode or not archive.is_file():
                return f"timm {timm.__version__} source release not cached in {cache} and not downloadable"
        with tarfile.open(archive) as tar:
            member = tar.extractfile(f"timm-{timm.__version__}/tests/test_models.py")
            if member is None:
                return f"{archive} has no tests/test_models.py"
            source.write_bytes(member.read())
    spec = importlib.util.spec_from_file_location("timm_source_test_models", source)
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # timm's CI marks (base, cfg, features, ...)
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def timm_tests(run_child: Callable[..., subprocess.CompletedProcess]) -> ModuleType:
    module = _timm_test_models(run_child)
    if isinstance(module, str):
        pytest.skip(module)
    return module


def test_tiny_presets_cover_every_family_and_op():
    assert len(TINY_MODELS) == 2 * 3 * 3  # ops x families x tiny presets


@pytest.mark.parametrize("model_name", TINY_MODELS)
@pytest.mark.parametrize("test_name", TIMM_TESTS)
def test_timm_model_contract(timm_tests, test_name, model_name):
    torch.manual_seed(0)
    getattr(timm_tests, test_name)(model_name=model_name, **_EXTRA_ARGS.get(test_name, dict(batch_size=1)))


# ----------------------------------------------------------------------------- our side of the contract
FAMILIES = ("vit", "loopvit", "odevit")


@pytest.mark.parametrize("family", FAMILIES)
def test_grad_checkpointing_recomputes_each_application_and_changes_nothing(family):
    torch.manual_seed(0)
    model = timm.create_model(f"ssog_{family}_micro_patch1_8", drop_path_rate=0.1).train()
    x = torch.randn(2, 1, 8, 8)
    mixer_calls = []
    for module in model.modules():
        if isinstance(module, ssog.SSoGAttention):
            module.register_forward_hook(lambda *_: mixer_calls.append(1))

    def run() -> tuple[torch.Tensor, list[torch.Tensor], int]:
        mixer_calls.clear()
        model.zero_grad()
        torch.manual_seed(1)  # the same drop-path masks
        out = model(x)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()], len(mixer_calls)

    out, grads, calls = run()
    model.set_grad_checkpointing()
    out_ckpt, grads_ckpt, calls_ckpt = run()
    assert calls == 4 and calls_ckpt == 8  # every application recomputed once in backward
    torch.testing.assert_close(out_ckpt, out, rtol=0, atol=0)
    for grad, grad_ckpt in zip(grads, grads_ckpt):
        torch.testing.assert_close(grad_ckpt, grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("family,scales", [("vit", 1 + 4 + 1), ("loopvit", 3), ("odevit", 3)])
def test_layer_decay_gives_one_lr_scale_per_block(family, scales):
    from timm.optim import create_optimizer_v2

    model = timm.create_model(f"ssog_{family}_micro_patch1_8")
    optimizer = create_optimizer_v2(model, lr=1.0, layer_decay=0.5)
    by_scale: dict[float, set[str]] = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        by_scale.setdefault(group["lr_scale"], set()).update(names[id(p)] for p in group["params"])
    assert sorted(by_scale) == [0.5**k for k in reversed(range(scales))]
    assert all(n.startswith("patch_embed") or n == "pos_embed" for n in by_scale[min(by_scale)])  # stem
    assert "head.weight" in by_scale[1.0]


@pytest.mark.parametrize("family", FAMILIES)
def test_meta_device_build_allocates_nothing(family):
    model = timm.create_model(f"ssog_{family}_tiny_patch4_32", device="meta", steer=("mu", "sigma", "lambda"))
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    model = timm.create_model(f"mha_{family}_micro_patch1_8", dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}


def test_run_checkpoints_load_through_timm(tmp_path):
    from ssog.train.checkpoint import save_checkpoint

    trained = timm.create_model("ssog_loopvit_micro_patch1_8", num_classes=3)
    path = save_checkpoint(tmp_path / "best.safetensors", {
        "kind": "best", "model": trained.state_dict(), "optimizer": {"state": {0: {"step": torch.ones(1)}}},
    })
    by_path = timm.create_model("ssog_loopvit_micro_patch1_8", num_classes=3, checkpoint_path=str(path))
    by_overlay = timm.create_model(
        "ssog_loopvit_micro_patch1_8", num_classes=3, pretrained=True,
        pretrained_cfg_overlay=dict(file=str(path), num_classes=3),
    )
    for model in (by_path, by_overlay):
        for name, value in trained.state_dict().items():
            torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_prune_intermediate_layers_stops_after_the_last_requested_state(family):
    torch.manual_seed(0)
    model = timm.create_model(f"mha_{family}_micro_patch1_8").eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        _, full = model.forward_intermediates(x, indices=[0, 1])
        calls = []
        for module in model.modules():
            if isinstance(module, ssog.MultiHeadAttention):
                module.register_forward_hook(lambda *_: calls.append(1))
        assert model.prune_intermediate_layers(indices=[0, 1]) == [0, 1]
        assert model.num_classes == 0 and model.global_pool == ""
        final, pruned = model.forward_intermediates(x, indices=[0, 1])
    assert len(calls) == 2  # two applications, not four
    for a, b in zip(pruned, full):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(final, model.forward_features(x))

