"""ssog.ops: every backend against the dense definition, gradients, precision, bad input."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from ssog.ops import choose_backend, forced_backend, gaussian_rows, ssog_matrix, ssog_mix
from ssog.ops.checks import _in_range

GRIDS = [(5, 7), (4, 4), (1, 6), (6, 1)]
FIXED_BACKENDS = ["dense", "separable", "local", "fused", "auto"]
STEERED_BACKENDS = ["dense", "separable", "local", "auto"]
# The local backend truncates kernels at a relative tolerance; with a tolerance far below
# the precision of the comparison it must be exact (its truncation logic still runs).
EXACT_LOCAL = 1e-30


def fixed_params(heads: int, atoms: int, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mu = 2.0 * torch.randn(heads, atoms, 2, generator=g, dtype=dtype)
    sigma = 0.3 + 3.0 * torch.rand(heads, atoms, 2, generator=g, dtype=dtype)
    weight = torch.randn(heads, atoms, generator=g, dtype=dtype).softmax(-1)
    return mu, sigma, weight


def steered_params(batch: int, heads: int, n: int, atoms: int, dtype=torch.float64, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    mu = 2.0 * torch.randn(batch, heads, n, atoms, 2, generator=g, dtype=dtype)
    sigma = 0.3 + 2.0 * torch.rand(batch, heads, n, atoms, 2, generator=g, dtype=dtype)
    weight = torch.randn(batch, heads, n, atoms, generator=g, dtype=dtype).softmax(-1)
    return mu, sigma, weight


def values(batch: int, heads: int, n: int, dim: int, dtype=torch.float64, seed: int = 2):
    return torch.randn(batch, heads, n, dim, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def mix(v, mu, sigma, weight, grid, backend):
    tolerance = EXACT_LOCAL if backend == "local" else 1e-6
    return ssog_mix(v, mu, sigma, weight, grid, backend=backend, local_tolerance=tolerance)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


# --------------------------------------------------------------------------- definition
def test_gaussian_rows_match_formula():
    center = torch.tensor([1.3, -4.0], dtype=torch.float64)
    sigma = torch.tensor([0.7, 2.0], dtype=torch.float64)
    rows = gaussian_rows(center, sigma, 6)
    keys = torch.arange(6, dtype=torch.float64)
    for i in range(2):
        unnormalised = torch.exp(-((keys - center[i]) ** 2) / (2 * sigma[i] ** 2))
        torch.testing.assert_close(rows[i], unnormalised / unnormalised.sum())


def _gaussian_rows_by_formula(center, sigma, length):
    keys = torch.arange(length, dtype=center.dtype)
    return torch.softmax(-((keys - center.unsqueeze(-1)) ** 2) / (2 * sigma.unsqueeze(-1) ** 2), dim=-1)


def test_gaussian_rows_derivatives_match_autograd_of_the_formula():
    # gaussian_rows has hand-written backward and forward-mode derivatives; check them in
    # float64 against autograd of the plain formula, for centres inside and outside the grid.
    g = torch.Generator().manual_seed(0)
    center = (12 * torch.rand(3, 4, generator=g, dtype=torch.float64) - 3).requires_grad_()
    sigma = (0.3 + 3 * torch.rand(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(gaussian_rows, (center, sigma, 7))
    assert torch.autograd.gradgradcheck(gaussian_rows, (center, sigma, 7))
    assert torch.autograd.gradcheck(gaussian_rows, (center, sigma, 7), check_forward_ad=True, check_backward_ad=False)
    # torch.func on tensors that need no grad: jvp runs the plain formula (no graph is
    # recorded; the Function's jvp is checked by gradcheck above), jacrev the Function.
    c, s = center.detach(), sigma.detach()
    tangents = tuple(torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(2))
    ours = torch.func.jvp(lambda c, s: gaussian_rows(c, s, 7), (c, s), tangents)
    torch.testing.assert_close(ours, torch.func.jvp(lambda c, s: _gaussian_rows_by_formula(c, s, 7), (c, s), tangents))
    jacobian = torch.func.jacrev(lambda c: gaussian_rows(c, s, 7))(c)  # through the vmap rule
    torch.testing.assert_close(jacobian, torch.func.jacrev(lambda c: _gaussian_rows_by_formula(c, s, 7))(c))


def test_matrix_matches_definition_elementwise():
    mu, sigma, weight = fixed_params(2, 3)
    rows, cols = 3, 4
    a = ssog_matrix(mu, sigma, weight, (rows, cols))
    assert a.shape == (2, 12, 12)
    h, q, j = 1, 5, 10
    qy, qx, jy, jx = q // cols, q % cols, j // cols, j % cols
    expected = 0.0
    for r in range(3):
        ky = gaussian_rows(qy + mu[h, r, 0:1], sigma[h, r, 0:1], rows)[0, jy]
        kx = gaussian_rows(qx + mu[h, r, 1:2], sigma[h, r, 1:2], cols)[0, jx]
        expected += weight[h, r] * ky * kx
    assert math.isclose(a[h, q, j].item(), expected.item(), rel_tol=1e-12)


@pytest.mark.parametrize("grid", GRIDS)
def test_rows_sum_to_one(grid):
    n = grid[0] * grid[1]
    assert torch.allclose(ssog_matrix(*fixed_params(3, 4), grid).sum(-1), torch.ones(3, n, dtype=torch.float64))
    steered = ssog_matrix(*steered_params(2, 3, n, 4), grid)
    assert torch.allclose(steered.sum(-1), torch.ones(2, 3, n, dtype=torch.float64))


def test_zero_offset_is_a_blur_peaking_at_the_query():
    mu = torch.zeros(1, 1, 2)
    a = ssog_matrix(mu, torch.full((1, 1, 2), 0.5), torch.ones(1, 1), (7, 7))[0]
    assert torch.equal(a.argmax(-1), torch.arange(49))


# ------------------------------------------------------------------ backends vs definition
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("atoms", [1, 4])
@pytest.mark.parametrize("backend", FIXED_BACKENDS)
def test_fixed_backends_match_dense_definition(grid, atoms, backend):
    n = grid[0] * grid[1]
    mu, sigma, weight = fixed_params(3, atoms)
    v = values(2, 3, n, 5)
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    assert relative_error(mix(v, mu, sigma, weight, grid, backend), expected) < 1e-10
    out32 = mix(v.float(), mu.float(), sigma.float(), weight.float(), grid, backend)
    assert out32.dtype == torch.float32
    assert relative_error(out32.double(), expected) < 1e-5


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("atoms", [1, 4])
@pytest.mark.parametrize("backend", STEERED_BACKENDS)
def test_steered_backends_match_dense_definition(grid, atoms, backend):
    n = grid[0] * grid[1]
    mu, sigma, weight = steered_params(2, 3, n, atoms)
    v = values(2, 3, n, 5)
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    assert relative_error(mix(v, mu, sigma, weight, grid, backend), expected) < 1e-10
    out32 = mix(v.float(), mu.float(), sigma.float(), weight.float(), grid, backend)
    assert relative_error(out32.double(), expected) < 1e-5


def with_special_weight(weight: torch.Tensor, kind: str) -> torch.Tensor:
    """``weight`` with its first atom at exactly 0 (a softmax's limit; the other atoms
    renormalised, and with one atom the head weighs nothing) or at -0.5 (a signed mixture)."""
    weight = weight.clone()
    weight[..., 0] = 0.0 if kind == "zero" else -0.5
    if kind == "zero" and weight.shape[-1] > 1:
        weight = weight / weight.sum(-1, keepdim=True)
    return weight


def check_special_weights(mu, sigma, weight, grid, backend):
    """Every backend agrees with the definition, without NaN, at float64 and float32 (and the
    local backend at its default tolerance within its bound, ``tolerance * N * sum|w| * max|v|``)."""
    n = grid[0] * grid[1]
    v = values(2, 3, n, 5)
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    scale = v.abs().max()
    out = mix(v, mu, sigma, weight, grid, backend)
    assert out.isfinite().all() and (out - expected).abs().max() < 1e-10 * scale
    out32 = mix(v.float(), mu.float(), sigma.float(), weight.float(), grid, backend)
    assert out32.isfinite().all() and (out32.double() - expected).abs().max() < 1e-5 * scale
    if backend == "local":
        out = ssog_mix(v, mu, sigma, weight, grid, backend="local")
        bound = 1e-6 * n * weight.abs().sum(-1).max() * scale
        assert out.isfinite().all() and (out - expected).abs().max() <= bound


@pytest.mark.parametrize("kind", ["zero", "negative"])
@pytest.mark.parametrize("atoms", [1, 4])
@pytest.mark.parametrize("backend", FIXED_BACKENDS)
def test_fixed_backends_take_zero_and_negative_weights(kind, atoms, backend):
    mu, sigma, weight = fixed_params(3, atoms)
    check_special_weights(mu, sigma, with_special_weight(weight, kind), (5, 7), backend)


@pytest.mark.parametrize("kind", ["zero", "negative"])
@pytest.mark.parametrize("atoms", [1, 4])
@pytest.mark.parametrize("backend", STEERED_BACKENDS)
def test_steered_backends_take_zero_and_negative_weights(kind, atoms, backend):
    mu, sigma, weight = steered_params(2, 3, 35, atoms)
    check_special_weights(mu, sigma, with_special_weight(weight, kind), (5, 7), backend)


@pytest.mark.parametrize("backend", ["separable", "local"])
def test_blocked_separable_path_matches_across_block_boundaries(backend, monkeypatch):
    """Blocks that split batch*heads and query rows unevenly give the same answer."""
    from ssog.ops import backends

    monkeypatch.setattr(backends, "SEPARABLE_BLOCK_BYTES", 1)  # one row of one item per block
    grid = (6, 5)
    mu, sigma, weight = fixed_params(3, 2)
    v = values(3, 3, 30, 4)
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    result = mix(v, mu, sigma, weight, grid, backend)
    assert relative_error(result, expected) < 1e-10


def test_steered_query_chunks_match(monkeypatch):
    from ssog.ops import steered_backends

    grid = (4, 5)
    mu, sigma, weight = steered_params(2, 2, 20, 3)
    v = values(2, 2, 20, 3)
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    monkeypatch.setattr(steered_backends, "STEERED_CHUNK_BYTES", 8 * 2 * 2 * 20 * 3)  # 3 queries a chunk
    for backend in STEERED_BACKENDS:
        assert relative_error(mix(v, mu, sigma, weight, grid, backend), expected) < 1e-10

    # Gradients match the definition's, through chunks recomputed in the backward pass
    # (rows over the saved-rows budget) and through rows built at once and kept.
    reference = [t.clone().requires_grad_() for t in (v, mu, sigma, weight)]
    probe = values(2, 2, 20, 3, seed=5)
    ((ssog_matrix(*reference[1:], grid) @ reference[0]) * probe).sum().backward()
    for saved_rows_bytes in (0, steered_backends.STEERED_SAVED_ROWS_BYTES):
        monkeypatch.setattr(steered_backends, "STEERED_SAVED_ROWS_BYTES", saved_rows_bytes)
        inputs = [t.clone().requires_grad_() for t in (v, mu, sigma, weight)]
        (mix(*inputs, grid, "dense") * probe).sum().backward()
        for got, want in zip(inputs, reference):
            assert relative_error(got.grad, want.grad) < 1e-10


def test_local_backend_error_is_bounded_by_its_tolerance():
    grid = (16, 16)
    mu, sigma, weight = fixed_params(2, 4, seed=3)
    v = values(1, 2, 256, 4)
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    for tolerance in (1e-3, 1e-6, 1e-9):
        out = ssog_mix(v, mu, sigma, weight, grid, backend="local", local_tolerance=tolerance)
        # dropped keys each weigh < tolerance * peak <= tolerance; at most N per row
        assert (out - expected).abs().max().item() <= tolerance * 256 * v.abs().max().item()


def narrow_steered_params(batch: int, heads: int, grid: tuple[int, int], atoms: int, seed: int = 4):
    """Steered kernels a few tokens wide and off-centre by up to 3 tokens, so that the
    windowed path's key boxes are smaller than the grid."""
    g = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1]
    mu = 3.0 * torch.tanh(torch.randn(batch, heads, n, atoms, 2, generator=g, dtype=torch.float64))
    sigma = 0.3 + 0.7 * torch.rand(batch, heads, n, atoms, 2, generator=g, dtype=torch.float64)
    weight = torch.randn(batch, heads, n, atoms, generator=g, dtype=torch.float64).softmax(-1)
    return mu, sigma, weight


