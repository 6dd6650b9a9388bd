"""The cpp backend (fused CPU kernels, forward only) against the dense definition, its
dispatch, its refusals and its fallback when it cannot be built."""
from __future__ import annotations

import re

import pytest
import torch

from ssog.ops import cpp_kernels, ssog_matrix, ssog_mix
from ssog.ops.checks import _in_range
from ssog.ops.functional import mix_unchecked

pytestmark = pytest.mark.skipif(not cpp_kernels.available(), reason=f"cpp backend: {cpp_kernels.unavailable_reason()}")

LANES = cpp_kernels._library()[0].ssog_lanes() if cpp_kernels.available() else 16


def params(batch: int | None, heads: int, n: int, atoms: int, seed: int, width: tuple[float, float] = (0.3, 3.0)):
    """Fixed (``batch=None``) or steered mixture parameters in float64."""
    g = torch.Generator().manual_seed(seed)
    lead = (heads, atoms) if batch is None else (batch, heads, n, atoms)
    mu = 3.0 * torch.randn(*lead, 2, generator=g, dtype=torch.float64)
    sigma = width[0] + (width[1] - width[0]) * torch.rand(*lead, 2, generator=g, dtype=torch.float64)
    weight = torch.randn(*lead, generator=g, dtype=torch.float64).softmax(-1)
    return mu, sigma, weight


