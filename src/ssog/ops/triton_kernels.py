"""The fixed-kernel operator's CUDA kernels, in Triton: the kernels of the registered op
``ssog::fixed_*`` (:mod:`ssog.ops.fused`) on a GPU.

Four kernels, each one launch:

- :func:`tables`: the 1-D kernels of every head and atom, ``ky (H, R, Hg, Hg)`` with the
  mixture weights folded in and ``kx (H, R, Wg, Wg)``, from ``mu, sigma (H, R, 2)`` and
  ``weight (H, R)`` (the :func:`ssog.ops.kernels.gaussian_rows` formula, clamped logits
  included), and one flag that says whether the parameters pass the value checks of
  :func:`ssog.ops.checks.check_parameter_values` (program 0 reads them all: no second launch,
  no host synchronisation).
- :func:`mix`: ``out = A v`` without ``A``. A program owns a tile of ``BLOCK_Y x BLOCK_X``
  output positions and ``BLOCK_D`` features of one (batch, head) item. It walks the key rows
  in chunks of ``BLOCK_K``: for every atom, the column contraction
  ``T[(y, f), x'] = sum_x v[y, x, f] kx[x', x]`` is one ``tl.dot``, and the row contraction
  ``acc[y', (f, x')] += sum_y ky[y', y] T[y, (f, x')]`` another, the atoms summed in the
  accumulator. Both products run on tensor cores (fp16 or bf16 operands, fp32 accumulation;
  fp32 values exactly, on CUDA cores). Values are read, and outputs written, through their
  strides in the ``(B, T, H, d)`` layout of the value and output projections, prefix tokens
  first: the mixer's tokens are never permuted or copied. One more program per item and
  feature block writes the prefix rows, the mean of the patch values.
- The same kernel with ``TRANSPOSED``: ``A^T g`` (the values' gradient) from the transposed
  1-D kernels (their strides swapped, nothing copied); the prefix rows' gradient, spread
  evenly over the patches, added in the same pass.
- :func:`table_gradients`: ``d ky`` (or, with the grid's axes swapped, ``d kx``) summed over
  the batch inside each program, each program owning its block of the result: deterministic,
  no atomics, no partial buffers.
- :func:`tables_backward`: ``d ky, d kx`` back to ``mu``, ``sigma`` and ``weight`` (the
  closed forms of :class:`ssog.ops.kernels._GaussianRows`).

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set before
Triton is imported) on CPU tensors, which is how the tests check them against the float64
definition.
"""
from __future__ import annotations

import math
import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is not installed
    triton = None

__all__ = ["available", "mix", "table_gradients", "tables", "tables_backward", "takes"]

#: gaussian_rows' logit floor, 2 ln(eps) of float32: tail values below eps^2 of the peak.
_LOGIT_FLOOR = 2.0 * math.log(torch.finfo(torch.float32).eps)
#: The value checks' limits (ssog.ops.checks): |mu| and a reach (L + |mu|) / sigma whose square fits float32.
_MAX_OFFSET = 2.0**20
_MAX_REACH = math.sqrt(torch.finfo(torch.float32).max)