@pytest.mark.parametrize("tile", [3, 8])
def test_windowed_steered_error_is_bounded_by_its_tolerance(tile, monkeypatch):
    from ssog.ops import steered_backends

    monkeypatch.setattr(steered_backends, "STEERED_TILE", tile)
    grid = (26, 21)
    params = narrow_steered_params(1, 2, grid, 3)
    v = values(1, 2, 26 * 21, 4)
    expected = ssog_matrix(*params, grid) @ v
    for tolerance in (1e-3, 1e-6, 1e-9):
        tiles = steered_backends.steered_tiles(steered_backends.steered_windows(*params[:2], grid, tolerance), tile)
        assert steered_backends.steered_local_cost(tiles) < (26 * 21) ** 2  # keys really are skipped
        out = ssog_mix(v, *params, grid, backend="local", local_tolerance=tolerance)
        # per axis the dropped mass is < tolerance * L; renormalising moves as much again
        assert (out - expected).abs().max().item() <= 2 * tolerance * (26 + 21) * v.abs().max().item()


def test_windowed_steered_keeps_the_border_key_of_centres_far_outside():
    grid = (9, 10)
    mu, sigma, weight = narrow_steered_params(1, 2, grid, 2)
    mu[..., 0, 0] = 50.0  # atom 0: far below the grid, narrow: all its y mass on the last row
    mu[..., 0, 1] = -50.0
    sigma[..., 0, :] = 0.25
    v = values(1, 2, 90, 3)
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    out = ssog_mix(v, mu, sigma, weight, grid, backend="local", local_tolerance=1e-6)
    assert (out - expected).abs().max().item() <= 2e-6 * 19 * v.abs().max().item()


