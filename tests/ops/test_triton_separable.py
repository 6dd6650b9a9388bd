"""The fused Triton kernel (backend ``triton``) against the dense definition, on the CPU.

Triton's interpreter (``TRITON_INTERPRET=1``) runs the kernel on CPU tensors; it must be set
before Triton is imported, so the checks run in a fresh interpreter. Skipped without Triton.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

pytest.importorskip("triton")

CHECKS = r"""
import torch
from ssog.ops import ssog_matrix, ssog_mix

def params(heads, atoms, seed):
    g = torch.Generator().manual_seed(seed)
    mu = 2.0 * torch.randn(heads, atoms, 2, generator=g)
    sigma = 0.3 + 3.0 * torch.rand(heads, atoms, 2, generator=g)
    weight = torch.randn(heads, atoms, generator=g).softmax(-1)
    return mu, sigma, weight

# grids narrower and wider than one 16-column block; head_dim not a multiple of the d block
for grid, heads, atoms, dim in [((5, 7), 2, 3, 20), ((3, 17), 1, 1, 16), ((4, 4), 3, 4, 8)]:
    n = grid[0] * grid[1]
    mu, sigma, weight = params(heads, atoms, n)
    v = torch.randn(2, heads, n, dim, generator=torch.Generator().manual_seed(1))
    expected = ssog_matrix(mu, sigma, weight, grid) @ v
    out = ssog_mix(v, mu, sigma, weight, grid, backend="triton")
    assert out.dtype == torch.float32 and out.shape == v.shape
    error = ((out - expected).abs().max() / expected.abs().max()).item()
    assert error < 1e-5, (grid, error)
    for dtype, unit in ((torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)):
        half = ssog_mix(v.to(dtype), mu, sigma, weight, grid, backend="triton")
        assert half.dtype == dtype
        error = ((half.float() - expected).abs().max() / expected.abs().max()).item()
        assert error < 4 * unit, (grid, dtype, error)

# an atom of weight exactly 0 (the others renormalised; one atom: the head weighs nothing) or negative
for atoms in (1, 4):
    for first in (0.0, -0.5):
        grid, n = (5, 7), 35
        mu, sigma, weight = params(2, atoms, 5)
        weight[..., 0] = first
        if first == 0 and atoms > 1:
            weight = weight / weight.sum(-1, keepdim=True)
        v = torch.randn(2, 2, n, 16, generator=torch.Generator().manual_seed(4))
        expected = ssog_matrix(mu, sigma, weight, grid) @ v
        out = ssog_mix(v, mu, sigma, weight, grid, backend="triton")
        assert out.isfinite().all() and (out - expected).abs().max() < 1e-5 * v.abs().max(), (atoms, first)

# gradients of values and of every kernel parameter match the dense path's
grid = (4, 5)
leaves = [t.requires_grad_() for t in (torch.randn(2, 2, 20, 16, generator=torch.Generator().manual_seed(2)),
                                       *params(2, 3, 7))]
probe = torch.randn(2, 2, 20, 16, generator=torch.Generator().manual_seed(3))
(ssog_matrix(*leaves[1:], grid) @ leaves[0]).mul(probe).sum().backward()
expected = [t.grad.clone() for t in leaves]
for t in leaves:
    t.grad = None
ssog_mix(*leaves, grid, backend="triton").mul(probe).sum().backward()
for name, leaf, want in zip(("v", "mu", "sigma", "weight"), leaves, expected):
    torch.testing.assert_close(leaf.grad, want, rtol=1e-4, atol=1e-5, msg=name)

# steered kernels are not this kernel's job
steered = torch.zeros(1, 2, 20, 3, 2)
try:
    ssog_mix(torch.zeros(1, 2, 20, 4), steered, steered + 1, torch.ones(1, 2, 20, 3) / 3, grid, backend="triton")
except ValueError as error:
    assert "fixed kernels only" in str(error)
else:
    raise AssertionError("steered kernels accepted by the triton backend")
print("ok")
"""


def test_triton_kernel_matches_dense_definition_in_interpreter(run_child):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    done = run_child([sys.executable, "-c", CHECKS], 600, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_triton_backend_refuses_cpu_without_interpreter(monkeypatch):
    from ssog.ops import ssog_mix

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mu, sigma, weight = torch.zeros(1, 1, 2), torch.ones(1, 1, 2), torch.ones(1, 1)
    with pytest.raises(RuntimeError, match="needs Triton and a CUDA device"):
        ssog_mix(torch.zeros(1, 1, 4, 2), mu, sigma, weight, (2, 2), backend="triton")
