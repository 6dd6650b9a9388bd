"""Model families: counts (SPEC §2-§3), timm contract, ODE integration, bad input.

Big models are only ever built on the meta device; everything that computes uses the
CPU presets (``*_tiny_patch4_32``, ``*_micro_patch1_8``) at batch 2.
"""
from __future__ import annotations

import copy
import json
import math

import pytest
import timm
import torch
from timm.layers import trunc_normal_
from torch import nn

import ssog.models  # noqa: F401  (registers the models)
from ssog.cli import main
from ssog.layers import MultiHeadAttention, SSoGAttention, ssog_mixers
from ssog.models import (
    FIXED_SOLVERS, LoopViT, OdeViT, ViT, count_flops, count_parameters, create_model, list_models,
)
from ssog.models._counting import model_flops, model_info

FAMILIES = ("vit", "loopvit", "odevit")
OPS = ("mha", "ssog")
SIZES = {"small": (384, 6), "medium": (576, 9), "base": (768, 12)}


def meta_model(name: str, **kwargs) -> torch.nn.Module:
    with torch.device("meta"):
        return timm.create_model(name, **kwargs)


def params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def images(model: torch.nn.Module, batch: int = 2, size: int | None = None) -> torch.Tensor:
    channels, height, width = model.pretrained_cfg["input_size"]
    return torch.randn(batch, channels, size or height, size or width)


# ----------------------------------------------------------------------------- registry
def test_every_family_op_and_preset_is_registered():
    names = set(list_models())
    for family in FAMILIES:
        for op in OPS:
            for preset in ("small_patch16_224", "medium_patch16_224", "base_patch16_224",
                           "tiny_patch4_32", "micro_patch1_8", "digits_patch2_8"):
                assert f"{op}_{family}_{preset}" in names
    assert set(timm.list_models("*_odevit_*")) >= {n for n in names if "_odevit_" in n}
    assert len(names) == 36


def test_registered_models_are_the_family_classes():
    assert isinstance(meta_model("ssog_vit_base_patch16_224"), ViT)
    assert isinstance(meta_model("ssog_loopvit_base_patch16_224"), LoopViT)
    assert isinstance(meta_model("ssog_odevit_base_patch16_224", num_classes=100), OdeViT)


# ----------------------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("size", SIZES)
def test_mha_discrete_params_equal_timm_vit(size):
    dim, heads = SIZES[size]
    ours = meta_model(f"mha_vit_{size}_patch16_224", num_classes=100)
    theirs = meta_model("vit_base_patch16_224", embed_dim=dim, num_heads=heads, num_classes=100)
    assert params(ours) == params(theirs)


@pytest.mark.parametrize("size,expected", [("small", 3_070_564), ("medium", 6_596_452), ("base", 11_449_444)])
def test_mha_continuous_params_exact(size, expected):
    assert params(meta_model(f"mha_odevit_{size}_patch16_224", num_classes=100)) == expected


# Table 10, SSoG columns (millions); SPEC §2 allows 2.5%.
PAPER_SSOG = {
    ("vit", "small"): 18.5, ("vit", "medium"): 41.0, ("vit", "base"): 71.6,
    ("odevit", "small"): 2.8, ("odevit", "medium"): 5.9, ("odevit", "base"): 10.3,
}


@pytest.mark.parametrize("family,size", PAPER_SSOG)
def test_ssog_params_within_paper(family, size):
    count = params(meta_model(f"ssog_{family}_{size}_patch16_224", num_classes=100)) / 1e6
    assert abs(count - PAPER_SSOG[family, size]) / PAPER_SSOG[family, size] < 0.025


@pytest.mark.parametrize("op", OPS)
def test_looped_params_are_one_block(op):
    looped = meta_model(f"{op}_loopvit_base_patch16_224", num_classes=100)
    one_block = meta_model(f"{op}_vit_base_patch16_224", num_classes=100, depth=1)
    assert params(looped) == params(one_block)