def test_windowed_steered_gradcheck_with_truncated_windows(monkeypatch):
    from ssog.ops import steered_backends

    monkeypatch.setattr(steered_backends, "STEERED_TILE", 2)
    grid = (4, 4)
    mu, sigma, weight = narrow_steered_params(1, 1, grid, 1, seed=5)
    mu, sigma, weight = (t.requires_grad_() for t in (0.2 * mu, 0.5 * sigma, weight))
    v = values(1, 1, 16, 2).requires_grad_()
    tiles = steered_backends.steered_tiles(steered_backends.steered_windows(mu, sigma, grid, 1e-2), 2)
    assert steered_backends.steered_local_cost(tiles) < 16**2
    assert torch.autograd.gradcheck(
        lambda *a: ssog_mix(*a, grid, backend="local", local_tolerance=1e-2), (v, mu, sigma, weight)
    )


def test_auto_takes_the_windowed_steered_path_only_when_cheaper(monkeypatch, without_cpp):
    from ssog.ops import steered_backends

    taken = []
    monkeypatch.setattr(steered_backends, "steered_local", lambda v, *a: taken.append("local") or torch.zeros_like(v))
    monkeypatch.setattr(steered_backends, "steered_mix",
                        lambda v, *a, **k: taken.append("dense") or torch.zeros_like(v))
    v = torch.zeros(2, 6, 48 * 48, 64)
    narrow = [t.float() for t in narrow_steered_params(2, 6, (48, 48), 4)]
    ssog_mix(v, *narrow, (48, 48))
    wide = (narrow[0], narrow[1] + 30.0, narrow[2])  # kernels spanning the grid: whole rows
    ssog_mix(v, *wide, (48, 48))
    assert taken == ["local", "dense"]


