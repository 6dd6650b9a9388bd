"""Parameter-free normalisation for the continuous family."""
from __future__ import annotations

from torch import Tensor, nn

__all__ = ["CenterNorm"]


class CenterNorm(nn.Module):
    """Subtract the channel mean and scale by ``D / (D - 1)``: ``x -> (x - mean(x)) * D/(D-1)``.

    Linear in ``x`` (unlike LayerNorm, which divides by the standard deviation), so a
    vector field built from it and fixed SSoG stays globally Lipschitz (docs/models.md,
    "The continuous family").
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        if dim < 2:
            raise ValueError(f"CenterNorm needs dim >= 2, got {dim}")
        self.dim = dim
        self.scale = dim / (dim - 1)

    def forward(self, x: Tensor) -> Tensor:
        return (x - x.mean(dim=-1, keepdim=True)) * self.scale

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
