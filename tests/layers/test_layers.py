"""ssog.layers: SSoGAttention and MultiHeadAttention against their matrices and contracts."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ssog.layers import CenterNorm, MultiHeadAttention, SSoGAttention, follow_model_grid, multiscale_widths

GRID = (5, 6)
DIM, HEADS = 48, 4


def tokens(batch: int = 2, prefix: int = 1, grid=GRID, dtype=torch.float64, seed: int = 0):
    n = prefix + grid[0] * grid[1]
    return torch.randn(batch, n, DIM, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def through_matrix(layer, x, grid):
    """What the layer computes, written with its dense mixing matrix."""
    batch, n, _ = x.shape
    values = layer.v(x) if isinstance(layer, SSoGAttention) else layer.qkv(x)[..., 2 * DIM :]
    values = values.view(batch, n, HEADS, DIM // HEADS).transpose(1, 2)
    mixed = layer.attention_matrix(x, grid) @ values
    return layer.proj(mixed.transpose(1, 2).reshape(batch, n, DIM))


@pytest.mark.parametrize("steer", [(), ("mu",), ("sigma",), ("lambda",), ("mu", "sigma", "lambda")])
@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_ssog_forward_equals_its_matrix(steer, prefix):
    torch.manual_seed(0)
    layer = SSoGAttention(DIM, HEADS, steer=steer, num_prefix_tokens=prefix, steer_gate_init=0.0).double()
    x = tokens(prefix=prefix)
    torch.testing.assert_close(layer(x, GRID), through_matrix(layer, x, GRID))


def test_attention_matrix_is_row_stochastic_with_prefix_semantics():
    layer = SSoGAttention(DIM, HEADS, num_prefix_tokens=2, steer=("mu",), steer_gate_init=0.0).double()
    a = layer.attention_matrix(tokens(prefix=2), GRID)
    n = GRID[0] * GRID[1]
    assert a.shape == (2, HEADS, 2 + n, 2 + n)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, HEADS, 2 + n, dtype=torch.float64))
    assert torch.all(a[:, :, :, :2] == 0), "nobody reads prefix keys"
    torch.testing.assert_close(a[:, :, :2, 2:], torch.full((2, HEADS, 2, n), 1 / n, dtype=torch.float64))


def test_prefix_output_is_mean_of_patch_values():
    layer = SSoGAttention(DIM, HEADS, num_prefix_tokens=1).double()
    layer.proj = torch.nn.Identity()
    x = tokens()
    out = layer(x, GRID)
    torch.testing.assert_close(out[:, 0], layer.v(x)[:, 1:].mean(dim=1))


def test_patches_do_not_read_prefix_tokens():
    layer = SSoGAttention(DIM, HEADS, num_prefix_tokens=1).double()
    x = tokens()
    changed = x.clone()
    changed[:, 0] += 100.0
    torch.testing.assert_close(layer(x, GRID)[:, 1:], layer(changed, GRID)[:, 1:])


def test_closed_gates_equal_fixed_operator_and_open_gates_differ():
    torch.manual_seed(0)
    fixed = SSoGAttention(DIM, HEADS).double()
    steered = SSoGAttention(DIM, HEADS, steer=("mu", "sigma", "lambda")).double()
    steered.load_state_dict(fixed.state_dict(), strict=False)
    x = tokens()
    with torch.no_grad():
        for gate in steered.steer_gate.values():
            gate.fill_(-1e4)  # sigmoid underflows to exactly 0
        torch.testing.assert_close(steered(x, GRID), fixed(x, GRID), rtol=1e-12, atol=1e-14)
        for gate in steered.steer_gate.values():
            gate.fill_(4.0)
        assert (steered(x, GRID) - fixed(x, GRID)).abs().max() > 1e-3


def test_cold_gates_start_close_to_fixed():
    torch.manual_seed(0)
    fixed = SSoGAttention(DIM, HEADS).double()
    steered = SSoGAttention(DIM, HEADS, steer=("mu",), steer_gate_init=-8.0).double()
    steered.load_state_dict(fixed.state_dict(), strict=False)
    x = tokens()
    difference = (steered(x, GRID) - fixed(x, GRID)).abs().max().item()
    assert 0 < difference < 1e-2


def test_gradients_reach_every_parameter():
    layer = SSoGAttention(DIM, HEADS, steer=("mu", "sigma", "lambda"), steer_gate_init=0.0)
    layer(tokens(dtype=torch.float32), GRID).square().mean().backward()
    for name, parameter in layer.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("backend", ["dense", "separable", "local"])
def test_backends_agree_inside_the_layer(backend):
    torch.manual_seed(0)
    reference = SSoGAttention(DIM, HEADS, backend="dense").double()
    layer = SSoGAttention(DIM, HEADS, backend=backend).double()
    layer.load_state_dict(reference.state_dict())
    x = tokens()
    torch.testing.assert_close(layer(x, GRID), reference(x, GRID), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend,steer", [
    ("auto", ()), ("fused", ()), ("dense", ()), ("separable", ()),
    ("auto", ("mu", "sigma", "lambda")), ("dense", ("mu", "sigma", "lambda")),
])
def test_a_kernel_offset_is_the_mixture_moved_by_it(backend, steer):
    """``kernel_offset (H, R, 5)`` adds to mu (y, x), rho (y, x) and the logits, on every path
    (fused tables with and without gradients, the backends, steering), and reaches its values'
    gradient; ``prepare(grid, offset)`` gives what the call builds."""
    torch.manual_seed(0)
    layer = SSoGAttention(DIM, HEADS, backend=backend, steer=steer, steer_gate_init=0.0).double()
    moved = SSoGAttention(DIM, HEADS, backend=backend, steer=steer, steer_gate_init=0.0).double()
    moved.load_state_dict(layer.state_dict())
    offset = (0.3 * torch.randn(HEADS, layer.num_atoms, 5, dtype=torch.float64)).requires_grad_()
    with torch.no_grad():
        moved.mu += offset[..., 0:2]
        moved.rho += offset[..., 2:4]
        moved.logits += offset[..., 4]
    x = tokens()
    out = layer(x, GRID, kernel_offset=offset)
    torch.testing.assert_close(out, moved(x, GRID))
    out.square().sum().backward()
    assert offset.grad is not None and offset.grad.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(layer(x, GRID, kernel_offset=offset), moved(x, GRID))
        prepared = layer.prepare(GRID, offset)
        torch.testing.assert_close(layer(x, GRID, prepared=prepared, kernel_offset=offset), moved(x, GRID))


def test_a_kernel_offset_of_the_wrong_shape_is_named():
    layer = SSoGAttention(DIM, HEADS)
    with pytest.raises(ValueError, match=r"kernel_offset has shape \(4, 4, 3\): expected \(heads, atoms, 5\)"):
        layer(tokens(dtype=torch.float32), GRID, kernel_offset=torch.zeros(HEADS, 4, 3))


def test_inference_reuses_the_fixed_tables_until_the_parameters_change():
    from ssog.ops import forced_backend

    torch.manual_seed(0)
    layer = SSoGAttention(DIM, HEADS).double().eval()
    x = tokens()
    expected = layer(x, GRID)  # with gradients: built by the op on every call, nothing kept
    assert layer._tables_cache is None
    with torch.no_grad():
        torch.testing.assert_close(layer(x, GRID), expected)
        cached = layer._tables_cache[1]
        layer(x, GRID)
        assert layer._tables_cache[1] is cached  # reused, not rebuilt
        layer.mu.add_(0.7)  # an in-place update, as an optimizer step makes
        moved = layer(x, GRID)
    assert layer._tables_cache[1] is not cached
    torch.testing.assert_close(moved, through_matrix(layer, x, GRID))
    with torch.no_grad():
        layer.mu.data.add_(1.5)  # bumps no version counter: the CPU key is the parameters' bytes
        torch.testing.assert_close(layer(x, GRID), through_matrix(layer, x, GRID))
        layer.logits.detach().numpy()[0, 0] += 2.0
        torch.testing.assert_close(layer(x, GRID), through_matrix(layer, x, GRID))
    layer.eval()  # train() and eval() drop the cache (the way out for .data edits on a GPU)
    assert layer._tables_cache is None
    layer.load_state_dict({k: v + 0.1 if k == "rho" else v for k, v in layer.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(layer(x, GRID), through_matrix(layer, x, GRID))
        layer._tables_cache = None
        with forced_backend("separable"):  # FLOP counting must see the separable path
            layer(x, GRID)
        assert layer._tables_cache is None
    steered = SSoGAttention(DIM, HEADS, steer=("mu",)).double().eval()
    with torch.no_grad():
        steered(x, GRID)
    assert steered._tables_cache is None


def test_initial_widths_are_multiscale_and_above_floor():
    widths = multiscale_widths(HEADS, 4)
    assert widths.min().item() == pytest.approx(0.5) and widths.max().item() == pytest.approx(4.0)
    assert torch.all(widths[:, 1:] > widths[:, :-1]), "each head goes from sharp to broad"
    layer = SSoGAttention(DIM, HEADS, sigma_min=0.5)
    assert layer.sigma().min().item() > 0.5
    torch.testing.assert_close(layer.weight(), torch.full((HEADS, 4), 0.25))


def test_rescale_kernels_scales_centres_and_widths():
    layer = SSoGAttention(DIM, HEADS, steer=("mu",))
    with torch.no_grad():
        layer.mu.normal_()
    before = {k: v.detach().clone() for k, v in layer.kernel_parameters().items()}
    layer.rescale_kernels(2.0)
    after = layer.kernel_parameters()
    torch.testing.assert_close(after["mu"], 2 * before["mu"])
    torch.testing.assert_close(after["sigma"], 2 * before["sigma"])
    torch.testing.assert_close(after["weight"], before["weight"])
    assert layer.steer_radius == (8.0, 8.0)


def test_kernel_scale_is_the_rescale_rule_applied_at_construction():
    """A layer built with kernel_scale s starts where a layer of scale 1 lands after
    rescale_kernels(s): one rule for initialisation in image units and for new grids."""
    for scale in (2.0, (1.5, 0.75)):
        torch.manual_seed(0)
        scaled = SSoGAttention(DIM, HEADS, steer=("mu",), kernel_scale=scale)
        torch.manual_seed(0)
        reference = SSoGAttention(DIM, HEADS, steer=("mu",))
        reference.rescale_kernels(scale)
        torch.testing.assert_close(scaled.mu, reference.mu)
        torch.testing.assert_close(scaled.sigma(), reference.sigma())
        assert scaled.steer_radius == reference.steer_radius
    anisotropic = SSoGAttention(DIM, HEADS, kernel_scale=(2.0, 1.0))
    plain = SSoGAttention(DIM, HEADS)
    torch.testing.assert_close(anisotropic.mu[..., 0], 2 * plain.mu[..., 0])
    torch.testing.assert_close(anisotropic.mu[..., 1], plain.mu[..., 1])
    assert anisotropic.steer_radius == (8.0, 4.0)


def test_kernel_scale_keeps_the_width_floor():
    layer = SSoGAttention(DIM, HEADS, kernel_scale=0.25)  # ladder 0.125-1 tokens, floor 0.3
    assert layer.sigma().min().item() == pytest.approx(0.30, abs=1e-6)
    assert layer.sigma().max().item() == pytest.approx(1.0, abs=1e-6)


def test_anisotropic_steer_radius_bounds_each_axis():
    layer = SSoGAttention(DIM, HEADS, steer=("mu",), steer_gate_init=20.0, kernel_scale=(2.0, 0.5))
    with torch.no_grad():
        layer.steer_proj["mu"].weight.mul_(1e4)  # saturate tanh
    mu, _, _ = layer.mixture(torch.randn(2, 16, DIM))
    shift = (mu - layer.mu.unsqueeze(1)).abs().amax(dim=(0, 1, 2, 3))
    torch.testing.assert_close(shift, torch.tensor([8.0, 2.0]), atol=1e-3, rtol=0)


def test_half_precision_forward_matches_fp32():
    torch.manual_seed(0)
    layer = SSoGAttention(DIM, HEADS)
    x = tokens(dtype=torch.float32)
    reference = layer(x, GRID)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x, GRID)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - reference).abs().max() / reference.abs().max()).item() < 0.05


# ------------------------------------------------------------------------ baseline
def test_mha_matches_sdpa_and_its_matrix():
    torch.manual_seed(0)
    layer = MultiHeadAttention(DIM, HEADS).double()
    x = tokens()
    torch.testing.assert_close(layer(x, GRID), through_matrix(layer, x, GRID))
    q, k, v = layer.qkv(x).view(2, 31, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
    expected = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 31, DIM)
    torch.testing.assert_close(layer(x, GRID), layer.proj(expected))


def test_mha_parameter_names_and_count_match_timm_attention():
    from timm.models.vision_transformer import Attention

    ours = MultiHeadAttention(384, 6)
    timms = Attention(384, num_heads=6, qkv_bias=True)
    assert {n for n, _ in ours.named_parameters()} == {n for n, _ in timms.named_parameters()}
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in timms.parameters())


def test_ssog_has_no_query_key_projections():
    ssog = SSoGAttention(384, 6, num_atoms=4)
    mha = MultiHeadAttention(384, 6)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(mha) - count(ssog) == 2 * (384 * 384 + 384) - 6 * 4 * 5


def test_center_norm_is_linear_and_centres():
    norm = CenterNorm(8)
    x, y = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(norm(2 * x + y), 2 * norm(x) + norm(y))
    torch.testing.assert_close(norm(x).mean(-1), torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(norm(x), (x - x.mean(-1, keepdim=True)) * 8 / 7)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layer_class", [SSoGAttention, MultiHeadAttention])
def test_layers_run_on_cuda(layer_class):
    layer = layer_class(DIM, HEADS).cuda()
    x = tokens(dtype=torch.float32).cuda()
    with torch.autocast("cuda", dtype=torch.float16):
        out = layer(x, GRID)
    out.float().sum().backward()
    torch.testing.assert_close(out.float().cpu(), layer.cpu()(x.cpu(), GRID), rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(dim=50, num_heads=4), "multiple of num_heads"),
        (dict(num_atoms=0), "num_atoms"),
        (dict(sigma_min=0.0), "sigma_min"),
        (dict(steer=("mu", "theta")), "cannot steer"),
        (dict(steer_radius=-1.0), "steer_radius"),
        (dict(backend="flash"), "unknown backend"),
        (dict(kernel_scale=0.0), "kernel_scale"),
        (dict(kernel_scale=(1.0, 2.0, 3.0)), "kernel_scale"),
        (dict(kernel_scale=float("nan")), "kernel_scale"),
        (dict(qk_norm=True), "qk_norm normalises the query tokens that steer"),
    ],
)
def test_bad_construction_raises_value_error(kwargs, message):
    arguments = dict(dim=DIM, num_heads=HEADS) | kwargs
    with pytest.raises(ValueError, match=message):
        SSoGAttention(**arguments)


@pytest.mark.parametrize("layer_class", [SSoGAttention, MultiHeadAttention])
def test_bad_tokens_raise_value_error(layer_class):
    layer = layer_class(DIM, HEADS)
    x = tokens(dtype=torch.float32)
    with pytest.raises(ValueError, match="do not match"):
        layer(x, (6, 6))
    with pytest.raises(ValueError, match="channels"):
        layer(torch.randn(2, 31, DIM + 1), GRID)
    with pytest.raises(ValueError, match=r"\(B, P \+ Hg\*Wg"):
        layer(torch.randn(31, DIM), GRID)
    with pytest.raises(ValueError, match="grid_size"):
        layer(x, 30)
    with pytest.raises(ValueError, match="multiple of num_heads"):
        layer_class(DIM, 5)


# --------------------------------------------------------------------- timm's attn_layer


def _timm_vit(attn_layer, **kwargs):
    """A 2-block width-32 timm ViT on 32 px images of 8 px patches (a 4x4 grid), ``attn_layer`` its attention."""
    import timm

    torch.manual_seed(0)
    args = dict(pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    return timm.create_model("vit_tiny_patch16_224", attn_layer=attn_layer, **{**args, **kwargs})


def test_timm_builds_a_vit_on_ssog_attention():
    model = _timm_vit(SSoGAttention, global_pool="avg")
    assert all(type(block.attn) is SSoGAttention and block.attn.num_prefix_tokens == 1 for block in model.blocks)
    follow_model_grid(model)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all(block.attn.mu.grad.abs().sum() > 0 for block in model.blocks)


def test_timm_attention_arguments_are_honoured():
    from timm.layers import LayerNorm

    layer = SSoGAttention.configured(num_prefix_tokens=0, steer=("mu",), steer_gate_init=0.0, num_atoms=2)
    model = _timm_vit(layer, class_token=False, global_pool="avg", qkv_bias=False, proj_bias=False, qk_norm=True,
                      scale_attn_norm=True, attn_drop_rate=0.25, proj_drop_rate=0.5)
    follow_model_grid(model)
    attn = model.blocks[0].attn
    assert isinstance(attn, SSoGAttention) and (attn.num_prefix_tokens, attn.num_atoms, attn.steer) == (0, 2, ("mu",))
    assert attn.v.bias is None and attn.proj.bias is None
    assert type(attn.q_norm) is LayerNorm and type(attn.norm) is LayerNorm  # timm's ViT's norm_layer
    assert (attn.attn_drop.p, attn.proj_drop.p) == (0.25, 0.5)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert attn.q_norm.weight.grad.abs().sum() > 0 and attn.norm.weight.grad.abs().sum() > 0
    # Attention dropout drops entries of the mixing matrix in training only.
    attn.proj_drop.p = 0.0
    x = tokens(prefix=0, grid=(4, 4), dtype=torch.float32)[..., :32]
    torch.manual_seed(1)
    first, second = attn(x), attn(x)
    assert not torch.allclose(first, second)
    attn.eval()
    kept = attn.attn_drop.p
    attn.attn_drop.p = 0.0
    expected = attn(x)
    attn.attn_drop.p = kept
    torch.testing.assert_close(attn(x), expected)


@pytest.mark.parametrize("steer", [(), ("mu",)])
def test_the_layer_never_checks_its_parameters_values_on_the_host(monkeypatch, steer):
    """The value checks read the parameters on the host, a synchronisation per call on a GPU:
    the layer's parameters are right by construction, so neither the dropout path in training
    nor the inference matrix runs them."""
    import ssog.ops.functional as functional

    def refuse(*args):
        raise AssertionError("the layer checked its parameters' values")

    monkeypatch.setattr(functional, "check_parameter_values", refuse)
    layer = SSoGAttention(DIM, HEADS, steer=steer, steer_gate_init=0.0, attn_drop=0.25).double()
    x = tokens()
    layer(x, grid_size=GRID).sum().backward()
    layer.eval()
    with torch.no_grad():
        layer(x, grid_size=GRID)


def test_the_grid_is_given_or_its_need_named():
    """Without a grid (timm's call) the layer refuses, even where the tokens would make a square
    after its prefix tokens: it cannot tell that square from another grid of as many patches."""
    layer = SSoGAttention(DIM, HEADS).double()
    x = tokens(grid=(6, 6))
    no_grid = r"got 37 tokens and no token grid: .*follow_model_grid\(model\) \(ssog.convert does\).*grid_size=\(Hg, Wg"
    with pytest.raises(ValueError, match=no_grid):
        layer(x)
    with pytest.raises(ValueError, match="no token grid"):
        layer.attention_matrix(x)
    layer.grid_size = GRID  # as follow_model_grid sets it from each image
    torch.testing.assert_close(layer(tokens()), layer(tokens(), GRID))
    with pytest.raises(ValueError, match="takes no attention mask"):
        layer(x, (6, 6), attn_mask=torch.ones(37, 37, dtype=torch.bool))
    with pytest.raises(ValueError, match="no token grid"):
        _timm_vit(SSoGAttention, class_token=False, global_pool="avg")(torch.randn(1, 3, 32, 32))


def test_configured_sets_defaults_that_arguments_override():
    layer_class = SSoGAttention.configured(num_atoms=2, qkv_bias=False)
    assert issubclass(layer_class, SSoGAttention)
    assert layer_class(DIM, HEADS).num_atoms == 2 and layer_class(DIM, HEADS).v.bias is None
    assert layer_class(DIM, HEADS, qkv_bias=True).v.bias is not None
    with pytest.raises(TypeError, match="not \\['heads'\\]"):
        SSoGAttention.configured(heads=2)