# ---------------------------------------------------------------------------- gradients
def assert_gradients_match_dense_path(params, v, grid, backend):
    inputs = (v, *params)
    for t in inputs:
        t.requires_grad_()
    probe = values(*v.shape, seed=9)
    (ssog_matrix(*params, grid) @ v).mul(probe).sum().backward()
    expected = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    mix(*inputs, grid, backend).mul(probe).sum().backward()
    for got, want in zip((t.grad for t in inputs), expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", FIXED_BACKENDS)
def test_fixed_gradients_match_dense_path(backend):
    assert_gradients_match_dense_path(fixed_params(2, 3), values(2, 2, 20, 3), (4, 5), backend)


@pytest.mark.parametrize("backend", STEERED_BACKENDS)
def test_steered_gradients_match_dense_path(backend):
    assert_gradients_match_dense_path(steered_params(2, 2, 12, 2), values(2, 2, 12, 3), (3, 4), backend)


@pytest.mark.parametrize("backend", FIXED_BACKENDS)
def test_fixed_gradcheck(backend):
    grid = (3, 4)
    mu, sigma, weight = (t.requires_grad_() for t in fixed_params(2, 2))
    v = values(1, 2, 12, 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: mix(*a, grid, backend), (v, mu, sigma, weight))


@pytest.mark.parametrize("backend", STEERED_BACKENDS)
def test_steered_gradcheck(backend):
    grid = (2, 3)
    mu, sigma, weight = (t.requires_grad_() for t in steered_params(1, 2, 6, 2))
    v = values(1, 2, 6, 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: mix(*a, grid, backend), (v, mu, sigma, weight))


# ----------------------------------------------------------------------------- extremes
@pytest.mark.parametrize("backend", FIXED_BACKENDS)
def test_extreme_parameters_are_finite_and_correct(backend):
    grid = (6, 7)
    mu = torch.tensor([[[50.0, -50.0], [0.0, 0.0], [-3.0, 2.0]]], dtype=torch.float64)
    sigma = torch.tensor([[[0.25, 0.25], [1000.0, 1000.0], [0.25, 1000.0]]], dtype=torch.float64)
    weight = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    v = values(2, 1, 42, 3)
    a = ssog_matrix(mu, sigma, weight, grid)
    assert torch.isfinite(a).all()
    # centre 50 rows below and 50 columns left: all the atom's mass on the bottom-left key
    corner = ssog_matrix(mu[:, :1], sigma[:, :1], torch.ones(1, 1, dtype=torch.float64), grid)[0]
    assert torch.allclose(corner[:, 5 * 7 + 0], torch.ones(42, dtype=torch.float64))
    # width 1000: uniform over the grid
    wide = ssog_matrix(mu[:, 1:2], sigma[:, 1:2], torch.ones(1, 1, dtype=torch.float64), grid)
    assert torch.allclose(wide, torch.full_like(wide, 1 / 42), rtol=1e-4)  # exp(-6^2 / 2e6) ~ 1 - 2e-5
    out = mix(v, mu, sigma, weight, grid, backend)
    assert torch.isfinite(out).all()
    assert relative_error(out, a @ v) < 1e-10


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", FIXED_BACKENDS)
def test_half_precision_agrees_with_fp32(dtype, backend):
    """Kernels are built in fp32; only the contraction runs in half precision.

    Tolerance: a row of A sums to 1, so the result is a convex combination of values; its
    error is that of rounding the values and kernels to half precision (2^-8 relative for
    bf16, 2^-11 for fp16) plus fp32-accumulated rounding: we allow 4 units.
    """
    grid = (6, 6)
    mu, sigma, weight = fixed_params(2, 4, dtype=torch.float32)
    v = values(2, 2, 36, 8, dtype=torch.float32)
    reference = mix(v, mu, sigma, weight, grid, "dense")
    out = mix(v.to(dtype), mu, sigma, weight, grid, backend)
    assert out.dtype == dtype
    unit = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    assert relative_error(out.float(), reference) < 4 * unit


# ------------------------------------------------------------------------ registered ops
def registered_op_cases():
    """Arguments of each op of ssog.ops.fused: fp32 and fp64, a prefix token or none, values
    by head ``(B, T, H, d)`` or as the projection writes them ``(B, T, H*d)``."""
    from ssog.ops import fused

    cases = []
    for dtype, prefix, flat in ((torch.float32, 1, True), (torch.float64, 0, False), (torch.float32, 2, False)):
        mu, sigma, weight = fixed_params(2, 3, dtype=dtype)
        ky, kx, _ = fused.fixed_tables(mu, sigma, weight, 4, 5)
        v = torch.randn(2, prefix + 20, 2, 16, dtype=dtype)
        v = v.flatten(2) if flat else v
        cases += [
            (torch.ops.ssog.fixed_tables, (mu, sigma, weight, 4, 5)),
            (torch.ops.ssog.fixed_mix, (v, ky, kx, prefix)),
            (torch.ops.ssog.fixed_mix, (v.clone().requires_grad_(), ky.clone().requires_grad_(),
                                        kx.clone().requires_grad_(), prefix)),
            (torch.ops.ssog.fixed_mix_transposed, (v, ky, kx, prefix)),
            (torch.ops.ssog.fixed_mix_table_grads, (v, v.flip(0), ky, kx, prefix)),
            (torch.ops.ssog.fixed_tables_backward, (ky, kx, mu, sigma, weight)),
            (torch.ops.ssog.fixed_tables, tuple(t.clone().requires_grad_() for t in (mu, sigma, weight)) + (4, 5)),
            (torch.ops.ssog.layer_tables, (mu, sigma.log(), weight.log(), 0.25, 4, 5)),
            (torch.ops.ssog.layer_tables,
             tuple(t.clone().requires_grad_() for t in (mu, sigma, weight)) + (0.25, 4, 5)),
            (torch.ops.ssog.layer_tables_backward, (ky, kx, mu, sigma, weight, 0.25)),
        ]
    return cases


def test_registered_ops_pass_opcheck():
    for op, args in registered_op_cases():
        torch.library.opcheck(op, args)


def test_layer_tables_are_the_fixed_tables_of_the_layers_parameterisation():
    from ssog.layers import SSoGAttention
    from ssog.ops import fused

    layer = SSoGAttention(24, 3, num_atoms=4).double()
    parameters = (layer.mu, layer.rho, layer.logits)
    for got, want in zip(fused.layer_tables(*parameters, layer.sigma_min, 5, 7),
                         fused.fixed_tables(layer.mu, layer.sigma(), layer.weight(), 5, 7)):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda *p: fused.layer_tables(*p, layer.sigma_min, 5, 7)[:2], parameters)


