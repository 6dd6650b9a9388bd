"""Lipschitz constants of the token mixer and of the continuous vector field.

Norms are Euclidean over all tokens of one image (the Frobenius norm of ``x (T, D)``).

Analytic upper bounds (fixed SSoG; the derivation is in ``docs/analysis.md``):

- mixer ``x -> W_o concat_h(A_h x W_v^h)``, linear in ``x``:
  ``L <= ||W_o||_2 * max_h ||A_h||_2 * ||W_v||_2`` (``A_h`` the full ``T x T`` map, prefix
  rows included);
- vector field with CenterNorm ``N`` at time ``t``:
  ``L(t) <= c * (max|g_a| L_op max|1 + s_a| + max|g_m| L_mlp max|1 + s_m|)`` with
  ``c = D/(D-1) = ||N||_2`` and ``L_mlp <= ||W_2||_2 * max|GELU'| * ||W_1||_2``.

Neither exists for MHA, steered SSoG or a LayerNorm field. Empirical local constants are the
spectral norm of the Jacobian at a point, by power iteration on ``J^T J`` with
``torch.func.jvp``/``vjp``, per image; a power-iteration estimate never exceeds the true norm.
"""
from __future__ import annotations

import copy
import functools
import math
import warnings
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn
from torch.func import jvp, vjp
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..layers import CenterNorm, SSoGAttention
from ..models.odevit import VectorField, timestep_embedding
from ..ops import forced_backend
from .capture import on_mixer_calls

__all__ = [
    "DEFAULT_SCALES", "field_lipschitz_bound", "GELU_LIPSCHITZ", "lipschitz_analysis", "local_lipschitz",
    "mixer_lipschitz_bound", "mlp_lipschitz_bound", "spectral_norm",
]

#: Input scales of the empirical estimates (multiples of the model's own inputs).
DEFAULT_SCALES: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
#: ``max_x |d/dx GELU(x)|``, reached at ``x = sqrt(2)``: ``Phi(sqrt 2) + sqrt(2) phi(sqrt 2)``.
GELU_LIPSCHITZ = 0.5 * (1 + math.erf(1.0)) + math.sqrt(2) * math.exp(-1.0) / math.sqrt(2 * math.pi)


def spectral_norm(matrix: Tensor) -> float:
    """Largest singular value of a matrix (or the max over a batch of matrices)."""
    return float(torch.linalg.matrix_norm(matrix.detach().double(), ord=2).max())


def mixer_lipschitz_bound(
    mixer: nn.Module, grid_size: tuple[int, int], kernel_offset: Tensor | None = None,
) -> float | None:
    """Global Lipschitz bound of a fixed SSoG mixer on a ``grid_size`` grid, its kernels moved by
    ``kernel_offset`` if given (:meth:`~ssog.layers.SSoGAttention.forward`); ``None`` for mixers
    without one (MHA, steered SSoG)."""
    if not isinstance(mixer, SSoGAttention) or mixer.steer:
        return None
    tokens = mixer.num_prefix_tokens + grid_size[0] * grid_size[1]
    probe = mixer.v.weight.new_zeros(1, tokens, mixer.dim)  # the map of a fixed mixer ignores x
    with torch.no_grad():
        maps = mixer.attention_matrix(probe, grid_size, kernel_offset)[0]  # (H, T, T)
    return spectral_norm(mixer.proj.weight) * spectral_norm(maps) * spectral_norm(mixer.v.weight)


def _activation_lipschitz(act: nn.Module | None) -> float | None:
    if isinstance(act, nn.GELU) and act.approximate == "none":
        return GELU_LIPSCHITZ
    if isinstance(act, (nn.ReLU, nn.Identity)):
        return 1.0
    return None


def mlp_lipschitz_bound(mlp: nn.Module) -> float | None:
    """``||fc2|| * Lip(act) * ||fc1||`` of a timm ``Mlp`` (``None`` for other layouts)."""
    act = _activation_lipschitz(getattr(mlp, "act", None))
    if act is None or not isinstance(getattr(mlp, "norm", None), nn.Identity):
        return None
    timm_mlp: Any = mlp  # timm's Mlp: fc1, act, fc2
    return spectral_norm(timm_mlp.fc2.weight) * act * spectral_norm(timm_mlp.fc1.weight)


