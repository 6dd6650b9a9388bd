"""Fixed-kernel mixing as ops registered with ``torch.library``: the ``fused`` backend.

Two ops do the forward pass, each one kernel launch on a GPU:

- ``ssog::fixed_tables(mu, sigma, weight, rows, cols) -> (ky, kx, valid)``: the 1-D kernels
  ``ky (H, R, Hg, Hg)`` (mixture weights folded in) and ``kx (H, R, Wg, Wg)`` from ``mu,
  sigma (H, R, 2)`` and ``weight (H, R)``, and ``valid``, a 0-dim bool: whether the
  parameters pass :func:`ssog.ops.checks.check_parameter_values` (``torch._assert_async`` of
  it checks them without a host synchronisation). ``ssog::layer_tables(mu, rho, logits,
  sigma_min, rows, cols)`` is the same from the layer's parameters (``sigma = sigma_min +
  softplus(rho)``, ``weight = softmax(logits)``, in the same launch).
- ``ssog::fixed_mix(v, ky, kx, prefix) -> out``: the mixer's whole ``(P + N) x (P + N)``
  matrix applied to ``v (B, P + Hg*Wg, H, d)``, in the layout the value projection writes and
  the output projection reads (features contiguous, any other strides in; contiguous out):
  patch rows ``A v`` without forming ``A``, prefix rows the mean of the patch values.

Their backward passes are two more ops: ``ssog::fixed_mix_transposed`` (the values'
gradient, the same mixing with the transposed tables) and ``ssog::fixed_mix_table_grads``
(the tables' gradient), then ``ssog::fixed_tables_backward`` or ``ssog::layer_tables_backward``
(the tables' gradient back to the parameters). The autograd rule saves ``v`` and the tables and recomputes
the rest.

Kernels: on CUDA (and under Triton's CPU interpreter, ``TRITON_INTERPRET=1``) the Triton
kernels of :mod:`ssog.ops.triton_kernels` for fp32, fp16 and bf16; elsewhere, and for
float64, PyTorch and the compiled CPU kernels of :mod:`ssog.ops.cpp_kernels` (float32 values
of the head dimensions they take), else the dense or separable contraction by the cost model
(:mod:`ssog.ops.costs`). ``torch.compile`` records each op as one node (its fake kernel gives
shapes); ``torch.utils.flop_counter`` counts ``fixed_mix`` as the separable form,
``2 R N (Hg + Wg) d`` per head and image.

Callers on the hot path (the layer, ``ssog_mix``, the autograd rules) call the ops as
``torch.ops.ssog.<name>.default``: the Python functions here wrap the same ops in
``torch.library``'s own Python layer, which costs about 40 us a call, more than a 14x14
grid's CPU kernel.
"""
from __future__ import annotations

import os
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from . import backends, cpp_kernels
from .checks import parameters_in_range
from .costs import dense_costs
from .kernels import fixed_kernel_pair, gaussian_rows, gaussian_rows_backward, kernel_dtype

__all__ = [
    "CUDA_LAUNCHES", "fixed_mix", "fixed_mix_table_grads", "fixed_mix_transposed", "fixed_tables",
    "fixed_tables_backward", "layer_tables", "layer_tables_backward",
]

#: Kernel launches of each op's CUDA kernel (:mod:`ssog.ops.triton_kernels`; the tests count them
#: under Triton's interpreter): what :mod:`ssog.bench.dispatch` counts for a call of the op.
CUDA_LAUNCHES = {
    "fixed_tables": 1, "layer_tables": 1, "fixed_mix": 1, "fixed_mix_transposed": 1, "fixed_mix_table_grads": 2,
    "fixed_tables_backward": 1, "layer_tables_backward": 1,
}