@pytest.mark.parametrize("prefix", [0, 1, 3])
def test_fused_mixing_is_the_mixers_matrix_with_float64_gradients(prefix):
    """The whole (P + N) x (P + N) matrix of the layer (prefix rows the patch mean), and
    gradcheck through the tables into mu, sigma and weight."""
    from ssog.ops import fused

    grid, n = (5, 7), 35
    mu, sigma, weight = (t.requires_grad_() for t in fixed_params(2, 3))
    v = torch.randn(2, prefix + n, 2, 4, dtype=torch.float64, requires_grad=True)

    def mixer(v, mu, sigma, weight):
        ky, kx, _ = fused.fixed_tables(mu, sigma, weight, *grid)
        return fused.fixed_mix(v, ky, kx, prefix)

    out = mixer(v, mu, sigma, weight)
    patches = v[:, prefix:]
    torch.testing.assert_close(out[:, prefix:], torch.einsum("hqj,bjhd->bqhd", ssog_matrix(mu, sigma, weight, grid),
                                                             patches))
    torch.testing.assert_close(out[:, :prefix], patches.mean(1, keepdim=True).expand(-1, prefix, -1, -1))
    assert torch.autograd.gradcheck(mixer, (v, mu, sigma, weight))


def test_cpu_table_gradients_agree_with_both_pytorch_routes(monkeypatch):
    """The compiled kernel of the tables' gradient against the dense and the separable routes."""
    from ssog.ops import cpp_kernels, fused

    if not cpp_kernels.available():
        pytest.skip(cpp_kernels.unavailable_reason())
    for grid in ((5, 7), (8, 8), (3, 12)):
        mu, sigma, weight = fixed_params(3, 4, dtype=torch.float32)
        ky, kx, _ = fused.fixed_tables(mu, sigma, weight, *grid)
        v, grad = (torch.randn(2, 1 + grid[0] * grid[1], 3 * 16) for _ in range(2))
        compiled = fused.fixed_mix_table_grads(grad, v, ky, kx, 1)
        for dense in (True, False):
            with monkeypatch.context() as patch:
                patch.setattr(cpp_kernels, "supports", lambda v: False)
                patch.setattr(fused, "dense_costs", lambda *a, dense=dense, **k: (dense, 0, 0, 0))
                routed = fused.fixed_mix_table_grads(grad, v, ky, kx, 1)
            for got, want in zip(compiled, routed):
                assert relative_error(got, want) < 1e-5, (grid, dense)


def test_flop_counter_counts_the_fused_mixing_in_separable_form():
    from torch.utils.flop_counter import FlopCounterMode

    from ssog.ops import fused

    mu, sigma, weight = fixed_params(2, 3, dtype=torch.float32)
    ky, kx, _ = fused.fixed_tables(mu, sigma, weight, 4, 5)
    v = torch.randn(3, 21, 2 * 16)
    with FlopCounterMode(display=False) as counter:
        fused.fixed_mix(v, ky, kx, 1)
    assert counter.get_total_flops() == 2 * 3 * 2 * 3 * 20 * (4 + 5) * 16  # 2 B H R N (Hg + Wg) d


# ------------------------------------------------------------------------ dispatch
@pytest.fixture
def without_cpp(monkeypatch):
    """As on a machine without a C++ compiler (tests/ops/test_cpp_kernels.py covers the cpp backend)."""
    from ssog.ops import cpp_kernels

    monkeypatch.setattr(cpp_kernels, "takes", lambda *args: False)


def test_registry_says_where_each_backend_runs(without_cpp, monkeypatch):
    from ssog.ops import BACKEND_NAMES, BACKENDS

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert BACKEND_NAMES == ("auto", "dense", "separable", "local", "cpp", "fused", "triton")
    cpu, meta = torch.device("cpu"), torch.device("meta")
    for name in ("dense", "separable"):
        assert BACKENDS[name].can_run(meta, torch.float64, 3, True, True)
    assert BACKENDS["local"].can_run(cpu, torch.float32, 3, True, True)
    assert not BACKENDS["local"].can_run(meta, torch.float32, 3, True, False)  # reads its windows' values
    assert not BACKENDS["cpp"].can_run(cpu, torch.float32, 16, False, False)  # no compiler (the fixture)
    for device, dtype in ((cpu, torch.float32), (meta, torch.float64), (CUDA, torch.float16)):
        assert BACKENDS["fused"].can_run(device, dtype, 3, False, True)  # the registered ops: anywhere, autograd too
    for name in ("fused", "triton"):
        assert BACKENDS[name].steered is None
        assert not BACKENDS[name].can_run(cpu, torch.float32, 16, True, False)
        with pytest.raises(ValueError, match=f"{name} backend supports fixed kernels only"):
            BACKENDS[name].mixing(steered=True)
    assert not BACKENDS["triton"].can_run(cpu, torch.float32, 16, False, False)  # Triton's kernels: CUDA only


def test_auto_and_the_benchmark_ask_the_registry(monkeypatch):
    import dataclasses

    from ssog.bench.operator import OperatorConfig, unavailable_backends
    from ssog.ops import BACKENDS

    cpu = torch.device("cpu")
    monkeypatch.setitem(BACKENDS, "cpp", dataclasses.replace(BACKENDS["cpp"], can_run=lambda *args: True))
    assert choose_backend((1, 1, 4, 3), (2, 2), 1, False, cpu, requires_grad=True) == "cpp"
    monkeypatch.setitem(BACKENDS, "cpp", dataclasses.replace(BACKENDS["cpp"], can_run=lambda *args: False))
    assert choose_backend((1, 1, 4, 16), (2, 2), 1, False, cpu) == "fused"
    monkeypatch.setitem(BACKENDS, "fused", dataclasses.replace(BACKENDS["fused"], can_run=lambda *args: False))
    assert choose_backend((1, 1, 4, 16), (2, 2), 1, False, cpu) == "dense"
    assert set(unavailable_backends(OperatorConfig(backends=("dense", "cpp")))) == {"cpp"}


