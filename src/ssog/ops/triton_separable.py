"""Fixed separable mixing as one fused Triton kernel (the ``triton`` backend, CUDA only).

One program computes one output row ``y'`` of one (batch, head) item for a block of the
head dimension: it contracts y for every atom at once (``m_r[x] = sum_y ky_r[y', y] v[y, x]``,
kept in registers, never in memory) and then x with one matrix product
``out[x'] = sum_(r, x) kx[x', (r, x)] m[(r, x)]``. The ``R``-fold intermediate of the
``separable`` backend never reaches memory, so the workspace is the output alone.

Backward: ``A^T`` is the same operator with every 1-D kernel transposed, so the values'
gradient is this kernel again; the kernels' gradients (for ``mu``, ``sigma`` and the
weights) are two separable contractions in PyTorch.

Without a GPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``, set
before Triton is imported) on CPU tensors, which is how the tests check it.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is not installed
    triton = None

__all__ = ["available", "triton_separable"]


def available(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: Triton on CUDA, or its CPU interpreter."""
    if triton is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _separable_kernel(
        v_ptr, ky_ptr, kx_ptr, out_ptr,
        heads, rows, cols, dim,
        ATOMS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
        PRODUCT: tl.constexpr,
    ):
        """``v, out (BH, Hg, Wg, d)``; ``ky (H, R, Hg, Hg)`` weights folded in; ``kx (H, R, Wg, Wg)``.
        Program ``(item, y', d block)``; all tensors contiguous."""
        item = tl.program_id(0)
        out_row = tl.program_id(1)
        d_block = tl.program_id(2)
        head = item % heads
        atom = tl.arange(0, BLOCK_R)
        col = tl.arange(0, BLOCK_W)
        feature = d_block * BLOCK_D + tl.arange(0, BLOCK_D)
        plane = (col[:, None] < cols) & (feature[None, :] < dim)
        v_item = v_ptr + item * rows * cols * dim
        ky_row = ky_ptr + head * ATOMS * rows * rows + atom * rows * rows + out_row * rows

        # y contraction for every atom: mixed[r, x, f] = sum_y ky[r, y', y] v[y, x, f]
        mixed = tl.zeros((BLOCK_R, BLOCK_W, BLOCK_D), dtype=tl.float32)
        for key_row in range(rows):
            weight = tl.load(ky_row + key_row, mask=atom < ATOMS, other=0.0)
            values = tl.load(
                v_item + key_row * cols * dim + col[:, None] * dim + feature[None, :], mask=plane, other=0.0
            )
            mixed += weight[:, None, None] * values.to(tl.float32)[None, :, :]

        # x contraction, all atoms in one product: [x', (r, x)] @ [(r, x), f]
        out_col = tl.arange(0, BLOCK_W)
        flat = tl.arange(0, BLOCK_R * BLOCK_W)
        flat_atom = flat // BLOCK_W
        flat_col = flat % BLOCK_W
        kx = tl.load(
            kx_ptr + head * ATOMS * cols * cols + flat_atom[None, :] * cols * cols + out_col[:, None] * cols
            + flat_col[None, :],
            mask=(out_col[:, None] < cols) & (flat_atom[None, :] < ATOMS) & (flat_col[None, :] < cols),
            other=0.0,
        )
        mixed = tl.reshape(mixed, (BLOCK_R * BLOCK_W, BLOCK_D))
        if PRODUCT == "fp16":  # the product in the values' dtype, accumulated in fp32
            out = tl.dot(kx.to(tl.float16), mixed.to(tl.float16))
        else:  # fp32 values: exact fp32; bf16 values: tf32 (more mantissa than bf16)
            out = tl.dot(kx, mixed, input_precision=PRODUCT)
        out_item = out_ptr + item * rows * cols * dim + out_row * cols * dim
        tl.store(out_item + out_col[:, None] * dim + feature[None, :], out.to(out_ptr.dtype.element_ty), mask=plane)


