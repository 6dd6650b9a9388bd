"""Checks and shapes shared by the token mixers."""
from __future__ import annotations

from torch import Tensor


def check_tokens(x: Tensor, grid_size: tuple[int, int], num_prefix_tokens: int, dim: int) -> tuple[int, int, int]:
    """Validate ``x (B, P + Hg*Wg, dim)`` against the grid; return ``(B, P + N, dim)``."""
    if x.dim() != 3:
        raise ValueError(f"expected tokens of shape (B, P + Hg*Wg, {dim}), got {tuple(x.shape)}")
    batch, tokens, channels = x.shape
    if channels != dim:
        raise ValueError(f"tokens have {channels} channels, the layer expects dim={dim}")
    try:
        rows, cols = (int(s) for s in grid_size)
    except (TypeError, ValueError):
        raise ValueError(f"grid_size must be a pair (Hg, Wg), got {grid_size!r}") from None
    if rows <= 0 or cols <= 0 or tokens != num_prefix_tokens + rows * cols:
        raise ValueError(
            f"{tokens} tokens do not match {num_prefix_tokens} prefix tokens + a {rows}x{cols} grid "
            f"({num_prefix_tokens + rows * cols} tokens)"
        )
    return batch, tokens, channels


def prefix_mean_rows(patch_block: Tensor, num_prefix_tokens: int) -> Tensor:
    """Embed the patch-to-patch mixing ``(B, H, N, N)`` into ``(B, H, P+N, P+N)``.

    Prefix queries average the patches (a uniform row over patch keys); prefix keys get no
    weight from anyone.
    """
    if num_prefix_tokens == 0:
        return patch_block
    batch, heads, n, _ = patch_block.shape
    total = num_prefix_tokens + n
    full = patch_block.new_zeros(batch, heads, total, total)
    full[:, :, num_prefix_tokens:, num_prefix_tokens:] = patch_block
    full[:, :, :num_prefix_tokens, num_prefix_tokens:] = 1.0 / n
    return full