@pytest.fixture
def without_fused(monkeypatch):
    """As where the registered ops may not run (``torch.export``, ``torch.jit.trace``): the cost model decides."""
    import dataclasses

    from ssog.ops import BACKENDS

    monkeypatch.setitem(BACKENDS, "fused", dataclasses.replace(BACKENDS["fused"], can_run=lambda *args: False))


def test_auto_takes_the_fused_ops_for_fixed_kernels_and_dense_rows_for_steered(without_cpp):
    cpu = torch.device("cpu")
    for grid in (4, 14, 32, 64):
        for requires_grad in (False, True):
            assert choose_backend((4, 12, grid * grid, 64), (grid, grid), 4, False, cpu, requires_grad) == "fused"
        assert choose_backend((4, 12, grid * grid, 64), (grid, grid), 4, True, cpu) == "dense"


def test_auto_without_the_fused_ops_picks_dense_for_small_grids_and_separable_for_large(without_cpp, without_fused):
    cpu = torch.device("cpu")
    assert choose_backend((4, 12, 16, 64), (4, 4), 4, False, cpu) == "dense"
    assert choose_backend((4, 12, 4096, 64), (64, 64), 4, False, cpu) == "separable"
    assert choose_backend((4, 12, 4096, 64), (64, 64), 4, True, cpu) == "dense"
    # at 14x14 the separable backward's many small GEMMs cost more than one dense GEMM
    assert choose_backend((4, 12, 196, 64), (14, 14), 4, False, cpu, requires_grad=False) == "separable"
    assert choose_backend((4, 12, 196, 64), (14, 14), 4, False, cpu, requires_grad=True) == "dense"
    assert choose_backend((4, 12, 1024, 64), (32, 32), 4, False, cpu, requires_grad=True) == "separable"


# On CUDA (decisions from shapes alone, so they run here): the shapes of ``ssog bench-op`` on
# CUDA (docs/results/gpu_check.md), batch 4, 12 heads, head_dim 64, 4 atoms; A fits
# DENSE_MAX_MATRIX_BYTES up to 24x24.
CUDA = torch.device("cuda")
BENCH_GRIDS = (14, 16, 24, 32, 48, 64)