def field_lipschitz_bound(field: VectorField, t: Tensor | float, grid_size: tuple[int, int]) -> float | None:
    """Lipschitz bound in ``x`` of ``field(t, .)`` on a ``grid_size`` grid (``None`` unless
    the field uses CenterNorm and fixed SSoG). ``t``: the time the field is called with (with
    ``time_kernels``, also the time of the kernels the bound takes)."""
    if not isinstance(field.norm, CenterNorm):
        return None
    modulation = field.adaLN_modulation[-1]
    assert isinstance(modulation, nn.Linear)
    weight = modulation.weight
    t = torch.as_tensor(t, dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        offset = field.kernel_offset(t)
    op, mlp = mixer_lipschitz_bound(field.attn, grid_size, offset), mlp_lipschitz_bound(field.mlp)
    if op is None or mlp is None:
        return None
    with torch.no_grad():
        # The modulation exactly as the field computes it at t (same embedding precision).
        c = timestep_embedding(t, field.dim).to(weight.dtype).unsqueeze(0)
        s_a, _, g_a, s_m, _, g_m = field.adaLN_modulation(c).chunk(6, dim=-1)
    attn_branch = float(g_a.abs().max()) * op * float((1 + s_a).abs().max())
    mlp_branch = float(g_m.abs().max()) * mlp * float((1 + s_m).abs().max())
    return field.norm.scale * (attn_branch + mlp_branch)


def _per_sample_norm(x: Tensor) -> Tensor:
    return x.flatten(1).norm(dim=1).view(-1, *([1] * (x.dim() - 1)))


def local_lipschitz(
    fn: Callable[[Tensor], Tensor], x: Tensor, iters: int = 20, generator: torch.Generator | None = None
) -> Tensor:
    """Spectral norm of the Jacobian of ``fn`` at each sample of ``x (B, ...)``: ``(B,)``.

    Power iteration on ``J^T J`` (``iters`` steps from a random start), assuming ``fn``
    treats samples independently (its Jacobian is block diagonal over the batch).
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    v = torch.randn(x.shape, generator=generator, dtype=x.dtype, device="cpu").to(x.device)
    v = v / _per_sample_norm(v)
    _, pullback = vjp(fn, x)  # type: ignore[misc]  # torch types the result as of has_aux too
    with warnings.catch_warnings():
        # jvp's first call scripts torch's own decompositions, which newer torch warns about:
        # nothing a user of this analysis could change.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
        for _ in range(iters):
            _, jv = jvp(fn, (x,), (v,))  # type: ignore[misc]
            (w,) = pullback(jv)
            v = w / _per_sample_norm(w).clamp_min(torch.finfo(w.dtype).tiny)
        _, jv = jvp(fn, (x,), (v,))  # type: ignore[misc]
    return _per_sample_norm(jv).flatten()


def _curve(bound: float | None, local: list[float]) -> dict[str, Any]:
    ball = [max(local[: i + 1]) for i in range(len(local))]
    return {"bound": bound, "local": local, "ball": ball,
            "within_bound": None if bound is None else all(value <= bound for value in local)}


def lipschitz_analysis(
    model: nn.Module,
    images: Tensor,
    scales: Sequence[float] = DEFAULT_SCALES,
    iters: int = 20,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> dict[str, Any]:
    """Bounds and empirical Lipschitz constants of ``model``'s mixers and vector field.

    The points are the model's own inputs on ``images``: each distinct mixer's input at its
    first application, and (continuous family) the state at every vector-field evaluation,
    each multiplied by every scale. Per target and scale, ``local`` is the largest estimate
    over the images at that scale and ``ball`` the largest over all scales up to it (the
    Lipschitz constant on the ball of that radius is at least this; dot-product attention
    saturates at large scales, so its local constant can fall again while the ball's grows).

    Returns ``{"scales", "mixers": [...], "field": [...], "summary": {"mixer", "field"}}``;
    every target has ``bound`` (``None`` where no analytic bound exists), ``local``, ``ball``.
    """
    scales = sorted(float(s) for s in scales)
    if not scales or scales[0] <= 0:
        raise ValueError(f"scales must be positive numbers, got {scales}")
    model = copy.deepcopy(model).eval().to(dtype).requires_grad_(False)  # no graphs through weights
    images = images.to(dtype)
    mixer_points: dict[str, tuple[nn.Module, Tensor, tuple[int, int], dict[str, Any]]] = {}
    field_points: list[tuple[Tensor, Tensor, tuple[int, int]]] = []

    def on_mixer(name: str, module: nn.Module, x: Tensor, grid_size: tuple[int, int], options: dict) -> None:
        mixer_points.setdefault(name, (module, x.detach(), grid_size, options))

    field = getattr(model, "field", None)
    hooks = []
    if isinstance(field, VectorField):
        hooks.append(field.register_forward_pre_hook(
            lambda module, args: field_points.append((args[0].detach(), args[1].detach(), args[2]))))
    try:
        with torch.no_grad(), on_mixer_calls(model, on_mixer):
            vit: Any = model  # a ViT with forward_features
            vit.forward_features(images)
    finally:
        for hook in hooks:
            hook.remove()

    generator = torch.Generator().manual_seed(seed)

    def estimates(fn: Callable[[Tensor], Tensor], x: Tensor) -> list[float]:
        # All scales in one batch (samples are independent). The math SDPA kernel supports
        # forward-mode AD (the fused CPU/CUDA kernels do not); the dense SSoG backend applies
        # exactly the matrix that the bound is computed from.
        factors = x.new_tensor(scales).repeat_interleave(x.shape[0]).view(-1, *([1] * (x.dim() - 1)))
        with sdpa_kernel(SDPBackend.MATH), forced_backend("dense"):
            norms = local_lipschitz(fn, factors * x.repeat(len(scales), *([1] * (x.dim() - 1))), iters, generator)
        return norms.view(len(scales), -1).amax(dim=1).tolist()

    mixers = []
    for name, (module, x, grid_size, options) in mixer_points.items():
        curve = _curve(mixer_lipschitz_bound(module, grid_size, options.get("kernel_offset")),
                       estimates(functools.partial(module, grid_size=grid_size, **options), x))
        mixers.append({"module": name, **curve})
    steps = []
    for step, (t, x, grid_size) in enumerate(field_points):
        assert isinstance(field, VectorField)  # its hook recorded the points
        curve = _curve(field_lipschitz_bound(field, t, grid_size),
                       estimates(functools.partial(field, t, grid_size=grid_size), x))
        steps.append({"step": step, "t": float(t), **curve})
    return {
        "scales": scales,
        "iters": iters,
        "points": images.shape[0],
        "mixers": mixers,
        "field": steps,
        "summary": {"mixer": _summary(mixers), "field": _summary(steps) if steps else None},
    }


def _summary(curves: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst case over targets: each estimate is under its own bound, hence under the largest."""
    bounds = [c["bound"] for c in curves]
    bound = None if any(b is None for b in bounds) else max(bounds)
    local = [max(values) for values in zip(*(c["local"] for c in curves))]
    return _curve(bound, local)