def test_parameter_breakdown_adds_up_and_names_parts():
    model = meta_model("ssog_odevit_base_patch16_224", num_classes=100)
    parts = count_parameters(model)
    assert parts["total"] == params(model) == sum(v for k, v in parts.items() if k != "total")
    dim = 768
    assert parts["other"] == 0
    assert parts["modulation"] == dim * 6 * dim + 6 * dim
    assert parts["head"] == dim * 100 + 100
    assert parts["pos_cls"] == 196 * dim  # the SSoG default: average pooling, no class token
    assert parts["patch_embed"] == 3 * 16 * 16 * dim + dim
    assert parts["norms"] == 2 * dim  # final LayerNorm; the field's CenterNorm has none
    assert parts["mixer"] == 2 * (dim * dim + dim) + 12 * 4 * 5  # v, proj, 5 per atom


# ----------------------------------------------------------------------------- FLOPs (Table 4)
SPEC_FLOPS = {  # (res) -> (MHA whole, SSoG whole, MHA attention, SSoG attention), GFLOPs
    224: (35.1, 28.4, 12.6, 6.0),
    384: (111.0, 84.3, 44.9, 18.4),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("res", SPEC_FLOPS)
def test_flops_match_table4(family, res):
    mha_total, ssog_total, mha_attn, ssog_attn = SPEC_FLOPS[res]
    for op, total, attn in (("mha", mha_total, mha_attn), ("ssog", ssog_total, ssog_attn)):
        counted = model_flops(f"{op}_{family}_base_patch16_224", img_size=res)
        # Table 4 counts 197 tokens at 224 px (a class token); SSoG models pool by average
        # without one, one token fewer, and stay within the table's tolerance.
        assert counted["tokens"] == (res // 16) ** 2 + (op == "mha")
        assert counted["total_gflops"] == pytest.approx(total, abs=0.3), (op, "total")
        assert counted["attention_gflops"] == pytest.approx(attn, abs=0.3), (op, "attention")


def test_flops_do_not_depend_on_the_backend():
    counts = {b: model_flops("ssog_vit_base_patch16_224", img_size=384, backend=b) for b in ("dense", "local")}
    assert counts["dense"] == counts["local"]


@pytest.mark.parametrize("name,solver,nfe", [
    ("mha_odevit_tiny_patch4_32", "euler", 6), ("ssog_odevit_tiny_patch4_32", "rk4", 8),
    ("mha_vit_tiny_patch4_32", None, None),
])
def test_meta_count_equals_real_count(name, solver, nfe):
    """The meta device (no values, no torchdiffeq) counts what a real forward computes."""
    kwargs = {} if solver is None else dict(solver=solver, nfe=nfe)
    real = timm.create_model(name, **kwargs).eval()
    assert count_flops(real, 48) == count_flops(meta_model(name, **kwargs).eval(), 48)


# ----------------------------------------------------------------------------- forward / backward
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("preset", ["tiny_patch4_32", "micro_patch1_8", "digits_patch2_8"])
def test_forward_backward(family, op, preset):
    torch.manual_seed(0)
    model = timm.create_model(f"{op}_{family}_{preset}", drop_path_rate=0.1)
    x = images(model)
    logits = model(x)
    assert logits.shape == (2, model.num_classes)
    logits.logsumexp(-1).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("family", FAMILIES)
def test_mixer_hook_fires_once_per_application(family):
    model = timm.create_model(f"ssog_{family}_tiny_patch4_32").eval()
    calls = []
    for module in model.modules():
        if isinstance(module, (SSoGAttention, MultiHeadAttention)):
            module.register_forward_hook(lambda mod, args, out: calls.append(args[1]))
    with torch.no_grad():
        model(images(model))
    assert len(calls) == 6 and set(calls) == {(8, 8)}


@pytest.mark.parametrize("family", FAMILIES)
def test_any_size_divisible_by_the_patch(family):
    model = timm.create_model(f"ssog_{family}_tiny_patch4_32").eval()
    with torch.no_grad():
        assert model(images(model, size=48)).shape == (2, 10)
        assert model(torch.randn(1, 3, 32, 48)).shape == (1, 10)
        assert model.forward_features(torch.randn(1, 3, 48, 64)).shape == (1, 12 * 16, 128)


@pytest.mark.parametrize("op", OPS)
def test_tokens_leave_the_embedding_contiguous(op):
    """Without a class token to concatenate, the patch embedding's permuted view used to flow
    down the residual stream, and every LayerNorm copied it (25 copies per forward)."""
    model = timm.create_model(f"{op}_vit_tiny_patch4_32", class_token=False, global_pool="avg").eval()
    tokens, _ = model.embed(torch.randn(2, 3, 32, 32))
    assert tokens.is_contiguous()


def test_native_size_uses_the_position_embedding_unchanged():
    model = timm.create_model("mha_vit_micro_patch1_8").eval()
    tokens, grid = model.embed(torch.zeros(1, 1, 8, 8))
    expected = model.patch_embed.proj.bias + model.pos_embed[0, 1:]
    assert grid == (8, 8)
    torch.testing.assert_close(tokens[0, 1:], expected)


def test_set_input_size_resizes_patch_and_position_embedding():
    model = timm.create_model("ssog_vit_tiny_patch4_32").eval()
    mu, sigma = model.blocks[0].attn.mu.clone(), model.blocks[0].attn.sigma().clone()
    model.set_input_size(patch_size=2, rescale_kernels=True)
    assert model.patch_embed.proj.weight.shape[-2:] == (2, 2)
    assert model.pos_embed.shape == (1, 16 * 16, 128)
    torch.testing.assert_close(model.blocks[0].attn.mu, mu * 2)
    torch.testing.assert_close(model.blocks[0].attn.sigma(), sigma * 2)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    model.set_input_size(img_size=64)
    assert model.pos_embed.shape == (1, 32 * 32, 128)


@pytest.mark.parametrize("family", FAMILIES)
def test_kernels_start_in_image_units(family):
    """On any grid a layer starts covering what it covers on the 8x8 reference grid; the
    reference grid keeps the layer's own (token-unit) initialisation exactly."""
    name = f"ssog_{family}_tiny_patch4_32"
    torch.manual_seed(0)
    reference = timm.create_model(name)  # 8x8 tokens
    first = next(m for m in reference.modules() if isinstance(m, SSoGAttention))
    plain = SSoGAttention(first.dim, first.num_heads, num_prefix_tokens=first.num_prefix_tokens)
    torch.testing.assert_close(first.mu, plain.mu, rtol=0, atol=0)
    torch.testing.assert_close(first.rho, plain.rho, rtol=0, atol=0)
    for kwargs, scale in ((dict(patch_size=2), (2.0, 2.0)), (dict(img_size=(32, 64)), (1.0, 2.0)),
                          (dict(patch_size=2, kernel_units="tokens"), (1.0, 1.0))):
        model = timm.create_model(name, **kwargs)
        layer = next(m for m in model.modules() if isinstance(m, SSoGAttention))
        torch.testing.assert_close(layer.mu, first.mu * torch.tensor(scale))
        torch.testing.assert_close(layer.sigma(), first.sigma() * torch.tensor(scale))
        assert layer.steer_radius == (4.0 * scale[0], 4.0 * scale[1])
    paper = meta_model(f"ssog_{family}_small_patch16_224")
    assert paper.config()["initial_kernels"] == {
        "centre_radius": [3.5, 3.5], "width_min": [0.875, 0.875], "width_max": [7.0, 7.0],
        "steer_radius": [7.0, 7.0],
    }
    with pytest.raises(ValueError, match="kernel_units only applies to op='ssog'"):
        timm.create_model(f"mha_{family}_tiny_patch4_32", kernel_units="image")
    with pytest.raises(ValueError, match="unknown kernel_units 'pixels'"):
        timm.create_model(name, kernel_units="pixels")


def test_set_input_size_rescales_each_axis_by_its_grid_ratio():
    model = timm.create_model("ssog_vit_tiny_patch4_32")
    layer = model.blocks[0].attn
    mu, sigma = layer.mu.clone(), layer.sigma().clone()
    model.set_input_size(img_size=(64, 32), rescale_kernels=True)
    torch.testing.assert_close(layer.mu, mu * torch.tensor([2.0, 1.0]))
    torch.testing.assert_close(layer.sigma(), sigma * torch.tensor([2.0, 1.0]))
    assert model(torch.randn(1, 3, 64, 32)).shape == (1, 10)


def test_converted_timm_vit_starts_in_image_units():
    from ssog import convert

    vit = timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=4)  # 16x16 tokens
    layer = convert(vit).blocks[0].attn
    assert layer.steer_radius == (8.0, 8.0)
    pinned = convert(timm.create_model("vit_tiny_patch16_224", img_size=64, patch_size=4), kernel_units="tokens")
    torch.testing.assert_close(layer.mu, 2 * pinned.blocks[0].attn.mu)


# ----------------------------------------------------------------------------- timm contract
@pytest.mark.parametrize("family", FAMILIES)
def test_timm_contract(family):
    model = timm.create_model(f"ssog_{family}_micro_patch1_8", num_classes=0).eval()
    cfg = model.default_cfg
    assert cfg["input_size"] == (1, 8, 8) and cfg["first_conv"] == "patch_embed.proj"
    assert cfg["classifier"] == "head"
    x = images(model)
    with torch.no_grad():
        assert model(x).shape == (2, model.num_features)
        model.reset_classifier(7, global_pool="avg")
        assert model.get_classifier().out_features == 7 and model(x).shape == (2, 7)
        features = model.forward_features(x)
        assert model.forward_head(features, pre_logits=True).shape == (2, model.head_hidden_size)
    names = dict(model.named_parameters())
    decay_free = model.no_weight_decay()
    assert "pos_embed" in decay_free and ("cls_token" in decay_free) == model.has_class_token
    assert any(n.endswith(".mu") for n in decay_free)
    assert all(n in names for n in decay_free)


@pytest.mark.parametrize("family", FAMILIES)
def test_features_only_and_intermediates(family):
    torch.manual_seed(0)
    model = timm.create_model(f"mha_{family}_micro_patch1_8").eval()
    x = images(model)
    with torch.no_grad():
        final, states = model.forward_intermediates(x, output_fmt="NLC")
        torch.testing.assert_close(final, model.forward_features(x))
        torch.testing.assert_close(model.norm(states[-1]), final[:, 1:])  # last state = forward's
        assert len(states) == 4 and states[0].shape == (2, 64, 64)
        feats = timm.create_model(f"mha_{family}_micro_patch1_8", features_only=True, out_indices=(1, 3)).eval()
        maps = feats(x)
    assert [m.shape for m in maps] == [(2, 64, 8, 8)] * 2


# ----------------------------------------------------------------------------- ODE integration
@pytest.mark.parametrize("solver,nfe,steps", [("euler", 5, 5), ("midpoint", 6, 3), ("heun3", 6, 2), ("rk4", 12, 3)])
def test_nfe_is_what_the_solver_implies(solver, nfe, steps):
    model = timm.create_model("ssog_odevit_micro_patch1_8", solver=solver, nfe=nfe).eval()
    assert model.steps == steps and model.config()["nfe"] == nfe
    with torch.no_grad():
        model(images(model))
    assert model.nfe == nfe == steps * FIXED_SOLVERS[solver]
    assert model.field.nfe == nfe


def _random_field(model: OdeViT, scale: float = 0.2) -> OdeViT:
    """Give the adaLN-Zero modulation non-zero weights so the flow is not the identity."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.field.adaLN_modulation.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("solver", list(FIXED_SOLVERS))
def test_fixed_steps_are_torchdiffeqs_odeint_bit_for_bit(solver, dtype):
    """The family's traceable fixed-step loop gives exactly what torchdiffeq's public odeint gives
    for the same solver and grid, at every step."""
    from torchdiffeq import odeint

    model = _random_field(timm.create_model("ssog_odevit_micro_patch1_8", embed_dim=16, num_heads=2, solver=solver,
                                            nfe=3 * FIXED_SOLVERS[solver])).to(dtype).eval()
    x, grid = model.embed(images(model).to(dtype))
    times = torch.arange(4, dtype=dtype) / 3
    with torch.no_grad():
        reference = odeint(lambda t, y: model.field(t, y, grid), x, times, method=solver)
        states = model.integrate(x, grid)
    assert len(states) == 3 and model.nfe == 3 * FIXED_SOLVERS[solver]
    for step, state in enumerate(states, start=1):
        assert torch.equal(state, reference[step]), step


def test_dopri5_matches_a_fine_fixed_step_solution():
    """dopri5 at rtol=1e-7, atol=1e-9 lands within 1e-5 of 16 RK4 steps (float64; 16 and
    256 RK4 steps agree to ~2e-7, so the reference is far more accurate than that)."""
    torch.manual_seed(0)
    # weight_init="": the smaller weights these tolerances were set for (the solvers are under test)
    model = _random_field(timm.create_model("ssog_odevit_micro_patch1_8", weight_init="").double().eval())
    x = images(model).double()
    with torch.no_grad():
        model.configure_solver("rk4", nfe=4 * 16)
        fine = model.forward_features(x)
        model.configure_solver("dopri5", rtol=1e-7, atol=1e-9)
        adaptive = model.forward_features(x)
        start = model.norm(model.embed(x)[0])
    assert model.config()["nfe"] is None and 6 < model.nfe < 4 * 64
    assert (fine - start).abs().max() > 0.1  # the flow is far from the identity
    torch.testing.assert_close(adaptive, fine, rtol=0, atol=1e-5)


def test_adjoint_gradients_agree_with_direct_backprop():
    """8 RK4 steps (float64): the adjoint's gradients (from a backward RK4 solve) match
    back-propagation through the solver to 1e-4 of each gradient's largest entry."""
    torch.manual_seed(0)
    # weight_init="": a non-zero head (the default's is zero, so every gradient would be) and the
    # weights these tolerances were set for
    model = timm.create_model("ssog_odevit_micro_patch1_8", embed_dim=32, num_heads=2, global_pool="token",
                              weight_init="")
    model = _random_field(model.double())
    x = images(model, batch=1).double()

    def gradients(adjoint: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        model.configure_solver("rk4", nfe=32, adjoint=adjoint)
        model(x).square().sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    direct, adjoint = gradients(False), gradients(True)
    for name, grad in direct.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(adjoint[name], grad, rtol=0, atol=1e-4 * scale, msg=name)
    assert direct["field.mlp.fc1.weight"].abs().max() > 1e-2  # the comparison is not vacuous


def test_adjoint_with_fixed_steps_runs_and_counts_forward_evaluations():
    model = timm.create_model("mha_odevit_micro_patch1_8", solver="rk4", nfe=8, adjoint=True)
    model(images(model)).sum().backward()
    assert model.nfe == 8 and model.field.nfe > 8  # the backward solve evaluates the field too


def test_vector_field_is_callable_on_its_own():
    model = _random_field(timm.create_model("ssog_odevit_micro_patch1_8").eval())
    x, grid = model.embed(images(model))
    with torch.no_grad():
        out = model.field(torch.tensor(0.5), x, grid)
    assert out.shape == x.shape and out.abs().max() > 0


def test_layernorm_field_option():
    model = timm.create_model("mha_odevit_micro_patch1_8", field_norm="layernorm")
    assert isinstance(model.field.norm, torch.nn.LayerNorm) and model.field.norm.weight is None
    assert model(images(model)).shape == (2, 10)


def test_time_kernels_start_as_the_fixed_kernels_and_move_them_with_t():
    """``time_kernels``: one adaLN-Zero map of the time embedding to D*H*R*5 offsets of the
    kernels; at init the model is the fixed-kernel model with the same weights, an offset
    ``c`` (the map's bias) is the fixed kernels moved by ``c``, and the map trains."""
    moving = _random_field(timm.create_model("ssog_odevit_micro_patch1_8", time_kernels=True))
    fixed = timm.create_model("ssog_odevit_micro_patch1_8")
    assert set(moving.state_dict()) - set(fixed.state_dict()) == {
        "field.kernel_modulation.1.weight", "field.kernel_modulation.1.bias"}
    heads, atoms, dim = moving.num_heads, moving.field.attn.num_atoms, moving.embed_dim
    added = (dim + 1) * heads * atoms * 5
    for part in ("total", "modulation"):
        assert count_parameters(moving)[part] - count_parameters(fixed)[part] == added
    assert moving.config()["time_kernels"] is True and fixed.config()["time_kernels"] is False
    fixed.load_state_dict(moving.state_dict(), strict=False)
    with torch.no_grad():
        moving.head.weight.normal_()
        fixed.head.weight.copy_(moving.head.weight)
    x = images(moving)
    torch.testing.assert_close(moving(x), fixed(x))

    offset = 0.3 * torch.randn(heads, atoms, 5)
    with torch.no_grad():
        moving.field.kernel_modulation[1].bias.copy_(offset.flatten())
        attn = fixed.field.attn
        attn.mu += offset[..., 0:2]
        attn.rho += offset[..., 2:4]
        attn.logits += offset[..., 4]
    torch.testing.assert_close(moving(x), fixed(x))
    moving(x).square().sum().backward()
    assert moving.field.kernel_modulation[1].weight.grad.abs().sum() > 0


def test_time_kernels_need_ssogs_fixed_kernels():
    with pytest.raises(ValueError, match="time_kernels moves SSoG's kernels with t, and op 'mha' has none"):
        timm.create_model("mha_odevit_micro_patch1_8", time_kernels=True)
    with pytest.raises(ValueError, match=r"steers them by the tokens \(steer=\['mu'\]\): use one or the other"):
        timm.create_model("ssog_odevit_micro_patch1_8", time_kernels=True, steer=("mu",))
    with pytest.raises(ValueError, match="kernels_at gives an SSoG mixture; this field mixes with MultiHeadAttention"):
        timm.create_model("mha_odevit_micro_patch1_8").field.kernels_at(torch.tensor(0.0))


@pytest.mark.parametrize("family", FAMILIES)
def test_timm_default_weight_init_is_timms_vit_init(family):
    """``weight_init=""``: trunc-normal(0.02) position embedding and Linear weights, zero
    biases, near-zero class token, drawn in module order (every discrete and looped run's init)."""
    model = timm.create_model(f"mha_{family}_micro_patch1_8")
    reference = copy.deepcopy(model)
    torch.manual_seed(1)
    trunc_normal_(reference.pos_embed, std=0.02)
    nn.init.normal_(reference.cls_token, std=1e-6)
    for module in reference.modules():
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
    torch.manual_seed(1)
    model.init_weights("")
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("op", OPS)
def test_jax_weight_init_is_xavier_with_a_zero_head_and_a_zero_modulation(op):
    """The continuous family's default (DiT's init of adaLN-Zero blocks); the others keep timm's."""
    default = timm.create_model(f"{op}_odevit_tiny_patch4_32", weight_init="")
    model = timm.create_model(f"{op}_odevit_tiny_patch4_32")
    assert model.config()["weight_init"] == "jax"
    assert timm.create_model(f"{op}_vit_micro_patch1_8").weight_init == ""
    assert timm.create_model(f"{op}_loopvit_micro_patch1_8").weight_init == ""
    fc1 = model.field.mlp.fc1.weight
    bound = math.sqrt(6 / sum(fc1.shape))
    assert fc1.abs().max() <= bound and fc1.std() > 0.9 * bound / math.sqrt(3)
    assert default.field.mlp.fc1.weight.std() < 0.021
    assert not model.head.weight.any() and not model.field.adaLN_modulation[1].weight.any()
    kernels = {k: v for k, v in default.state_dict().items() if k.rsplit(".", 1)[-1] in ("mu", "rho", "logits")}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in kernels.items())  # the mixers keep their init
    assert len(kernels) == (3 if op == "ssog" else 0)


# ----------------------------------------------------------------------------- bad input
def test_bad_images_raise_clear_errors():
    model = timm.create_model("mha_vit_tiny_patch4_32")
    with pytest.raises(ValueError, match="not divisible by the patch size 4x4"):
        model(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 3, H, W\)"):
        model(torch.randn(1, 1, 32, 32))


@pytest.mark.parametrize("kwargs,match", [
    (dict(op="linear"), "unknown op 'linear'"),
    (dict(num_atoms=2), "only apply to op='ssog'"),
    (dict(global_pool="token", class_token=False), "needs class_token=True"),
    (dict(global_pool="max"), "unknown global_pool"),
    (dict(img_size=10, patch_size=4), "img_size=10 is not divisible by patch_size=4"),
    (dict(embed_dim=30, num_heads=4), "embed_dim=30 is not divisible by num_heads=4"),
    (dict(weight_init="xavier"), r"weight_init='xavier': expected one of timm's ViT modes"),
])
def test_bad_architecture_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        timm.create_model("mha_vit_micro_patch1_8", **kwargs)


def test_mixer_options_come_in_one_channel_as_a_mapping_or_as_keywords():
    torch.manual_seed(0)
    flat = timm.create_model("ssog_vit_micro_patch1_8", steer=["mu"], steer_gate_init=0.0, num_atoms=2)
    torch.manual_seed(0)
    mapped = timm.create_model("ssog_vit_micro_patch1_8", mixer_kwargs=dict(steer=["mu"], steer_gate_init=0.0),
                               num_atoms=2)
    assert flat.mixer_kwargs == mapped.mixer_kwargs and flat.mixer_kwargs["steer"] == ("mu",)
    assert all(torch.equal(a, b) for a, b in zip(flat.state_dict().values(), mapped.state_dict().values()))
    with pytest.raises(ValueError, match=r"mixer option\(s\) \['num_atoms'\] given both in mixer_kwargs and as"):
        timm.create_model("ssog_vit_micro_patch1_8", mixer_kwargs=dict(num_atoms=2), num_atoms=3)
    with pytest.raises(TypeError, match=r"unexpected option\(s\) \['num_atom'\]: neither a model argument nor"):
        timm.create_model("ssog_vit_micro_patch1_8", num_atom=2)


def test_a_new_option_of_the_layer_reaches_every_family_untouched(monkeypatch):
    """The families forward the layer's options without naming them: an option added to the
    layer's constructor alone is accepted, reported in ``config()`` and reaches every mixer."""
    from ssog.models import _blocks

    import inspect

    class Extended(SSoGAttention):
        def __init__(self, dim: int, num_heads: int, extra_option: int = 7, **kwargs) -> None:
            super().__init__(dim, num_heads, **kwargs)
            self.extra_option = extra_option

    # the layer's signature with one more keyword, as editing SSoGAttention.__init__ would give
    signature = inspect.signature(SSoGAttention)
    extra = inspect.Parameter("extra_option", inspect.Parameter.KEYWORD_ONLY, default=7)
    Extended.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])

    monkeypatch.setitem(_blocks.MIXERS, "ssog", Extended)
    for family in ("vit", "loopvit", "odevit"):
        model = timm.create_model(f"ssog_{family}_micro_patch1_8", extra_option=3)
        assert model.config()["ssog"]["extra_option"] == 3
        assert {mixer.extra_option for mixer in ssog_mixers(model)} == {3}
        assert timm.create_model(f"ssog_{family}_micro_patch1_8").config()["ssog"]["extra_option"] == 7