def bench_shape(grid: int) -> tuple[int, int, int, int]:
    return (4, 12, grid * grid, 64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_auto_on_cuda_takes_the_fused_ops_at_every_grid(dtype):
    for grid in BENCH_GRIDS:
        for requires_grad in (False, True):
            for cached in (False, True):
                choice = choose_backend(bench_shape(grid), (grid, grid), 4, False, CUDA, requires_grad,
                                        matrix_cached=cached, dtype=dtype)
                assert choice == "fused", (grid, requires_grad, cached)
    assert choose_backend((1, 1, 12, 8), (3, 4), 1, False, CUDA, dtype=dtype) == "fused"


def test_auto_on_cuda_without_the_fused_ops_weighs_dense_against_separable(without_fused):
    for requires_grad in (False, True):
        picks = [choose_backend(bench_shape(g), (g, g), 4, False, CUDA, requires_grad, dtype=torch.float16)
                 for g in BENCH_GRIDS]
        assert picks == ["dense", "dense", "dense", "separable", "separable", "separable"]
    # other accelerators keep their estimated weight: 24x24 is separable there
    mps = torch.device("mps")
    assert choose_backend(bench_shape(24), (24, 24), 4, False, mps, dtype=torch.float16) == "separable"


def test_auto_on_cuda_keeps_dense_rows_for_steered_kernels():
    for requires_grad in (False, True):
        assert choose_backend(bench_shape(32), (32, 32), 4, True, CUDA, requires_grad, dtype=torch.float16) == "dense"


def test_auto_leaves_the_fused_ops_out_of_torch_func_transforms(monkeypatch):
    from ssog.ops import functional

    assert choose_backend(bench_shape(32), (32, 32), 4, False, CUDA, True, dtype=torch.float16,
                          transformed=True) == "separable"
    assert choose_backend(bench_shape(24), (24, 24), 4, False, CUDA, True, dtype=torch.float16,
                          transformed=True) == "dense"
    # ssog_mix says when a transform wraps the values
    seen = []
    original = functional.choose_backend
    monkeypatch.setattr(functional, "choose_backend",
                        lambda *a, **k: seen.append(k["transformed"]) or original(*a, **k))
    mu, sigma, weight = fixed_params(1, 2, dtype=torch.float32)
    v = values(2, 1, 4, 2, dtype=torch.float32)
    torch.func.vmap(lambda x: ssog_mix(x, mu, sigma, weight, (2, 2)))(v.unsqueeze(1))
    ssog_mix(v, mu, sigma, weight, (2, 2))
    assert seen == [True, False]


def test_auto_takes_the_fused_ops_under_compile_and_recorded_paths_under_trace_and_export():
    def pick(grid: int) -> str:
        return choose_backend(bench_shape(grid), (grid, grid), 4, False, CUDA, dtype=torch.float16)

    names = ["dense", "separable", "fused"]
    picked = []

    def traced(x):  # torch.jit.trace: every batch, as for a cached A; not the registered ops
        picked.extend(pick(grid) for grid in (14, 32))
        return x + 1

    torch.jit.trace(traced, torch.zeros(1), check_trace=False)
    assert picked == ["dense", "separable"]

    def compiled(x):  # torch.compile: the registered ops, one node each in the graph
        return x + names.index(pick(14)) * 10 + names.index(pick(32))

    assert torch.compile(compiled, fullgraph=True, backend="eager")(torch.zeros(1)).item() == 22

    class AnyGrid(torch.nn.Module):  # torch.export, dynamic height and width: separable, for every grid
        def forward(self, x):
            grid = (x.shape[0], x.shape[1])
            choice = choose_backend((4, 12, grid[0] * grid[1], 64), grid, 4, False, CUDA, dtype=torch.float16)
            return x + names.index(choice)

    side = torch.export.Dim("side", min=2, max=64)
    exported = torch.export.export(AnyGrid(), (torch.zeros(5, 6),), dynamic_shapes={"x": {0: side, 1: side + 1}})
    assert exported.module()(torch.zeros(3, 4)).max() == 1

    class FixedGrid(torch.nn.Module):  # torch.export of one grid: the cost model, not the registered ops
        def forward(self, x):
            return x + names.index(pick(14)) * 10 + names.index(pick(32))

    assert torch.export.export(FixedGrid(), (torch.zeros(2),)).module()(torch.zeros(2)).max() == 1


def test_forced_backend_overrides_and_restores(monkeypatch):
    import dataclasses

    from ssog.ops import BACKENDS

    calls = []
    original = BACKENDS["separable"]
    monkeypatch.setitem(BACKENDS, "separable", dataclasses.replace(
        original, fixed=lambda *a, **k: calls.append(1) or original.fixed(*a, **k)))
    mu, sigma, weight = fixed_params(1, 2, dtype=torch.float32)
    v = values(1, 1, 4, 2, dtype=torch.float32)
    with forced_backend("separable"):
        ssog_mix(v, mu, sigma, weight, (2, 2), backend="dense")
    assert calls == [1]
    ssog_mix(v, mu, sigma, weight, (2, 2), backend="dense")
    assert calls == [1]


def test_a_compiled_graph_does_not_read_the_forced_backend():
    # dynamo of torch 2.11 cannot trace the ContextVar read: fullgraph compilation would fail
    from ssog.ops.functional import forced_backend_name

    compiled = torch.compile(lambda x: x + (0 if forced_backend_name() is None else 1), fullgraph=True,
                             backend="eager")
    with forced_backend("dense"):
        assert compiled(torch.zeros(1)).item() == 0 and forced_backend_name() == "dense"


def test_runs_on_meta_device():
    mu, sigma, weight = (t.to("meta") for t in fixed_params(2, 4, dtype=torch.float32))
    v = torch.empty(2, 2, 64, 8, device="meta")
    for backend in ("dense", "separable"):
        assert ssog_mix(v, mu, sigma, weight, (8, 8), backend=backend).shape == (2, 2, 64, 8)


# ---------------------------------------------------------------------------- bad input
BAD_INPUTS = [
    ("grid", dict(grid=(4, 4)), "grid_size"),
    ("grid_zero", dict(grid=(0, 20)), "positive"),
    ("grid_type", dict(grid=5), "pair"),
    ("v_rank", dict(v=torch.randn(2, 20, 3)), "(B, H, N, d)"),
    ("v_int", dict(v=torch.ones(1, 2, 20, 3, dtype=torch.long)), "floating-point"),
    ("mu_rank", dict(mu=torch.zeros(2, 3)), "mu must be"),
    ("mu_last", dict(mu=torch.zeros(2, 3, 3)), "(y, x)"),
    ("heads", dict(mu=torch.zeros(5, 3, 2), sigma=torch.ones(5, 3, 2), weight=torch.ones(5, 3)), "heads"),
    ("sigma_shape", dict(sigma=torch.ones(2, 4, 2)), "sigma must have the shape"),
    ("weight_shape", dict(weight=torch.ones(2, 4)), "weight must have shape"),
    ("sigma_zero", dict(sigma=torch.zeros(2, 3, 2)), "sigma must be > 0"),
    ("sigma_negative", dict(sigma=-torch.ones(2, 3, 2)), "sigma must be > 0"),
    ("backend", dict(backend="flash"), "unknown backend"),
    ("tolerance", dict(local_tolerance=0.0), "local_tolerance"),
    ("steered_batch", dict(
        mu=torch.zeros(3, 2, 20, 3, 2), sigma=torch.ones(3, 2, 20, 3, 2), weight=torch.ones(3, 2, 20, 3)), "(B, H)"),
    # values that shapes cannot catch: NaN passes `sigma > 0`, and a huge centre squares to inf
    ("sigma_nan", dict(sigma=torch.ones(2, 3, 2).index_fill(0, torch.tensor([1]), float("nan"))),
     "sigma must be finite everywhere, got nan at index (1, 0, 0)"),
    ("mu_inf", dict(mu=torch.full((2, 3, 2), float("-inf"))), "mu must be finite everywhere"),
    ("weight_nan", dict(weight=torch.full((2, 3), float("nan"))), "weight must be finite everywhere"),
    ("mu_huge", dict(mu=torch.full((2, 3, 2), 1e30)), "|mu| must be <= 2^20 tokens"),
    ("sigma_tiny", dict(mu=torch.full((2, 3, 2), 1e3), sigma=torch.full((2, 3, 2), 1e-36)),
     "sigma is too small for its centre"),
    ("steered_local", dict(mu=torch.zeros(1, 2, 20, 3, 2), sigma=torch.ones(1, 2, 20, 3, 2),
                           weight=torch.ones(1, 2, 20, 3), backend="dense", local_tolerance=1.5), "local_tolerance"),
]


@pytest.mark.parametrize("name,override,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_clear_value_error(name, override, message):
    args = dict(
        v=torch.randn(1, 2, 20, 3), mu=torch.zeros(2, 3, 2), sigma=torch.ones(2, 3, 2),
        weight=torch.ones(2, 3) / 3, grid=(4, 5), backend="auto", local_tolerance=1e-6,
    )
    args.update(override)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ssog_mix(args["v"], args["mu"], args["sigma"], args["weight"], args["grid"],
                 backend=args["backend"], local_tolerance=args["local_tolerance"])


@pytest.mark.parametrize("name,override,message", BAD_INPUTS[-6:-1], ids=[b[0] for b in BAD_INPUTS[-6:-1]])
def test_matrix_refuses_non_finite_and_out_of_range_parameters(name, override, message):
    args = dict(mu=torch.zeros(2, 3, 2), sigma=torch.ones(2, 3, 2), weight=torch.ones(2, 3) / 3)
    args.update(override)
    with pytest.raises(ValueError, match=re.escape(message)):
        ssog_matrix(args["mu"], args["sigma"], args["weight"], (4, 5))


@pytest.mark.parametrize("name,override,message", BAD_INPUTS[-6:-1], ids=[b[0] for b in BAD_INPUTS[-6:-1]])
def test_value_checks_agree_on_torch_tensors_and_numpy_arrays(name, override, message):
    """CPU parameters are checked as NumPy arrays, others (CUDA, torch.func, compile) as
    tensors: the one expression must refuse the same values either way."""
    args = dict(mu=torch.zeros(2, 3, 2), sigma=torch.ones(2, 3, 2), weight=torch.ones(2, 3) / 3)
    largest = torch.finfo(torch.float32).max
    for values, verdict in ((args, True), ({**args, **override}, False)):
        tensors = [values[k] for k in ("mu", "sigma", "weight")]
        assert _in_range(*tensors, torch.tensor([4.0, 5.0]), largest) is verdict
        assert _in_range(*(t.numpy() for t in tensors), np.array([4.0, 5.0], np.float32), largest) is verdict


def test_value_checks_see_in_place_changes_of_parameters_checked_before():
    """Parameters are checked at every call: a change that bumps no version counter (through
    ``.data``) must still be refused."""
    v, mu, sigma, weight = torch.randn(1, 2, 20, 8), torch.zeros(2, 3, 2), torch.ones(2, 3, 2), torch.ones(2, 3) / 3
    for _ in range(2):
        ssog_mix(v, mu, sigma, weight, (4, 5))
    sigma.data[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=re.escape("sigma must be finite everywhere, got nan at index (1, 0, 0)")):
        ssog_mix(v, mu, sigma, weight, (4, 5))
    sigma.data[1, 0, 0] = -1.0
    with pytest.raises(ValueError, match="sigma must be > 0"):
        ssog_matrix(mu, sigma, weight, (4, 5))
    sigma.data[1, 0, 0] = 1.0
    assert torch.allclose(ssog_mix(v, mu, sigma, weight, (4, 5)), ssog_mix(v, mu, sigma.clone(), weight, (4, 5)))


def test_the_largest_accepted_centre_gives_finite_kernels():
    mu = torch.tensor([[[2.0**20, -(2.0**20)]]])
    a = ssog_matrix(mu, torch.full((1, 1, 2), 0.25), torch.ones(1, 1), (4, 5))
    assert torch.isfinite(a).all() and torch.allclose(a.sum(-1), torch.ones(1, 20))
    assert torch.equal(a[0, :, 3 * 5], torch.ones(20))  # all mass on the bottom-left key


@pytest.mark.parametrize("backend", ["dense", "separable", "local", "cpp", "fused"])
@pytest.mark.parametrize("steered", [False, True])
def test_far_centres_give_the_exact_finite_kernel_on_every_backend(backend, steered):
    from ssog.ops import cpp_kernels

    if backend == "cpp" and not cpp_kernels.available():
        pytest.skip(cpp_kernels.unavailable_reason())
    if backend == "fused" and steered:
        pytest.skip("the fused ops take fixed kernels only")
    v = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(0))
    for centre, width in ((1e6, 10.0), (1e6, 1e3), (2.0**20, 1e5)):
        shape = (1, 2, 16, 1) if steered else (2, 1)
        mu, sigma, weight = torch.full((*shape, 2), centre), torch.full((*shape, 2), width), torch.ones(shape)
        out = ssog_mix(v, mu, sigma, weight, (4, 4), backend=backend)
        assert torch.isfinite(out).all(), (centre, width)
        # in float64 the difference of squares holds: the float32 kernel must match it
        expected = ssog_mix(v.double(), mu.double(), sigma.double(), weight.double(), (4, 4), backend="dense")
        assert torch.allclose(out.double(), expected, atol=1e-4), (centre, width)


def test_a_mixture_of_no_atoms_is_one_line():
    v = torch.randn(1, 2, 16, 4)
    with pytest.raises(ValueError, match=r"at least 1 atom \(R, the second-to-last axis of mu\), got mu of shape "
                                         r"\(2, 0, 2\)"):
        ssog_mix(v, torch.zeros(2, 0, 2), torch.ones(2, 0, 2), torch.ones(2, 0), (4, 4))
    with pytest.raises(ValueError, match="at least 1 atom"):
        ssog_mix(v, torch.zeros(1, 2, 16, 0, 2), torch.ones(1, 2, 16, 0, 2), torch.ones(1, 2, 16, 0), (4, 4))

