"""What the token mixers share: prefix-token rows of their mixing matrices, the TorchScript
refusal."""
from __future__ import annotations

from torch import Tensor, nn

__all__ = ["prefix_mean_rows", "refuse_torchscript"]


def refuse_torchscript(module: nn.Module) -> nn.Module:
    """The mixers' ``__prepare_scriptable__``, which ``torch.jit.script`` calls on every module
    before compiling it: their Python (shape checks, backend dispatch) is not TorchScript, so
    one line saying what records or compiles them replaces the compiler's error deep inside."""
    raise RuntimeError(
        f"torch.jit.script cannot compile ssog's {type(module).__name__}; record the model with "
        "torch.jit.trace(model, images) or torch.export.export(model, (images,)), or compile it with torch.compile"
    )


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