def _triton_kernels(device: torch.device, dtype: torch.dtype) -> ModuleType | None:
    """:mod:`ssog.ops.triton_kernels` where its kernels take ``dtype`` on ``device``, else
    ``None`` (Triton is imported only for a CUDA device or under its interpreter)."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return None
    from . import triton_kernels

    return triton_kernels if triton_kernels.takes(device, dtype) else None


# ------------------------------------------------------------------------------ tables
def _tables(
    mu: Tensor, sigma: Tensor, weight: Tensor, rows: int, cols: int, sigma_min: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`fixed_tables`, or with ``sigma_min`` :func:`layer_tables` (``sigma`` and ``weight``
    are then ``rho`` and ``logits``)."""
    dtype = kernel_dtype(mu.dtype)
    kernels = _triton_kernels(mu.device, mu.dtype) if dtype == torch.float32 else None
    if kernels is not None:
        return kernels.tables(mu, sigma, weight, rows, cols, sigma_min)
    mu, sigma, weight = (t.to(dtype) for t in (mu, sigma, weight))
    if sigma_min is not None:
        sigma, weight = sigma_min + F.softplus(sigma), weight.softmax(dim=-1)
    ky, kx = fixed_kernel_pair(mu, sigma, weight, (rows, cols))
    return ky.contiguous(), kx.contiguous(), parameters_in_range(mu, sigma, weight, (rows, cols))


@torch.library.custom_op("ssog::fixed_tables", mutates_args=())
def fixed_tables(mu: Tensor, sigma: Tensor, weight: Tensor, rows: int, cols: int) -> tuple[Tensor, Tensor, Tensor]:
    """``ky (H, R, rows, rows)`` with the weights folded in, ``kx (H, R, cols, cols)`` and
    ``valid`` (0-dim bool) from ``mu, sigma (H, R, 2)`` and ``weight (H, R)`` of one float
    dtype; the tables in float32 (float64 for float64 parameters), built in that precision
    whatever the parameters' (a half-precision model's are converted in the kernel)."""
    return _tables(mu, sigma, weight, rows, cols, None)


