"""Prefix-token rows shared by the token mixers' mixing matrices."""
from __future__ import annotations

from torch import Tensor


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