def check_against_definition(batch, heads, grid, dim, atoms, steered, seed=0, width=(0.3, 3.0), first_weight=None):
    """``first_weight``: the first atom's mixture weight instead of the softmax's (0: the others
    renormalised, and with one atom the head weighs nothing; negative: a signed mixture)."""
    n = grid[0] * grid[1]
    mu, sigma, weight = params(batch if steered else None, heads, n, atoms, seed, width)
    if first_weight is not None:
        weight[..., 0] = first_weight
        if first_weight == 0 and atoms > 1:
            weight = weight / weight.sum(-1, keepdim=True)
    v = torch.randn(batch, heads, n, dim, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    out = ssog_mix(v.float(), mu.float(), sigma.float(), weight.float(), grid, backend="cpp")
    assert out.dtype == torch.float32 and out.shape == v.shape
    # float32 kernels and sums: a few units of float32's precision of the output's scale
    assert (out.double() - expected).abs().max() <= 2e-6 * v.abs().max()


@pytest.mark.parametrize("grid", [(5, 7), (14, 14), (1, 9), (9, 1), (17, 3)])
@pytest.mark.parametrize("atoms", [1, 4, 6])
@pytest.mark.parametrize("steered", [False, True], ids=["fixed", "steered"])
def test_cpp_matches_dense_definition(grid, atoms, steered):
    check_against_definition(2, 3, grid, 4 * LANES, atoms, steered, seed=atoms)


@pytest.mark.parametrize("vectors", [1, 2, 3, 6, 8])
@pytest.mark.parametrize("steered", [False, True], ids=["fixed", "steered"])
def test_cpp_takes_every_supported_head_dimension(vectors, steered):
    check_against_definition(1, 2, (6, 5), vectors * LANES, 3, steered)


@pytest.mark.parametrize("first_weight", [0.0, -0.5], ids=["zero", "negative"])
@pytest.mark.parametrize("atoms", [1, 4])
@pytest.mark.parametrize("steered", [False, True], ids=["fixed", "steered"])
def test_cpp_takes_zero_and_negative_weights(first_weight, atoms, steered):
    check_against_definition(2, 3, (5, 7), LANES, atoms, steered, first_weight=first_weight)


@pytest.mark.parametrize("steered", [False, True], ids=["fixed", "steered"])
def test_cpp_skips_only_negligible_keys(steered):
    """Narrow kernels on a wide grid: most keys are at the floor and skipped, exactly."""
    check_against_definition(2, 2, (24, 20), LANES, 3, steered, width=(0.2, 0.8))
    # and kernels wider than the grid, centres far outside it
    check_against_definition(1, 2, (7, 6), LANES, 2, steered, width=(20.0, 200.0))


def test_cpp_propagates_non_finite_parameters():
    grid, n = (4, 4), 16
    mu, sigma, weight = (t.float() for t in params(1, 1, n, 2, seed=3))
    mu[0, 0, 5, 1, 0] = float("nan")  # the layers call the operator unchecked
    out = mix_unchecked(torch.randn(1, 1, n, LANES), mu, sigma, weight, grid, "cpp")
    assert out[0, 0, 5].isnan().all()
    assert out[0, 0, :5].isfinite().all() and out[0, 0, 6:].isfinite().all()


# Parameter values the checks refuse, and the error that names them (tests/ops/test_ops.py's BAD_INPUTS).
OUT_OF_RANGE = [
    ("sigma_zero", "sigma", (0, 1, 0), 0.0, "sigma must be > 0"),
    ("sigma_negative", "sigma", (1, 0, 1), -1.0, "sigma must be > 0"),
    ("sigma_nan", "sigma", (1, 0, 0), float("nan"), "sigma must be finite everywhere, got nan at index"),
    ("sigma_inf", "sigma", (0, 2, 1), float("inf"), "sigma must be finite everywhere"),
    ("mu_inf", "mu", (0, 0, 1), float("-inf"), "mu must be finite everywhere"),
    ("mu_huge", "mu", (1, 2, 0), 2.0**20 * 1.01, "|mu| must be <= 2^20 tokens"),
    ("weight_nan", "weight", (1, 1), float("nan"), "weight must be finite everywhere"),
    ("sigma_tiny", "sigma", (0, 1, 1), 1e-19, "sigma is too small for its centre"),
]


@pytest.mark.parametrize("steered", [False, True], ids=["fixed", "steered"])
@pytest.mark.parametrize("name,field,index,value,message", OUT_OF_RANGE, ids=[c[0] for c in OUT_OF_RANGE])
def test_ssog_mix_refuses_out_of_range_parameters_in_the_library(name, field, index, value, message, steered):
    """``ssog_mix`` leaves the value checks to the library when it takes the ``cpp`` kernels;
    the error must be the Python check's, and nothing may be written."""
    grid, n = (4, 5), 20
    parameters = dict(zip(("mu", "sigma", "weight"), (t.float() for t in params(2 if steered else None, 2, n, 3, 0))))
    head, *rest = index  # (head, atom[, component]); steered: batch 0, query 0
    parameters[field][(0, head, 0, *rest) if steered else index] = value
    v, destination = torch.randn(2, 2, n, LANES), torch.full((2, 2, n, LANES), 7.0)
    for backend in ("cpp", "auto"):
        with pytest.raises(ValueError, match=re.escape(message)):
            ssog_mix(v, *parameters.values(), grid, backend=backend)
    with pytest.raises(ValueError, match=re.escape(message)):
        cpp_kernels.cpp_steered(v, *parameters.values(), grid, out=destination) if steered else \
            cpp_kernels.cpp_fixed(v, *parameters.values(), grid, out=destination)
    assert (destination == 7.0).all()


def test_library_and_python_checks_agree_at_the_edges():
    """The library's float32 check (parameters_in_range) against checks._in_range, one
    atom at a time, on values at and around every bound."""
    grid = (6, 5)
    largest = torch.finfo(torch.float32).max
    reach_limit = torch.tensor(largest).sqrt().item()  # sigma below (6 + |mu|) / reach_limit overflows
    sigmas = [0.0, -0.0, 1e-45, 6 / reach_limit * 0.999, 6 / reach_limit * 1.001, 0.25, 3e38, float("inf"),
              float("nan"), -2.0]
    centres = [0.0, -3.5, 2.0**20, -(2.0**20), 2.0**20 * (1 + 2**-23), 1e30, float("-inf"), float("nan")]
    weights = [0.5, largest, float("inf"), float("nan"), -1e38]
    cases = [(m, s, 0.5) for m in centres for s in sigmas] + [(0.0, 1.0, w) for w in weights]
    v = torch.randn(1, 1, 30, LANES)
    for centre, width, w in cases:
        mu = torch.tensor([[[centre, 0.0]]])
        sigma = torch.tensor([[[width, 1.0]]])
        weight = torch.tensor([[w]])
        expected = _in_range(mu, sigma, weight, torch.tensor(grid, dtype=torch.float32), largest)
        try:
            cpp_kernels.cpp_fixed(v, mu, sigma, weight, grid)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted is expected, (centre, width, w)


def test_float64_parameters_out_of_float32_range_are_refused():
    """Valid in float64 but not once cast to the kernels' float32: a clear error, not NaN."""
    mu, sigma, weight = params(None, 1, 20, 2, seed=2)
    sigma[0, 1, 0] = 1e-60  # 0 in float32
    with pytest.raises(ValueError, match=r"out of float32's range for the cpp kernels \(they pass the check in "
                                         r"torch.float64\)"):
        ssog_mix(torch.randn(1, 1, 20, LANES), mu, sigma, weight, (4, 5), backend="cpp")


def test_auto_takes_cpp_without_gradients_only(monkeypatch):
    taken = []
    for name in ("cpp_fixed", "cpp_steered"):
        original = getattr(cpp_kernels, name)
        monkeypatch.setattr(cpp_kernels, name, lambda *a, _f=original, _n=name, **k: taken.append(_n) or _f(*a, **k))
    grid, n = (6, 6), 36
    v = torch.randn(2, 2, n, LANES)
    fixed = [t.float() for t in params(None, 2, n, 3, seed=0)]
    steered = [t.float() for t in params(2, 2, n, 3, seed=0)]
    with torch.inference_mode():
        ssog_mix(v, *fixed, grid)
        ssog_mix(v, *steered, grid)
    assert taken == ["cpp_fixed", "cpp_steered"]
    for parameters in (fixed, steered):  # training: the differentiable backends
        trained = [t.clone().requires_grad_() for t in parameters]
        ssog_mix(v, *trained, grid).sum().backward()
        assert all(t.grad is not None for t in trained)
    ssog_mix(v.double(), *(t.double() for t in fixed), grid)  # float64: not the cpp kernels
    ssog_mix(torch.randn(2, 2, n, LANES + 1), *fixed, grid)  # head dimension it does not take
    assert taken == ["cpp_fixed", "cpp_steered"]


@pytest.mark.parametrize(
    "v,requires_grad,message",
    [
        (torch.randn(1, 2, 16, 16), True, "forward only"),
        (torch.randn(1, 2, 16, 16, dtype=torch.float64), False, "float32 CPU values"),
        (torch.randn(1, 2, 16, 20), False, "head dimension 20"),
    ],
    ids=["gradients", "float64", "head_dim"],
)
def test_cpp_refuses_what_it_cannot_compute(v, requires_grad, message):
    mu, sigma, weight = (t.to(v.dtype) for t in params(None, 2, 16, 2, seed=0))
    with pytest.raises(RuntimeError, match=message):
        ssog_mix(v.requires_grad_(requires_grad), mu, sigma, weight, (4, 4), backend="cpp")


@pytest.fixture
def fresh_library(monkeypatch, tmp_path):
    """The library's loader with an empty cache; restored (and reloaded) afterwards."""
    monkeypatch.setenv("SSOG_CACHE_DIR", str(tmp_path))
    for cached in (cpp_kernels._library, cpp_kernels.head_dims):
        cached.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    for cached in (cpp_kernels._library, cpp_kernels.head_dims):
        cached.cache_clear()


def test_without_a_compiler_auto_falls_back(fresh_library, monkeypatch):
    monkeypatch.setenv("CXX", str(fresh_library / "no-such-compiler"))
    assert not cpp_kernels.available()
    assert "no-such-compiler" in cpp_kernels.unavailable_reason()
    mu, sigma, weight = (t.float() for t in params(None, 2, 16, 2, seed=0))
    v = torch.randn(1, 2, 16, 16)
    expected = ssog_matrix(mu, sigma, weight, (4, 4)) @ v
    with torch.inference_mode():
        torch.testing.assert_close(ssog_mix(v, mu, sigma, weight, (4, 4)), expected)
    with pytest.raises(RuntimeError, match="cannot run here: .*no-such-compiler"):
        ssog_mix(v, mu, sigma, weight, (4, 4), backend="cpp")


def test_disabled_by_environment(fresh_library, monkeypatch):
    monkeypatch.setenv("SSOG_CPP", "0")
    assert not cpp_kernels.available()
    assert cpp_kernels.unavailable_reason() == "disabled by SSOG_CPP=0"


@pytest.mark.slow
def test_build_is_cached_and_leaves_no_partial_files(fresh_library):
    assert cpp_kernels.available()
    built = sorted(p.name for p in fresh_library.iterdir())
    assert len(built) == 1 and built[0].startswith("ssog_cpu-") and built[0].endswith(".so")
    stamp = (fresh_library / built[0]).stat().st_mtime_ns
    cpp_kernels._library.cache_clear()  # a new process, as far as the loader is concerned
    assert cpp_kernels.available()
    assert (fresh_library / built[0]).stat().st_mtime_ns == stamp  # loaded, not rebuilt


@pytest.mark.parametrize("steered", [False, True], ids=["fixed", "steered"])
def test_cpp_reads_and_writes_views_of_token_major_tensors(steered):
    """The layers pass (B, H, N, d) views of (B, P + N, H, d) tensors, read and written in place."""
    batch, heads, grid, prefix, dim = 2, 3, (5, 4), 1, LANES
    n = grid[0] * grid[1]
    mu, sigma, weight = (t.float() for t in params(batch if steered else None, heads, n, 3, seed=4))
    projection = torch.randn(batch, prefix + n, heads, dim)
    destination = torch.full_like(projection, float("nan"))
    v, out = (t[:, prefix:].transpose(1, 2) for t in (projection, destination))
    assert mix_unchecked(v, mu, sigma, weight, grid, "cpp", out=out) is out
    expected = ssog_matrix(mu, sigma, weight, grid) @ v.contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert destination[:, :prefix].isnan().all()  # nothing written outside the view


@pytest.mark.parametrize("steer", [(), ("mu", "sigma", "lambda")], ids=["fixed", "steered"])
def test_layer_without_gradients_matches_its_training_path(steer):
    from ssog.layers import SSoGAttention

    layer = SSoGAttention(4 * LANES, 4, 3, steer=steer, steer_gate_init=0.0).eval()
    x = torch.randn(2, 1 + 36, 4 * LANES)
    expected = layer(x, (6, 6))  # autograd records: the PyTorch backends
    assert expected.grad_fn is not None
    for no_gradients in (torch.no_grad, torch.inference_mode):
        with no_gradients():
            torch.testing.assert_close(layer(x, (6, 6)), expected, rtol=1e-5, atol=1e-5)


def test_cached_fixed_kernels_follow_changed_parameters():
    """The library keeps the kernels of recent parameters; changed ones (even in place, at the
    same address) must never meet stale kernels."""
    grid, n = (6, 5), 30
    mu, sigma, weight = (t.float() for t in params(None, 2, n, 3, seed=6))
    v = torch.randn(2, 2, n, LANES)
    for _ in range(3):
        out = ssog_mix(v, mu, sigma, weight, grid, backend="cpp")
        torch.testing.assert_close(out, ssog_matrix(mu, sigma, weight, grid) @ v, rtol=1e-5, atol=1e-5)
        mu.add_(0.25)  # an optimizer step, in place
        sigma[0, 0, 1] *= 1.5


@pytest.mark.parametrize("steered", [False, True], ids=["fixed", "steered"])
def test_cpp_on_several_threads_matches_one(steered):
    """The tests run torch on one thread, where the library runs its loops serially; this one
    runs them on OpenMP threads too (work handed out in small pieces)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        check_against_definition(2, 3, (9, 7), LANES, 3, steered, seed=11)
    finally:
        torch.set_num_threads(threads)