@pytest.mark.parametrize("kwargs,match", [
    (dict(solver="rk45"), "unknown solver 'rk45'.*euler.*dopri5"),
    (dict(solver="rk4", nfe=10), "nfe=10 is not a positive multiple of the 4"),
    (dict(solver="dopri5", nfe=12), "adaptive"),
    (dict(field_norm="rms"), "unknown field norm"),
])
def test_bad_solver_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        timm.create_model("ssog_odevit_micro_patch1_8", **kwargs)


def test_unknown_model_names_close_matches():
    with pytest.raises(ValueError, match="did you mean ssog_odevit_base_patch16_224"):
        create_model("ssog_odvit_base_patch16_224")


def test_no_pretrained_weights():
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("ssog_vit_micro_patch1_8", pretrained=True)


# ----------------------------------------------------------------------------- command line
def test_cli_info_json(capsys):
    assert main(["info", "mha_odevit_small_patch16_224", "--num-classes", "100", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["params"]["total"] == 3_070_564
    assert info["config"]["family"] == "odevit" and info["config"]["nfe"] == 12
    assert info == json.loads(json.dumps(model_info("mha_odevit_small_patch16_224", num_classes=100)))


def test_cli_flops(capsys):
    assert main(["flops", "ssog_loopvit_base_patch16_224", "--img-size", "384", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == 576 and result["attention_gflops"] == pytest.approx(18.4, abs=0.3)
    assert main(["flops", "ssog_loopvit_base_patch16_224"]) == 0
    assert "224x224 (196 tokens)" in capsys.readouterr().out


@pytest.mark.parametrize("argv,match", [
    (["info", "vit_base"], "unknown model 'vit_base'"),
    (["flops", "mha_vit_base_patch16_224", "--img-size", "100"], "not divisible by the patch size"),
])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, argv, match):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_every_model_is_a_register_model_function_written_out_in_its_family_module():
    """As timm's own modules: ``def NAME(`` under ``@register_model`` in the family's module (so a
    search for a model name finds it), with its ``default_cfgs`` entry beside it."""
    import importlib
    import inspect

    from timm.models import model_entrypoint

    names = list_models()
    assert len(names) == 36 and {name.split("_")[0] for name in names} == {"mha", "ssog"}
    for name in names:
        entry = model_entrypoint(name)
        module = importlib.import_module(entry.__module__)
        assert module.__name__ == f"ssog.models.{name.split('_')[1]}" and entry.__name__ == name
        assert f"@register_model\ndef {name}(pretrained: bool = False" in inspect.getsource(module), name
        assert name in module.default_cfgs


