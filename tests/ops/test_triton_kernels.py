"""The Triton kernels of the registered ops (``ssog.ops.triton_kernels``) against the float64
definition, on the CPU.

Triton's interpreter (``TRITON_INTERPRET=1``) runs the kernels on CPU tensors, and under it the
registered ops take them there as on CUDA; it must be set before Triton is imported, so the
checks run in a fresh interpreter. Skipped without Triton.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

pytest.importorskip("triton")

CHECKS = r"""
import torch
from ssog.ops import fused, ssog_matrix, ssog_mix, triton_kernels
from ssog.layers import SSoGAttention

def params(heads, atoms, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mu = 2.0 * torch.randn(heads, atoms, 2, generator=g)
    sigma = 0.3 + 3.0 * torch.rand(heads, atoms, 2, generator=g)
    weight = torch.randn(heads, atoms, generator=g).softmax(-1)
    return mu.to(dtype), sigma.to(dtype), weight.to(dtype)

def definition(v, mu, sigma, weight, grid, prefix):
    # the mixer's whole matrix in float64: A on the patches, prefix rows the patch mean
    patches = v[:, prefix:].double()
    mixed = torch.einsum("hqj,bjhd->bqhd", ssog_matrix(mu.double(), sigma.double(), weight.double(), grid), patches)
    return torch.cat([patches.mean(dim=1, keepdim=True).expand(-1, prefix, -1, -1), mixed], dim=1)

def relative(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()

# Units of each dtype's rounding the results may be off by (fp32: 1e-5 relative, the issue's bound).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4 * 2.0**-11, torch.bfloat16: 4 * 2.0**-8}

for grid, prefix, heads, atoms, dim in [((5, 7), 1, 2, 3, 20), ((14, 14), 0, 2, 4, 16), ((17, 17), 1, 1, 2, 8),
                                        ((33, 33), 1, 1, 2, 16)]:
    n = grid[0] * grid[1]
    mu, sigma, weight = params(heads, atoms, n)
    base = torch.randn(2, prefix + n, heads, dim, generator=torch.Generator().manual_seed(1))
    probe = torch.randn(2, prefix + n, heads, dim, generator=torch.Generator().manual_seed(2))
    for dtype, tolerance in TOLERANCE.items():
        # float64 values and gradients of the definition (autograd), from the same inputs: the
        # values and the output's gradient as rounded to dtype
        leaves64 = [base.to(dtype).double().requires_grad_(),
                    *(t.double().requires_grad_() for t in (mu, sigma, weight))]
        want = definition(leaves64[0], *leaves64[1:], grid, prefix)
        (want * probe.to(dtype).double()).sum().backward()
        want_grads = [t.grad for t in leaves64]
        leaves = [base.to(dtype, copy=True).requires_grad_(),
                  *(t.clone().requires_grad_() for t in (mu, sigma, weight))]
        ky, kx, valid = fused.fixed_tables(*leaves[1:], *grid)
        assert bool(valid)
        out = fused.fixed_mix(leaves[0].flatten(2), ky, kx, prefix).view_as(base)
        assert out.dtype == dtype and out.is_contiguous()
        error = relative(out, want.detach())
        assert error < tolerance, (grid, dtype, "values", error)
        (out * probe.to(dtype)).sum().backward()
        for name, leaf, expected in zip(("v", "mu", "sigma", "weight"), leaves, want_grads):
            assert leaf.grad is not None, (grid, dtype, name)
            error = relative(leaf.grad, expected)
            assert error < tolerance, (grid, dtype, name, error)

# The layer's parameterisation in the tables' kernels: sigma = sigma_min + softplus(rho), weight = softmax(logits).
for grid in ((5, 7), (14, 14)):
    layer = SSoGAttention(48, 3, num_atoms=4).double()
    leaves64 = [p.detach().requires_grad_() for p in (layer.mu, layer.rho, layer.logits)]
    tables64 = fused.layer_tables(*leaves64, layer.sigma_min, *grid)
    generator = torch.Generator().manual_seed(8)
    probes = [torch.randn(t.shape, dtype=torch.float64, generator=generator) for t in tables64[:2]]
    sum((t * g).sum() for t, g in zip(tables64[:2], probes)).backward()
    leaves = [t.detach().float().requires_grad_() for t in leaves64]
    tables = fused.layer_tables(*leaves, layer.sigma_min, *grid)
    assert bool(tables[2])
    for got, want in zip(tables[:2], tables64[:2]):
        assert relative(got, want.detach()) < 1e-5, grid
    sum((t * g.float()).sum() for t, g in zip(tables[:2], probes)).backward()
    for name, leaf, want in zip(("mu", "rho", "logits"), leaves, leaves64):
        assert relative(leaf.grad, want.grad) < 1e-5, (grid, name)

# The public op and the layer take the same kernels, in (B, H, N, d) and (B, T, D) layouts.
grid, n = (5, 7), 35
mu, sigma, weight = params(2, 3, 5)
v = torch.randn(2, 2, n, 16)
expected = ssog_matrix(mu, sigma, weight, grid) @ v
for backend in ("auto", "fused", "triton"):
    assert relative(ssog_mix(v, mu, sigma, weight, grid, backend=backend), expected.double()) < 1e-5, backend
layer = SSoGAttention(32, 2, num_prefix_tokens=1)
x = torch.randn(2, 1 + n, 32)
reference = SSoGAttention(32, 2, num_prefix_tokens=1, backend="dense")
reference.load_state_dict(layer.state_dict())
torch.testing.assert_close(layer(x, grid), reference(x, grid), rtol=1e-5, atol=1e-5)

# an atom of weight exactly 0 (the others renormalised; one atom: the head weighs nothing) or negative
for atoms in (1, 4):
    for first in (0.0, -0.5):
        mu, sigma, weight = params(2, atoms, 5)
        weight[..., 0] = first
        if first == 0 and atoms > 1:
            weight = weight / weight.sum(-1, keepdim=True)
        v = torch.randn(2, 2, n, 16, generator=torch.Generator().manual_seed(4))
        expected = ssog_matrix(mu, sigma, weight, grid) @ v
        out = ssog_mix(v, mu, sigma, weight, grid, backend="triton")
        assert out.isfinite().all() and (out - expected).abs().max() < 1e-5 * v.abs().max(), (atoms, first)

# The tables' flag is the value checks of ssog.ops.checks, computed in the launch (no host sync).
mu, sigma, weight = params(2, 3, 6)
for name, bad in (("sigma", (sigma, 0, 0.0)), ("mu", (mu, 1, float("nan"))), ("mu", (mu, 0, 2.0**21)),
                  ("weight", (weight, (1, 2), float("inf"))), ("sigma", (sigma, 0, 1e-30))):
    tensors = {"mu": mu.clone(), "sigma": sigma.clone(), "weight": weight.clone()}
    target, index, value = bad
    tensors[name][(index,) if isinstance(index, int) else index] = value
    assert not bool(fused.fixed_tables(tensors["mu"], tensors["sigma"], tensors["weight"], 5, 7)[2]), (name, value)
assert bool(fused.fixed_tables(mu, sigma, weight, 5, 7)[2])

# Each op launches the kernels CUDA_LAUNCHES says (what ssog.bench.dispatch counts per op).
launched = []
for kernel in ("_tables_kernel", "_mix_kernel", "_table_gradient_kernel", "_tables_backward_kernel"):
    original = getattr(triton_kernels, kernel)
    class Counted:
        def __init__(self, original):
            self.original = original
        def __getitem__(self, grid):
            launched.append(grid)
            return self.original[grid]
    setattr(triton_kernels, kernel, Counted(original))
mu, sigma, weight = params(2, 3, 7)
ky, kx, _ = fused.fixed_tables(mu, sigma, weight, 4, 5)
v = torch.randn(2, 21, 32)
for name, call in (("fixed_tables", lambda: fused.fixed_tables(mu, sigma, weight, 4, 5)),
                   ("layer_tables", lambda: fused.layer_tables(mu, sigma, weight, 0.25, 4, 5)),
                   ("layer_tables_backward", lambda: fused.layer_tables_backward(ky, kx, mu, sigma, weight, 0.25)),
                   ("fixed_mix", lambda: fused.fixed_mix(v, ky, kx, 1)),
                   ("fixed_mix_transposed", lambda: fused.fixed_mix_transposed(v, ky, kx, 1)),
                   ("fixed_mix_table_grads", lambda: fused.fixed_mix_table_grads(v, v, ky, kx, 1)),
                   ("fixed_tables_backward", lambda: fused.fixed_tables_backward(ky, kx, mu, sigma, weight))):
    launched.clear()
    call()
    assert len(launched) == fused.CUDA_LAUNCHES[name], (name, launched)

# steered kernels are not these kernels' job
steered = torch.zeros(1, 2, 20, 3, 2)
try:
    ssog_mix(torch.zeros(1, 2, 20, 4), steered, steered + 1, torch.ones(1, 2, 20, 3) / 3, (4, 5), backend="triton")
except ValueError as error:
    assert "fixed kernels only" in str(error)
else:
    raise AssertionError("steered kernels accepted by the triton backend")
print("ok")
"""


@pytest.mark.slow
def test_triton_kernels_match_the_float64_definition_in_interpreter(run_child):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = run_child([sys.executable, "-c", CHECKS], 600, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_triton_backend_refuses_cpu_without_interpreter(monkeypatch):
    from ssog.ops import ssog_mix

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mu, sigma, weight = torch.zeros(1, 1, 2), torch.ones(1, 1, 2), torch.ones(1, 1)
    with pytest.raises(RuntimeError, match="needs Triton and a CUDA device"):
        ssog_mix(torch.zeros(1, 1, 4, 2), mu, sigma, weight, (2, 2), backend="triton")