@torch.library.custom_op("ssog::layer_tables", mutates_args=())
def layer_tables(
    mu: Tensor, rho: Tensor, logits: Tensor, sigma_min: float, rows: int, cols: int
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`fixed_tables` from the layer's parameters (:class:`ssog.layers.SSoGAttention`):
    ``sigma = sigma_min + softplus(rho)`` and ``weight = softmax(logits)`` over each head's atoms,
    computed in the same kernel, so a layer's forward pass builds its tables in one launch."""
    return _tables(mu, rho, logits, rows, cols, sigma_min)


def _fake_tables(mu: Tensor, sigma: Tensor, weight: Tensor, *sizes: float) -> tuple[Tensor, Tensor, Tensor]:
    heads, atoms, _ = mu.shape
    rows, cols = (int(size) for size in sizes[-2:])
    dtype = kernel_dtype(mu.dtype)
    valid = torch.empty((), dtype=torch.bool, device=mu.device)
    return (mu.new_empty(heads, atoms, rows, rows, dtype=dtype), mu.new_empty(heads, atoms, cols, cols, dtype=dtype),
            valid)


fixed_tables.register_fake(_fake_tables)
layer_tables.register_fake(_fake_tables)


def _tables_backward_impl(
    grad_ky: Tensor, grad_kx: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, sigma_min: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`fixed_tables_backward`, or with ``sigma_min`` :func:`layer_tables_backward`."""
    dtype = grad_ky.dtype
    kernels = _triton_kernels(mu.device, mu.dtype) if dtype == torch.float32 else None
    if kernels is not None:
        return kernels.tables_backward(grad_ky, grad_kx, mu, sigma, weight, sigma_min)
    dtypes = [t.dtype for t in (mu, sigma, weight)]
    mu, rho, logits = (t.to(dtype) for t in (mu, sigma, weight))
    if sigma_min is not None:
        sigma, weight = sigma_min + F.softplus(rho), logits.softmax(dim=-1)
    else:
        sigma, weight = rho, logits
    grad_mu, grad_sigma = torch.empty_like(mu), torch.empty_like(sigma)
    grad_weight = torch.empty_like(weight)
    for axis, grad in enumerate((grad_ky, grad_kx)):
        length = grad.shape[-1]
        centre = mu[..., axis, None] + torch.arange(length, device=mu.device, dtype=mu.dtype)  # (H, R, L)
        width = sigma[..., axis, None].expand_as(centre)
        unit = gaussian_rows(centre, width, length)  # (H, R, L, L) [query, key]
        if axis == 0:  # ky carries the weights
            grad_weight.copy_((grad * unit).sum(dim=(-1, -2)))
            grad = grad * weight[..., None, None]
        grad_centre, grad_width = gaussian_rows_backward(grad, centre, width, unit)
        assert grad_centre is not None and grad_width is not None  # both asked for
        grad_mu[..., axis] = grad_centre.sum(dim=-1)
        grad_sigma[..., axis] = grad_width.sum(dim=-1)
    if sigma_min is not None:  # through softplus (its derivative: sigmoid) and the softmax's Jacobian
        grad_sigma = grad_sigma * torch.sigmoid(rho)
        grad_weight = weight * (grad_weight - (weight * grad_weight).sum(dim=-1, keepdim=True))
    return grad_mu.to(dtypes[0]), grad_sigma.to(dtypes[1]), grad_weight.to(dtypes[2])


@torch.library.custom_op("ssog::fixed_tables_backward", mutates_args=())
def fixed_tables_backward(
    grad_ky: Tensor, grad_kx: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of ``mu``, ``sigma`` and ``weight`` (their dtypes) from those of ``ky`` and
    ``kx`` (the tables' dtype)."""
    return _tables_backward_impl(grad_ky, grad_kx, mu, sigma, weight, None)


@torch.library.custom_op("ssog::layer_tables_backward", mutates_args=())
def layer_tables_backward(
    grad_ky: Tensor, grad_kx: Tensor, mu: Tensor, rho: Tensor, logits: Tensor, sigma_min: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of :func:`layer_tables`' ``mu``, ``rho`` and ``logits``."""
    return _tables_backward_impl(grad_ky, grad_kx, mu, rho, logits, sigma_min)


def _fake_tables_backward(grad_ky: Tensor, grad_kx: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor,
                          *sigma_min: float) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(mu), torch.empty_like(sigma), torch.empty_like(weight)


fixed_tables_backward.register_fake(_fake_tables_backward)
layer_tables_backward.register_fake(_fake_tables_backward)


def _tables_setup_context(ctx, inputs: tuple, output: tuple) -> None:
    mu, sigma, weight, *options = inputs
    ctx.mark_non_differentiable(output[2])
    ctx.set_materialize_grads(False)  # no zero gradient made for the flag
    ctx.sigma_min = options[0] if len(options) == 3 else None  # layer_tables: (sigma_min, rows, cols)
    ctx.grid = tuple(options[-2:])
    ctx.save_for_backward(mu, sigma, weight)


def _tables_backward(ctx, grad_ky: Tensor | None, grad_kx: Tensor | None, _: Tensor | None) -> tuple:
    mu, sigma, weight = ctx.saved_tensors
    heads, atoms, _ = mu.shape
    rows, cols = ctx.grid
    dtype = kernel_dtype(mu.dtype)
    grad_ky = grad_ky if grad_ky is not None else mu.new_zeros(heads, atoms, rows, rows, dtype=dtype)  # unused table
    grad_kx = grad_kx if grad_kx is not None else mu.new_zeros(heads, atoms, cols, cols, dtype=dtype)
    if ctx.sigma_min is None:
        return (*torch.ops.ssog.fixed_tables_backward.default(grad_ky, grad_kx, mu, sigma, weight), None, None)
    ops = torch.ops.ssog
    return (*ops.layer_tables_backward.default(grad_ky, grad_kx, mu, sigma, weight, ctx.sigma_min), None, None, None)


fixed_tables.register_autograd(_tables_backward, setup_context=_tables_setup_context)
layer_tables.register_autograd(_tables_backward, setup_context=_tables_setup_context)


# ------------------------------------------------------------------------------ mixing
@torch.library.custom_op("ssog::fixed_mix", mutates_args=())
def fixed_mix(v: Tensor, ky: Tensor, kx: Tensor, prefix: int) -> Tensor:
    """The mixer's matrix applied to ``v (B, prefix + Hg*Wg, H, d)``, or ``(B, prefix + Hg*Wg,
    H*d)`` as the value projection writes it (``H`` of the tables): patch rows ``A v`` with
    ``A = sum_r ky_r (x) kx_r``, prefix rows the mean of the patch values. Returns a contiguous
    tensor of ``v``'s shape and dtype."""
    return _mix(v, ky, kx, prefix, transposed=False)


@torch.library.custom_op("ssog::fixed_mix_transposed", mutates_args=())
def fixed_mix_transposed(grad: Tensor, ky: Tensor, kx: Tensor, prefix: int) -> Tensor:
    """The transpose of :func:`fixed_mix`'s matrix applied to ``grad`` (its output's gradient,
    the same layout): the values' gradient, zero on the prefix rows."""
    return _mix(grad, ky, kx, prefix, transposed=True)


def _fake_mix(v: Tensor, ky: Tensor, kx: Tensor, prefix: int) -> Tensor:
    return torch.empty(v.shape, dtype=v.dtype, device=v.device)


fixed_mix.register_fake(_fake_mix)
fixed_mix_transposed.register_fake(_fake_mix)


def _by_head(v: Tensor, heads: int) -> Tensor:
    """``v (B, T, H, d)``, or ``(B, T, H*d)`` viewed as such, with contiguous features (a copy
    only where they are not: an expanded gradient, say)."""
    v = v if v.stride(-1) == 1 else v.contiguous()
    return v if v.dim() == 4 else v.unflatten(-1, (heads, -1))


def _mix(v: Tensor, ky: Tensor, kx: Tensor, prefix: int, transposed: bool) -> Tensor:
    shape, v = v.shape, _by_head(v, ky.shape[0])
    kernels = _triton_kernels(v.device, v.dtype)
    if kernels is not None:
        return kernels.mix(v, ky, kx, prefix, transposed).view(shape)
    batch, tokens, heads, dim = v.shape
    rows, cols = ky.shape[-1], kx.shape[-1]
    if transposed:
        ky, kx = ky.transpose(-1, -2), kx.transpose(-1, -2)
    out = torch.empty((batch, tokens, heads, dim), dtype=v.dtype, device=v.device)
    patches, patch_out = v[:, prefix:].transpose(1, 2), out[:, prefix:].transpose(1, 2)  # (B, H, N, d) views
    if cpp_kernels.supports(patches):
        cpp_kernels.cpp_tables(patches, ky, kx, out=patch_out)
    else:
        dense = dense_costs(patches.shape, (rows, cols), ky.shape[1], v.device)[0]
        patch_out.copy_((backends.fixed_dense if dense else backends.fixed_separable)(patches, ky, kx))
    if prefix and transposed:  # each prefix row's gradient, spread evenly over the patches it averaged
        out[:, :prefix] = 0
        patch_out += v[:, :prefix].sum(dim=1).unsqueeze(2) / (rows * cols)
    elif prefix:
        out[:, :prefix] = patches.mean(dim=2).unsqueeze(1)
    return out.view(shape)


@torch.library.custom_op("ssog::fixed_mix_table_grads", mutates_args=())
def fixed_mix_table_grads(grad: Tensor, v: Tensor, ky: Tensor, kx: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    """The gradients of ``ky`` and ``kx`` (their dtype and shapes) from :func:`fixed_mix`'s
    output gradient ``grad`` and its values ``v`` (both of the shape :func:`fixed_mix` took)."""
    grad, v = _by_head(grad, ky.shape[0]), _by_head(v, ky.shape[0])
    kernels = _triton_kernels(v.device, v.dtype) if ky.dtype == torch.float32 else None
    if kernels is not None:
        return kernels.table_gradients(grad, v, ky, kx, prefix)
    batch, _, heads, dim = v.shape
    atoms, rows, cols = ky.shape[1], ky.shape[-1], kx.shape[-1]
    n = rows * cols
    patch_grad = grad[:, prefix:].transpose(1, 2).to(ky.dtype)  # (B, H, N, d)
    patches = v[:, prefix:].transpose(1, 2).to(ky.dtype)
    if cpp_kernels.supports(patches) and cpp_kernels.supports(patch_grad):
        return cpp_kernels.cpp_table_grads(patch_grad, patches, ky, kx)
    if dense_costs(patches.shape, (rows, cols), atoms, v.device, requires_grad=True)[0]:
        # dA[h] = sum_b g_b v_b^T, one GEMM per head, then A's gradient through its two factors
        grad_matrix = torch.bmm(patch_grad.permute(1, 2, 0, 3).reshape(heads, n, batch * dim),
                                patches.permute(1, 0, 3, 2).reshape(heads, batch * dim, n))
        grad_matrix = grad_matrix.view(heads, rows, cols, rows, cols)
        return torch.einsum("hyxji,hrxi->hryj", grad_matrix, kx), torch.einsum("hyxji,hryj->hrxi", grad_matrix, ky)
    grid_grad = patch_grad.reshape(batch, heads, rows, cols, dim)
    grid_values = patches.reshape(batch, heads, rows, cols, dim)
    return (_separable_table_grad(grid_grad, grid_values, kx),
            _separable_table_grad(grid_grad.transpose(2, 3), grid_values.transpose(2, 3), ky))


def _separable_table_grad(grad: Tensor, values: Tensor, other: Tensor) -> Tensor:
    """The gradient of the row axis' tables from ``grad`` and ``values`` ``(B, H, L, M, d)`` on
    an ``L x M`` grid and the column axis' tables ``other (H, R, M, M)``: ``dk[h, r, q, y] =
    sum_(b, x, f) U[b, h, r, q, x, f] v[b, h, y, x, f]`` with ``U`` the output gradient mixed
    back along the columns, ``U[.., r, q, x, f] = sum_x' other[h, r, x', x] g[.., q, x', f]``.
    Two GEMMs per head, each as many multiply-adds as the separable forward pass; a transposed
    grid (``L`` and ``M`` swapped, ``other = ky``) gives ``kx``'s gradient."""
    batch, heads, rows, cols, dim = values.shape
    atoms = other.shape[1]
    by_column = grad.permute(1, 3, 0, 2, 4).reshape(heads, cols, batch * rows * dim)  # [h, x', (b, q, f)]
    kernels_t = other.transpose(-1, -2).reshape(heads, atoms * cols, cols)  # [h, (r, x), x']
    mixed_back = torch.bmm(kernels_t, by_column)  # [h, (r, x), (b, q, f)]
    mixed_back = mixed_back.view(heads, atoms, cols, batch, rows, dim).permute(0, 1, 4, 3, 2, 5)
    keys = values.permute(1, 0, 3, 4, 2).reshape(heads, batch * cols * dim, rows)  # [h, (b, x, f), y]
    return torch.bmm(mixed_back.reshape(heads, atoms * rows, batch * cols * dim), keys).view(heads, atoms, rows, rows)


@fixed_mix_table_grads.register_fake
def _(grad: Tensor, v: Tensor, ky: Tensor, kx: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    return torch.empty_like(ky, memory_format=torch.contiguous_format), \
        torch.empty_like(kx, memory_format=torch.contiguous_format)


def _mix_setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    v, ky, kx, prefix = inputs
    ctx.prefix = prefix
    tables_need_grad = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    ctx.save_for_backward(v if tables_need_grad else None, ky, kx)


def _mix_backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
    v, ky, kx = ctx.saved_tensors
    ops = torch.ops.ssog
    grad_v = ops.fixed_mix_transposed.default(grad, ky, kx, ctx.prefix) if ctx.needs_input_grad[0] else None
    grad_ky = grad_kx = None
    if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
        grad_ky, grad_kx = ops.fixed_mix_table_grads.default(grad, v, ky, kx, ctx.prefix)
    return grad_v, grad_ky, grad_kx, None


fixed_mix.register_autograd(_mix_backward, setup_context=_mix_setup_context)


# ------------------------------------------------------------------------------ FLOPs
def _separable_flops(value_shape: torch.Size, ky_shape: torch.Size, kx_shape: torch.Size) -> int:
    """``2 R N (Hg + Wg) d`` per head and image, ``H d`` features in all: the separable form
    (SPEC section 3)."""
    batch, features = value_shape[0], value_shape[2:].numel()
    atoms, rows, cols = ky_shape[1], ky_shape[-1], kx_shape[-1]
    return 2 * batch * atoms * rows * cols * (rows + cols) * features


@register_flop_formula([torch.ops.ssog.fixed_mix, torch.ops.ssog.fixed_mix_transposed])
def _mix_flops(v_shape: torch.Size, ky_shape: torch.Size, kx_shape: torch.Size, *args: object, **kwargs: object) -> int:
    return _separable_flops(v_shape, ky_shape, kx_shape)


@register_flop_formula(torch.ops.ssog.fixed_mix_table_grads)
def _table_grad_flops(
    grad_shape: torch.Size, v_shape: torch.Size, ky_shape: torch.Size, kx_shape: torch.Size, *args: object,
    **kwargs: object,
) -> int:
    return 2 * _separable_flops(v_shape, ky_shape, kx_shape)  # a column and a row contraction per axis