def available(device: torch.device) -> bool:
    """Whether the kernels can run on ``device``: Triton on CUDA, or its CPU interpreter."""
    if triton is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def takes(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernels take values of ``dtype`` on ``device``: fp32, fp16 or bf16 where
    :func:`available` (float64 goes to the op's PyTorch kernels)."""
    return dtype in (torch.float32, torch.float16, torch.bfloat16) and available(device)


if triton is not None:

    @triton.jit
    def _unit_rows(centre, sigma, keys, length):
        """Row-normalised Gaussians ``(BQ, BL)`` over ``keys`` for centres and widths ``(BQ, 1)``;
        keys at or past ``length`` are 0."""
        scale = -0.5 / (sigma * sigma)
        nearest = tl.minimum(tl.maximum(tl.floor(centre + 0.5), 0.0), (length - 1).to(tl.float32))
        exponent = scale * (keys - nearest) * ((keys - centre) + (nearest - centre))
        value = tl.exp(tl.minimum(tl.maximum(exponent, _LOGIT_FLOOR), 0.0))  # > 0 only in masked lanes
        value = tl.where(keys < length, value, 0.0)
        return value / tl.sum(value, axis=1)[:, None]

    @triton.jit
    def _softplus(x):
        """``log(1 + exp(x))`` without overflow (``torch.nn.functional.softplus``'s threshold of 20)."""
        return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))

    @triton.jit
    def _atom_parameters(mu_ptr, sigma_ptr, weight_ptr, head, atom, axis, sigma_min, ATOMS: tl.constexpr,
                         BLOCK_R: tl.constexpr, PARAMETERISED: tl.constexpr):
        """``mu, sigma`` of one atom along one axis and its mixture weight, in float32: as given,
        or (``PARAMETERISED``) ``sigma = sigma_min + softplus(rho)`` and ``weight = softmax(logits)``
        over the head's atoms, from ``rho`` and ``logits`` in ``sigma_ptr`` and ``weight_ptr``."""
        at = head * ATOMS + atom
        mu = tl.load(mu_ptr + at * 2 + axis).to(tl.float32)
        sigma = tl.load(sigma_ptr + at * 2 + axis).to(tl.float32)
        if PARAMETERISED:
            sigma = sigma_min + _softplus(sigma)
            index = tl.arange(0, BLOCK_R)
            logits = tl.load(weight_ptr + head * ATOMS + index, mask=index < ATOMS, other=-float("inf")).to(tl.float32)
            shifted = tl.exp(logits - tl.max(logits, axis=0))
            weight = tl.sum(tl.where(index == atom, shifted, 0.0), axis=0) / tl.sum(shifted, axis=0)
        else:
            weight = tl.load(weight_ptr + at).to(tl.float32)
        return mu, sigma, weight

    @triton.jit
    def _tables_kernel(
        mu_ptr, sigma_ptr, weight_ptr, ky_ptr, kx_ptr, valid_ptr, rows, cols, sigma_min,
        ATOMS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr,
        BLOCK_R: tl.constexpr, PARAMETERISED: tl.constexpr,
    ):
        """Program ``(head * R + atom, axis, query block)``: rows of ``ky`` (axis 0) or ``kx`` (axis 1)."""
        head_atom = tl.program_id(0)
        axis = tl.program_id(1)
        length = tl.where(axis == 0, rows, cols)
        query = tl.program_id(2) * BLOCK_Q + tl.arange(0, BLOCK_Q)
        key = tl.arange(0, BLOCK_L)
        mu, sigma, weight = _atom_parameters(mu_ptr, sigma_ptr, weight_ptr, head_atom // ATOMS, head_atom % ATOMS,
                                             axis, sigma_min, ATOMS, BLOCK_R, PARAMETERISED)
        weight = tl.where(axis == 0, weight, 1.0)
        rows_out = _unit_rows(query[:, None].to(tl.float32) + mu, sigma + tl.zeros((BLOCK_Q, 1), tl.float32),
                              key[None, :].to(tl.float32), length) * weight
        offsets = head_atom * length * length + query[:, None] * length + key[None, :]
        mask = (query[:, None] < length) & (key[None, :] < length)
        if axis == 0:
            tl.store(ky_ptr + offsets, rows_out, mask=mask)
        else:
            tl.store(kx_ptr + offsets, rows_out, mask=mask)
        if (head_atom == 0) & (axis == 0) & (tl.program_id(2) == 0):
            # every parameter, as ssog.ops.checks._in_range does (NaN fails each comparison)
            count = tl.num_programs(0)
            index = tl.arange(0, BLOCK_P)
            pairs = index < 2 * count
            offset = tl.abs(tl.load(mu_ptr + index, mask=pairs, other=0.0).to(tl.float32))
            grid_length = tl.where(index % 2 == 0, rows, cols).to(tl.float32)
            widths = tl.load(sigma_ptr + index, mask=pairs, other=1.0).to(tl.float32)
            if PARAMETERISED:
                widths = sigma_min + _softplus(widths)
            reach = (grid_length + offset) / widths
            ok = (reach > 0.0) & (reach < _MAX_REACH) & (offset <= _MAX_OFFSET)
            weights = tl.abs(tl.load(weight_ptr + index, mask=index < count, other=0.0).to(tl.float32))
            ok = ok & (weights <= 3.4028234663852886e38)
            tl.store(valid_ptr, tl.min(tl.where(pairs, ok, True).to(tl.int32), axis=0) > 0)