#: Precision of the kernel's matrix product per value dtype. A bf16 product gave wrong results
#: under Triton 3.8's CPU interpreter; tf32 keeps more mantissa than bf16 has.
_PRODUCT = {torch.float32: "ieee", torch.float16: "fp16", torch.bfloat16: "tf32"}


def _launch(v: Tensor, ky: Tensor, kx: Tensor) -> Tensor:
    """``A v`` for ``v (B, H, N, d)``, ``ky (H, R, Hg, Hg)``, ``kx (H, R, Wg, Wg)``."""
    batch, heads, n, dim = v.shape
    _, atoms, rows, _ = ky.shape
    cols = kx.shape[-1]
    v = v.contiguous()
    ky = ky.float().contiguous()
    kx = kx.float().contiguous()
    out = torch.empty_like(v)
    # tl.dot needs every dimension >= 16; the register-held intermediate (R x Wg x d block,
    # fp32) is kept near 4096 elements by narrowing the d block on wide grids.
    block_w = max(16, triton.next_power_of_2(cols))
    block_r = triton.next_power_of_2(atoms)
    block_d = max(16, min(64, triton.next_power_of_2(dim), 4096 // (block_r * block_w)))
    grid = (batch * heads, rows, triton.cdiv(dim, block_d))
    _separable_kernel[grid](
        v, ky, kx, out, heads, rows, cols, dim,
        ATOMS=atoms, BLOCK_R=block_r, BLOCK_W=block_w, BLOCK_D=block_d, PRODUCT=_PRODUCT[v.dtype],
        num_warps=4 if block_w <= 32 else 8,
    )
    return out


class _TritonSeparable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v: Tensor, ky: Tensor, kx: Tensor) -> Tensor:
        ctx.save_for_backward(v, ky, kx)
        return _launch(v, ky, kx)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        v, ky, kx = ctx.saved_tensors
        grad_v = grad_ky = grad_kx = None
        if ctx.needs_input_grad[0]:
            grad_v = _launch(grad_out, ky.transpose(-1, -2), kx.transpose(-1, -2))
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            batch, heads, _, dim = v.shape
            _, atoms, rows, _ = ky.shape
            cols = kx.shape[-1]
            grid_v = v.view(batch, heads, rows, cols, dim).to(ky.dtype)
            grid_g = grad_out.view(batch, heads, rows, cols, dim).to(ky.dtype)
            if ctx.needs_input_grad[1]:
                # x-mixed values: [b, h, r, y, x', f]
                x_mixed = torch.einsum("hrpx,bhyxf->bhrypf", kx, grid_v)
                grad_ky = torch.einsum("bhqpf,bhrypf->hrqy", grid_g, x_mixed)
            if ctx.needs_input_grad[2]:
                y_mixed = torch.einsum("hrqy,bhyxf->bhrqxf", ky, grid_v)
                grad_kx = torch.einsum("bhqpf,bhrqxf->hrpx", grid_g, y_mixed)
        return grad_v, grad_ky, grad_kx


def triton_separable(v: Tensor, ky: Tensor, kx: Tensor) -> Tensor:
    """Fixed separable mixing in one fused kernel; same contract as ``fixed_separable``.

    ``v (B, H, N, d)`` in fp32, fp16 or bf16; ``ky (H, R, Hg, Hg)`` with the mixture
    weights folded in and ``kx (H, R, Wg, Wg)``, fp32. Returns ``(B, H, N, d)`` in the dtype
    of ``v``. Differentiable in all three.
    """
    if v.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"the triton backend takes float32, float16 or bfloat16 values, got {v.dtype}")
    if not available(v.device):
        raise RuntimeError(
            "the triton backend needs Triton and a CUDA device (or TRITON_INTERPRET=1 on CPU); "
            "use 'separable' instead"
        )
    return _TritonSeparable.apply(v, ky, kx)