def tables(
    mu: Tensor, sigma: Tensor, weight: Tensor, rows: int, cols: int, sigma_min: float | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``ky (H, R, Hg, Hg)`` (weights folded in), ``kx (H, R, Wg, Wg)`` in float32 and a 0-dim
    bool, whether the parameters pass the value checks; from ``mu, sigma (H, R, 2)`` and
    ``weight (H, R)`` in float32, float16 or bfloat16 (computed in float32). With ``sigma_min``,
    ``sigma`` and ``weight`` are the layer's ``rho`` and ``logits``:
    ``sigma = sigma_min + softplus(rho)``, ``weight = softmax(logits)`` over each head's atoms."""
    heads, atoms, _ = mu.shape
    mu, sigma, weight = (t.contiguous() for t in (mu, sigma, weight))
    ky = mu.new_empty(heads, atoms, rows, rows, dtype=torch.float32)
    kx = mu.new_empty(heads, atoms, cols, cols, dtype=torch.float32)
    valid = torch.empty((), dtype=torch.bool, device=mu.device)
    length = max(rows, cols)
    block_l = max(16, triton.next_power_of_2(length))
    block_q = max(1, min(16, 4096 // block_l))
    grid = (heads * atoms, 2, triton.cdiv(length, block_q))
    _tables_kernel[grid](
        mu, sigma, weight, ky, kx, valid, rows, cols, 0.0 if sigma_min is None else sigma_min,
        ATOMS=atoms, BLOCK_Q=block_q, BLOCK_L=block_l, BLOCK_P=max(16, triton.next_power_of_2(2 * heads * atoms)),
        BLOCK_R=max(2, triton.next_power_of_2(atoms)), PARAMETERISED=sigma_min is not None,
    )
    return ky, kx, valid


if triton is not None:

    @triton.jit
    def _dot(a, b, PRECISION: tl.constexpr):
        """``a @ b`` accumulated in fp32: fp16 operands on tensor cores (``"fp16"``), or fp32
        operands as tf32 (``"tf32"``, for bf16 values: more mantissa than bf16 has) or exactly
        (``"ieee"``, for fp32 values)."""
        if PRECISION == "fp16":
            return tl.dot(a.to(tl.float16), b.to(tl.float16))
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)

    @triton.jit
    def _column_contraction(
        v_item, kx_atom, key_row0, out_x, rows, cols, dim, prefix, row_step, col_step, v_st, kx_sq, kx_sk, d0,
        BLOCK_K: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_XK: tl.constexpr, BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """``T[(y, f), x'] = sum_x v[y, x, f] kx[x', x]`` for key rows ``key_row0 + (0..BLOCK_K)``,
        features ``d0 + (0..BLOCK_D)`` and output columns ``out_x``: ``(BLOCK_K * BLOCK_D, BLOCK_X)``.
        The token of ``(y, x)`` is ``prefix + y * row_step + x * col_step``."""
        chunk = tl.arange(0, BLOCK_K * BLOCK_D)
        key_y = key_row0 + chunk // BLOCK_D
        feature = d0 + chunk % BLOCK_D
        row_ok = (key_y < rows) & (feature < dim)
        t = tl.zeros((BLOCK_K * BLOCK_D, BLOCK_X), dtype=tl.float32)
        for x0 in range(0, cols, BLOCK_XK):
            key_x = x0 + tl.arange(0, BLOCK_XK)
            values = tl.load(
                v_item + (prefix + key_y[:, None] * row_step + key_x[None, :] * col_step) * v_st + feature[:, None],
                mask=row_ok[:, None] & (key_x[None, :] < cols), other=0.0,
            )
            kernel = tl.load(
                kx_atom + out_x[None, :] * kx_sq + key_x[:, None] * kx_sk,
                mask=(key_x[:, None] < cols) & (out_x[None, :] < cols), other=0.0,
            )
            t += _dot(values, kernel, PRECISION)
        return t

    @triton.jit
    def _mix_kernel(
        v_ptr, ky_ptr, kx_ptr, out_ptr,
        heads, rows, cols, dim, prefix, tiles_x, tiles,
        v_sb, v_st, v_sh, o_sb, o_st, o_sh,
        ky_sh, ky_sr, ky_sq, ky_sk, kx_sh, kx_sr, kx_sq, kx_sk,
        ATOMS: tl.constexpr, BLOCK_Y: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_XK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
        TRANSPOSED: tl.constexpr, PRECISION: tl.constexpr,
    ):
        """Program ``(item, tile, feature block)``: the tile's outputs, or (``tile == tiles``) the prefix rows."""
        item = tl.program_id(0)
        tile = tl.program_id(1)
        d0 = tl.program_id(2) * BLOCK_D
        head = item % heads
        v_item = v_ptr + (item // heads) * v_sb + head * v_sh
        out_item = out_ptr + (item // heads) * o_sb + head * o_sh
        feature = d0 + tl.arange(0, BLOCK_D)
        n = rows * cols
        if tile == tiles:
            if TRANSPOSED:  # prefix tokens' values reach no output but the prefix rows', which are means
                zeros = tl.zeros((BLOCK_D,), tl.float32).to(out_ptr.dtype.element_ty)
                for p in range(prefix):
                    tl.store(out_item + p * o_st + feature, zeros, mask=feature < dim)
            else:  # a prefix query reads the mean of the patch values
                total = tl.zeros((BLOCK_D,), dtype=tl.float32)
                for t0 in range(0, n, BLOCK_T):
                    token = t0 + tl.arange(0, BLOCK_T)
                    values = tl.load(v_item + (prefix + token[:, None]) * v_st + feature[None, :],
                                     mask=(token[:, None] < n) & (feature[None, :] < dim), other=0.0)
                    total += tl.sum(values.to(tl.float32), axis=0)
                mean = (total / n).to(out_ptr.dtype.element_ty)
                for p in range(prefix):
                    tl.store(out_item + p * o_st + feature, mean, mask=feature < dim)
            return
        out_y = (tile // tiles_x) * BLOCK_Y + tl.arange(0, BLOCK_Y)
        out_x = (tile % tiles_x) * BLOCK_X + tl.arange(0, BLOCK_X)
        acc = tl.zeros((BLOCK_Y, BLOCK_D * BLOCK_X), dtype=tl.float32)
        for k0 in range(0, rows, BLOCK_K):
            key_y = k0 + tl.arange(0, BLOCK_K)
            for atom in tl.static_range(ATOMS):
                t = _column_contraction(
                    v_item, kx_ptr + head * kx_sh + atom * kx_sr, k0, out_x, rows, cols, dim, prefix, cols, 1, v_st,
                    kx_sq, kx_sk, d0, BLOCK_K, BLOCK_X, BLOCK_XK, BLOCK_D, PRECISION,
                )
                ky = tl.load(
                    ky_ptr + head * ky_sh + atom * ky_sr + out_y[:, None] * ky_sq + key_y[None, :] * ky_sk,
                    mask=(out_y[:, None] < rows) & (key_y[None, :] < rows), other=0.0,
                )
                acc += _dot(ky, tl.reshape(t, (BLOCK_K, BLOCK_D * BLOCK_X)), PRECISION)
        out = tl.reshape(acc, (BLOCK_Y, BLOCK_D, BLOCK_X))
        if TRANSPOSED:  # each prefix row's gradient, spread evenly over the patches it averaged
            spread = tl.zeros((BLOCK_D,), dtype=tl.float32)
            for p in range(prefix):
                spread += tl.load(v_item + p * v_st + feature, mask=feature < dim, other=0.0).to(tl.float32)
            out += (spread / n)[None, :, None]
        token = prefix + out_y[:, None, None] * cols + out_x[None, None, :]
        pointers = out_item + token * o_st + feature[None, :, None]
        mask = (out_y[:, None, None] < rows) & (out_x[None, None, :] < cols) & (feature[None, :, None] < dim)
        tl.store(pointers, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _table_gradient_kernel(
        v_ptr, g_ptr, inner_ptr, grad_ptr,
        batch, heads, rows, cols, dim, prefix, row_step, col_step, tiles_x,
        v_sb, v_st, v_sh, g_sb, g_st, g_sh, in_sh, in_sr, in_sq, in_sk,
        ATOMS: tl.constexpr, BLOCK_Y: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_XK: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    ):
        """Program ``(head * R + atom, query tile, key chunk)``: its block of
        ``grad[h, r, y', y] = sum_(b, x', f) g[b, h, y', x', f] sum_x inner[h, r, x', x] v[b, h, y, x, f]``
        for ``y'`` in the tile and ``y`` in the chunk, summed over the batch here. The token of
        ``(y, x)`` is ``prefix + y * row_step + x * col_step`` (so swapped steps give ``d kx``)."""
        head_atom = tl.program_id(0)
        head = head_atom // ATOMS
        atom = head_atom % ATOMS
        out_y = tl.program_id(1) * BLOCK_Y + tl.arange(0, BLOCK_Y)
        k0 = tl.program_id(2) * BLOCK_K
        inner = inner_ptr + head * in_sh + atom * in_sr
        acc = tl.zeros((BLOCK_Y, BLOCK_K), dtype=tl.float32)
        for b in range(batch):
            v_item = v_ptr + b * v_sb + head * v_sh
            g_item = g_ptr + b * g_sb + head * g_sh
            for tile in range(tiles_x):
                out_x = tile * BLOCK_X + tl.arange(0, BLOCK_X)
                for d0 in range(0, dim, BLOCK_D):
                    t = _column_contraction(
                        v_item, inner, k0, out_x, rows, cols, dim, prefix, row_step, col_step, v_st, in_sq, in_sk,
                        d0, BLOCK_K, BLOCK_X, BLOCK_XK, BLOCK_D, PRECISION,
                    )
                    # g[y', (f, x')] for the tile's rows, this feature block and these columns
                    g_feature = d0 + tl.arange(0, BLOCK_D)
                    g = tl.load(
                        g_item + (prefix + out_y[:, None, None] * row_step + out_x[None, None, :] * col_step) * g_st
                        + g_feature[None, :, None],
                        mask=(out_y[:, None, None] < rows) & (g_feature[None, :, None] < dim)
                        & (out_x[None, None, :] < cols), other=0.0,
                    )
                    g = tl.reshape(g, (BLOCK_Y, BLOCK_D * BLOCK_X))
                    acc += _dot(g, tl.trans(tl.reshape(t, (BLOCK_K, BLOCK_D * BLOCK_X))), PRECISION)
        key_y = k0 + tl.arange(0, BLOCK_K)
        tl.store(grad_ptr + head_atom * rows * rows + out_y[:, None] * rows + key_y[None, :], acc,
                 mask=(out_y[:, None] < rows) & (key_y[None, :] < rows))

    @triton.jit
    def _tables_backward_kernel(
        grad_ky_ptr, grad_kx_ptr, mu_ptr, sigma_ptr, weight_ptr, grad_mu_ptr, grad_sigma_ptr, grad_weight_ptr,
        rows, cols, sigma_min, ATOMS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_L: tl.constexpr,
        BLOCK_R: tl.constexpr, PARAMETERISED: tl.constexpr,
    ):
        """Program ``head``: the gradients of its atoms' ``mu``, ``sigma`` (``rho``) and weights
        (``logits``) from the gradients of their tables."""
        head = tl.program_id(0)
        atom_index = tl.arange(0, BLOCK_R)
        key = tl.arange(0, BLOCK_L)[None, :]
        grad_weights = tl.zeros((BLOCK_R,), dtype=tl.float32)
        weights = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for atom in tl.static_range(ATOMS):
            head_atom = head * ATOMS + atom
            for axis in tl.static_range(2):
                length = rows if axis == 0 else cols
                mu, sigma, weight = _atom_parameters(mu_ptr, sigma_ptr, weight_ptr, head, atom, axis, sigma_min,
                                                     ATOMS, BLOCK_R, PARAMETERISED)
                grad_offset = tl.zeros((BLOCK_Q,), dtype=tl.float32)
                grad_width = tl.zeros((BLOCK_Q,), dtype=tl.float32)
                grad_weight = tl.zeros((BLOCK_Q,), dtype=tl.float32)
                for q0 in range(0, length, BLOCK_Q):
                    query = q0 + tl.arange(0, BLOCK_Q)[:, None]
                    centre = query.to(tl.float32) + mu
                    unit = _unit_rows(centre, sigma + tl.zeros((BLOCK_Q, 1), tl.float32), key.to(tl.float32), length)
                    offsets = head_atom * length * length + query * length + key
                    mask = (query < length) & (key < length)
                    if axis == 0:  # ky carries the weight: its gradient, then the unit rows'
                        grad = tl.load(grad_ky_ptr + offsets, mask=mask, other=0.0)
                        grad_weight += tl.sum(grad * unit, axis=1)
                        grad = grad * weight
                    else:
                        grad = tl.load(grad_kx_ptr + offsets, mask=mask, other=0.0)
                    grad_logits = unit * (grad - tl.sum(unit * grad, axis=1)[:, None])
                    grad_logits = tl.where(mask, grad_logits, 0.0)
                    distance = key.to(tl.float32) - centre
                    grad_offset += tl.sum(grad_logits * distance, axis=1)
                    grad_width += tl.sum(grad_logits * distance * distance, axis=1)
                variance = sigma * sigma
                grad_sigma = tl.sum(grad_width, axis=0) / (variance * sigma)
                if PARAMETERISED:  # sigma = sigma_min + softplus(rho): d sigma / d rho = sigmoid(rho)
                    rho = tl.load(sigma_ptr + head_atom * 2 + axis).to(tl.float32)
                    grad_sigma = grad_sigma / (1.0 + tl.exp(-rho))
                tl.store(grad_mu_ptr + head_atom * 2 + axis,
                         (tl.sum(grad_offset, axis=0) / variance).to(grad_mu_ptr.dtype.element_ty))
                tl.store(grad_sigma_ptr + head_atom * 2 + axis, grad_sigma.to(grad_sigma_ptr.dtype.element_ty))
                if axis == 0:
                    grad_weights = tl.where(atom_index == atom, tl.sum(grad_weight, axis=0), grad_weights)
                    weights = tl.where(atom_index == atom, weight, weights)
        if PARAMETERISED:  # weight = softmax(logits): through the softmax's Jacobian
            grad_weights = weights * (grad_weights - tl.sum(weights * grad_weights, axis=0))
        tl.store(grad_weight_ptr + head * ATOMS + atom_index, grad_weights.to(grad_weight_ptr.dtype.element_ty),
                 mask=atom_index < ATOMS)


#: Precision of the products per value dtype (:func:`_dot`). Under Triton 3.8's CPU interpreter a
#: bf16 product gave wrong results; tf32 keeps more mantissa than bf16 has.
_PRECISION = {torch.float32: "ieee", torch.float16: "fp16", torch.bfloat16: "tf32"}


def _blocks(rows: int, cols: int, dim: int) -> tuple[int, int, int, int, int]:
    """``BLOCK_Y, BLOCK_X, BLOCK_K, BLOCK_XK, BLOCK_D``: every ``tl.dot`` dimension at least 16,
    the accumulator ``BLOCK_Y x BLOCK_D*BLOCK_X`` and the column product ``BLOCK_K*BLOCK_D x
    BLOCK_X`` at 4096 fp32 numbers or fewer."""
    block_x = 16
    block_y = 16
    block_k = 16
    block_xk = max(16, min(64, triton.next_power_of_2(cols)))
    block_d = max(1, min(16, triton.next_power_of_2(dim)))
    return block_y, block_x, block_k, block_xk, block_d


def mix(v: Tensor, ky: Tensor, kx: Tensor, prefix: int, transposed: bool = False) -> Tensor:
    """``out (B, T, H, d)`` from ``v (B, T, H, d)`` (features contiguous, any other strides),
    ``T = prefix + Hg * Wg``: the patch rows ``A v`` (``transposed``: ``A^T v``, from the same
    tables) and the prefix rows the mean of the patch values (``transposed``: zeros, and each
    prefix row's ``v`` spread over the patches: the mixer's full ``(P+N) x (P+N)`` matrix,
    transposed). ``ky (H, R, Hg, Hg)``, ``kx (H, R, Wg, Wg)`` float32, any strides."""
    batch, tokens, heads, dim = v.shape
    atoms, rows, cols = ky.shape[1], ky.shape[-1], kx.shape[-1]
    if v.stride(-1) != 1:
        v = v.contiguous()
    out = torch.empty((batch, tokens, heads, dim), dtype=v.dtype, device=v.device)
    block_y, block_x, block_k, block_xk, block_d = _blocks(rows, cols, dim)
    tiles_x = triton.cdiv(cols, block_x)
    tiles = triton.cdiv(rows, block_y) * tiles_x
    ky_s, kx_s = list(ky.stride()), list(kx.stride())
    if transposed:
        ky_s[2], ky_s[3] = ky_s[3], ky_s[2]
        kx_s[2], kx_s[3] = kx_s[3], kx_s[2]
    grid = (batch * heads, tiles + (1 if prefix else 0), triton.cdiv(dim, block_d))
    _mix_kernel[grid](
        v, ky, kx, out, heads, rows, cols, dim, prefix, tiles_x, tiles,
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), *ky_s, *kx_s,
        ATOMS=atoms, BLOCK_Y=block_y, BLOCK_X=block_x, BLOCK_K=block_k, BLOCK_XK=block_xk, BLOCK_D=block_d,
        BLOCK_T=64, TRANSPOSED=transposed, PRECISION=_PRECISION[v.dtype],
    )
    return out


def table_gradients(grad: Tensor, v: Tensor, ky: Tensor, kx: Tensor, prefix: int) -> tuple[Tensor, Tensor]:
    """The gradients of ``ky`` and ``kx`` (float32, their shapes) given the output's ``grad``
    and the values ``v``, both ``(B, T, H, d)``: two launches, one per axis."""
    batch, _, heads, dim = v.shape
    atoms, rows, cols = ky.shape[1], ky.shape[-1], kx.shape[-1]
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    grad_ky = torch.empty(ky.shape, dtype=torch.float32, device=v.device)
    grad_kx = torch.empty(kx.shape, dtype=torch.float32, device=v.device)
    for length, other, out, inner, row_step, col_step in (
        (rows, cols, grad_ky, kx, cols, 1), (cols, rows, grad_kx, ky, 1, cols),
    ):
        block_y, block_x, block_k, block_xk, block_d = _blocks(length, other, dim)
        block_xk = max(16, min(64, triton.next_power_of_2(other)))
        grid = (heads * atoms, triton.cdiv(length, block_y), triton.cdiv(length, block_k))
        _table_gradient_kernel[grid](
            v, grad, inner, out, batch, heads, length, other, dim, prefix, row_step, col_step,
            triton.cdiv(other, block_x),
            v.stride(0), v.stride(1), v.stride(2), grad.stride(0), grad.stride(1), grad.stride(2), *inner.stride(),
            ATOMS=atoms, BLOCK_Y=block_y, BLOCK_X=block_x, BLOCK_K=block_k, BLOCK_XK=block_xk, BLOCK_D=block_d,
            PRECISION=_PRECISION[v.dtype],
        )
    return grad_ky, grad_kx


def tables_backward(
    grad_ky: Tensor, grad_kx: Tensor, mu: Tensor, sigma: Tensor, weight: Tensor, sigma_min: float | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of ``mu``, ``sigma`` and ``weight`` (:func:`tables`' arguments, ``rho`` and
    ``logits`` with ``sigma_min``; their dtypes) from the tables' float32 gradients."""
    heads, atoms, rows, _ = grad_ky.shape
    cols = grad_kx.shape[-1]
    mu, sigma, weight = (t.contiguous() for t in (mu, sigma, weight))
    grad_mu, grad_sigma, grad_weight = torch.empty_like(mu), torch.empty_like(sigma), torch.empty_like(weight)
    block_l = max(16, triton.next_power_of_2(max(rows, cols)))
    _tables_backward_kernel[(heads,)](
        grad_ky.contiguous(), grad_kx.contiguous(), mu, sigma, weight, grad_mu, grad_sigma, grad_weight, rows, cols,
        0.0 if sigma_min is None else sigma_min, ATOMS=atoms, BLOCK_Q=max(1, min(16, 4096 // block_l)),
        BLOCK_L=block_l, BLOCK_R=max(2, triton.next_power_of_2(atoms)), PARAMETERISED=sigma_min is not None,
    )
    return grad_mu, grad_sigma, grad_weight
