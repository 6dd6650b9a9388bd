"""Continuous family (ODE-ViT): one shared time-conditioned block as a vector field.

The tokens after the embedding are the initial state ``x(0)``; the model integrates
``dx/dt = f(t, x)`` on ``[0, 1]`` with torchdiffeq and classifies ``x(1)``. ``f`` is the
:class:`VectorField` of docs/models.md, "The continuous family" (adaLN-Zero modulation of a parameter-free norm).

Calling the vector field outside the model (e.g. to estimate its Lipschitz constant)::

    dx = model.field(torch.tensor(0.5), x, (14, 14))  # x (B, P + 14*14, D) on a 14x14 grid -> same shape

``model.nfe`` is the number of vector-field evaluations of the last forward pass
(``field.nfe`` keeps counting across calls, backward passes of the adjoint included).
"""
from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import Tensor
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torchdiffeq import odeint, odeint_adjoint

from ..layers.options import check_integer, check_number
from ._base import ViTBase
from ._fixed_steps import FIXED_SOLVERS, Field, fixed_step
from ._registry import CIFAR_CFG, DIGITS_CFG, build_registered, model_cfg
from ._vector_field import FIELD_NORMS, VectorField, timestep_embedding

__all__ = [
    "ADAPTIVE_SOLVERS", "FIELD_NORMS", "FIXED_SOLVERS", "NoFixedSteps", "OdeViT", "timestep_embedding",
    "VectorField",
]

#: Adaptive torchdiffeq solvers (step size from ``rtol``/``atol``).
ADAPTIVE_SOLVERS: tuple[str, ...] = ("dopri5", "dopri8", "bosh3", "fehlberg2", "adaptive_heun")


class NoFixedSteps(ValueError, AttributeError):
    """What needs the steps of a fixed-step solver, asked of an adaptive one. Also an
    ``AttributeError``, so that ``hasattr`` (which ``torch.jit.trace`` calls on every attribute)
    reads the properties built on the steps (``num_intermediates``, ``feature_info``) as absent."""


def _recording_graph() -> bool:
    """``torch.jit.trace`` or ``torch.export`` is recording the forward pass (torch.compile,
    which runs what it cannot record eagerly, is not: it still calls torchdiffeq)."""
    exporting = getattr(torch.compiler, "is_exporting", None)  # torch >= 2.7
    return torch.jit.is_tracing() or (exporting is not None and exporting())


class OdeViT(ViTBase):
    """Continuous-depth ViT: the embedded tokens flow along a shared vector field on [0, 1].

    Args:
        nfe: vector-field evaluations of a fixed-step solver (default 12); it must be a
            multiple of the solver's evaluations per step (``euler`` 1, ``midpoint``/``heun2``
            2, ``heun3`` 3, ``rk4`` 4), e.g. ``rk4`` with ``nfe=12`` takes 3 steps. Not
            allowed with adaptive solvers, whose evaluations depend on the data.
        default_nfe: the evaluations of a fixed-step solver when ``nfe`` is not given (what
            the registered presets set: 12, or 6 and 4 for the CPU presets); adaptive solvers
            ignore it, so ``timm.create_model("ssog_odevit_...", solver="dopri5")`` works.
        solver: a key of :data:`FIXED_SOLVERS` or one of :data:`ADAPTIVE_SOLVERS`.
        rtol, atol: tolerances of adaptive solvers (their work follows these, not an NFE).
        adjoint: back-propagate with torchdiffeq's adjoint method (memory constant in the
            number of steps, gradients from a backward solve).
        field_norm: ``"center"`` (CenterNorm, default) or ``"layernorm"`` (no affine).
        time_kernels: SSoG's kernels move with ``t`` (:class:`VectorField`); off by default.
        weight_init: timm's ViT init mode (:meth:`~ssog.models._base.ViTBase.init_weights`);
            ``"jax"`` here by default, the xavier-uniform init DiT gives its adaLN-Zero
            blocks: with the discrete family's trunc-normal(0.02) (``""``) the gated branches
            start so small that their gates open slowly (in continuous MHA the MLP's stayed
            nearly shut), and the continuous models of both operators train worse
            (docs/results/schedule.md, "A fair continuous baseline").
        **kwargs: see :class:`~ssog.models._base.ViTBase`. ``drop_path_rate`` drops each
            branch of the field independently at every evaluation (fixed-step solvers only).
    """

    family = "odevit"

    def __init__(
        self,
        nfe: int | None = None,
        default_nfe: int = 12,
        solver: str = "euler",
        rtol: float = 1e-3,
        atol: float = 1e-4,
        adjoint: bool = False,
        field_norm: str = "center",
        time_kernels: bool = False,
        weight_init: str = "jax",
        **kwargs: Any,
    ) -> None:
        check_integer("default_nfe", default_nfe, 1)  # before the base builds anything
        _check_integration(nfe, rtol, atol)
        super().__init__(weight_init=weight_init, **kwargs)
        self.field_norm = field_norm
        self.field = VectorField(**self._block_args(), drop_path=self.drop_path_rate, norm=field_norm,
                                 time_kernels=time_kernels)
        self.default_nfe = default_nfe
        self.steps: int | None  # fixed steps; None for an adaptive solver
        self.solver, self.steps = "euler", default_nfe  # euler: one evaluation per step
        #: The flow runs on ``[0, end_time]`` (1; less after :meth:`prune_intermediate_layers`).
        self.end_time = 1.0
        self.rtol, self.atol, self.adjoint = rtol, atol, adjoint
        self.configure_solver(solver, nfe=nfe)
        #: Vector-field evaluations of the last forward pass.
        self.nfe = 0
        self.init_weights()
        self.field.zero_modulation()

    def configure_solver(
        self,
        solver: str | None = None,
        nfe: int | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        adjoint: bool | None = None,
    ) -> None:
        """Change how the flow is integrated; weights are unaffected.

        ``None`` keeps the current setting; a fixed-step solver given without ``nfe`` keeps
        the current number of evaluations (``default_nfe`` when coming from an adaptive solver).
        Raises ``ValueError`` for an unknown solver, an ``nfe``, ``rtol`` or ``atol`` out of
        its range (:func:`_check_integration`), an ``nfe`` that is not a multiple of
        the solver's evaluations per step, or ``nfe`` with an adaptive solver.
        """
        _check_integration(nfe, rtol, atol)
        solver = self.solver if solver is None else solver
        if solver in FIXED_SOLVERS:
            if nfe is None:
                nfe = self.steps * FIXED_SOLVERS[self.solver] if self.steps else self.default_nfe
            stages = FIXED_SOLVERS[solver]
            if nfe < stages or nfe % stages:
                raise ValueError(
                    f"nfe={nfe} is not a positive multiple of the {stages} evaluations per "
                    f"step of {solver!r}"
                )
            steps: int | None = nfe // stages
        elif solver in ADAPTIVE_SOLVERS:
            if nfe is not None:
                raise ValueError(
                    f"{solver!r} is adaptive: its evaluations follow rtol/atol, nfe cannot be set"
                )
            if self.drop_path_rate > 0:
                raise ValueError("drop_path_rate > 0 makes the field random: use a fixed-step solver")
            steps = None
        else:
            raise ValueError(
                f"unknown solver {solver!r}: expected a fixed-step solver "
                f"({', '.join(FIXED_SOLVERS)}) or an adaptive one ({', '.join(ADAPTIVE_SOLVERS)})"
            )
        self.solver, self.steps = solver, steps
        self.rtol = self.rtol if rtol is None else rtol
        self.atol = self.atol if atol is None else atol
        self.adjoint = self.adjoint if adjoint is None else adjoint

    def _family_config(self) -> dict[str, Any]:
        fixed = self.steps is not None
        return {
            "solver": self.solver,
            "nfe": self.steps * FIXED_SOLVERS[self.solver] if self.steps is not None else None,
            "steps": self.steps,
            **({} if fixed else {"rtol": self.rtol, "atol": self.atol}),
            "adjoint": self.adjoint,
            "field_norm": self.field_norm,
            "time_kernels": self.field.time_kernels,
        }

    # ------------------------------------------------------------------ integration
    def _time_grid(self, func: Any, y0: Tensor, t: Tensor) -> Tensor:
        """torchdiffeq ``grid_constructor``: uniform steps of ``1/steps`` from ``t[0]`` to
        ``t[-1]`` (also for the adjoint's backward solves, interval by interval). When the
        requested times already are those steps (:meth:`integrate`), they are the grid."""
        n = self._num_steps(t)
        if len(t) == n + 1:
            return t
        grid = t[0] + (t[-1] - t[0]) * torch.arange(n + 1, dtype=t.dtype, device=t.device) / n
        grid[-1] = t[-1]
        return grid

    def _num_steps(self, t: Tensor) -> int:
        assert self.steps is not None  # the time grid of fixed steps only
        return max(1, round(abs(float(t[-1] - t[0])) * self.steps))

    def integrate(self, x: Tensor, grid_size: tuple[int, int], num_steps: int | None = None) -> list[Tensor]:
        """Flow the tokens ``x (B, P + N, D)`` on the token grid ``grid_size = (Hg, Wg)`` from
        ``t = 0`` and record the evaluations in :attr:`nfe`.

        A fixed-step solver returns the state after each of the first ``num_steps`` steps
        (default: every step up to :attr:`end_time`); an adaptive one returns ``[x(end_time)]``.
        Fixed steps without the adjoint run as a loop of :func:`~ssog.models._fixed_steps.fixed_step`
        (torchdiffeq's arithmetic, with no data-dependent branch, so ``torch.compile(fullgraph=True)``
        and ``torch.export`` record it, and it runs on the meta device for FLOP counting);
        adaptive solvers and the adjoint call ``torchdiffeq.odeint`` / ``odeint_adjoint``.
        """
        start = self.field.nfe
        if self.steps is None:
            if x.device.type == "meta":
                raise ValueError(
                    f"the evaluations of the adaptive solver {self.solver!r} depend on the data; "
                    "count on the meta device with a fixed-step solver"
                )
            if _recording_graph():
                raise ValueError(
                    f"torch.jit.trace and torch.export cannot record the adaptive solver {self.solver!r}: its "
                    "steps depend on the data; configure a fixed-step solver first "
                    "(model.configure_solver('rk4', nfe=12)), or use torch.compile, which runs it eagerly"
                )
            states = [self._odeint(x, grid_size, torch.tensor([0.0, self.end_time]))[-1]]
        else:
            num_steps = self.num_intermediates if num_steps is None else num_steps
            # The adjoint is a way to compute gradients: a recorded graph holds the steps themselves.
            if self.adjoint and x.device.type != "meta" and not _recording_graph():
                states = list(self._odeint(x, grid_size, torch.arange(num_steps + 1) / self.steps)[1:])
            else:
                states = self._fixed_steps(x, grid_size, num_steps)
        self.nfe = self.field.nfe - start
        return states

    def _field_function(self, grid_size: tuple[int, int]) -> Field:
        """The field on the token grid ``grid_size`` as the solvers call it, ``f(t, x)``: one
        activation checkpoint per evaluation when grad checkpointing is on
        (:meth:`~ssog.models._base.ViTBase.set_grad_checkpointing`). What the mixer prepares
        for the grid (SSoG's fixed 1-D kernels) is computed once, for every evaluation."""
        prepared = self.field.prepare(grid_size)
        return lambda t, x: self._maybe_checkpoint(self.field, t, x, grid_size, prepared)

    def _fixed_steps(self, x: Tensor, grid_size: tuple[int, int], num_steps: int) -> list[Tensor]:
        """States after each of ``num_steps`` steps of ``1/steps`` from ``t = 0``."""
        assert self.steps is not None  # integrate calls it for fixed steps only
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        grid = torch.arange(num_steps + 1, dtype=dtype, device=x.device) / self.steps
        field, states = self._field_function(grid_size), []
        for k in range(num_steps):
            x = fixed_step(self.solver, field, grid[k], grid[k + 1], x)
            states.append(x)
        return states

    def _odeint(self, x: Tensor, grid_size: tuple[int, int], t: Tensor) -> Tensor:
        """torchdiffeq's ``odeint`` (or ``odeint_adjoint``): the states at the times ``t``."""
        t = t.to(device=x.device, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
        options = {"grid_constructor": self._time_grid} if self.steps else None
        if self.adjoint:
            # Constant memory already: no checkpoints. The gradients of the field's parameters
            # come from the backward solve.
            return odeint_adjoint(
                lambda time, state: self.field(time, state, grid_size), x, t, method=self.solver,
                rtol=self.rtol, atol=self.atol, options=options, adjoint_params=tuple(self.field.parameters()),
            )
        return odeint(self._field_function(grid_size), x, t, method=self.solver, rtol=self.rtol, atol=self.atol,
                      options=options)

    def forward_tokens(self, x: Tensor, grid_size: tuple[int, int]) -> Tensor:
        return self.integrate(x, grid_size)[-1]

    @property
    def num_intermediates(self) -> int:
        if self.steps is None:
            raise NoFixedSteps(
                f"intermediate states are the steps of a fixed-step solver; {self.solver!r} is adaptive"
            )
        return max(1, round(self.end_time * self.steps))

    def _states(self, x: Tensor, grid_size: tuple[int, int], last: int) -> Iterator[Tensor]:
        yield from self.integrate(x, grid_size, last + 1)

    def _block_groups(self) -> list[tuple[str, Any]]:
        return [(r"^field\.", None)]

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True,
    ) -> list[int]:
        """As the base, and end the flow at the last requested step (:attr:`end_time`)."""
        _, max_index = feature_take_indices(self.num_intermediates, indices)
        take = super().prune_intermediate_layers(indices, prune_norm, prune_head)
        assert self.steps is not None  # num_intermediates raised NoFixedSteps otherwise
        self.end_time = (max_index + 1) / self.steps
        return take

    def _feature_module(self, index: int) -> str:
        return "field"


# ------------------------------------------------------------------ registered models
default_cfgs = generate_default_cfgs({
    "mha_odevit_small_patch16_224": model_cfg(),
    "mha_odevit_medium_patch16_224": model_cfg(),
    "mha_odevit_base_patch16_224": model_cfg(),
    "mha_odevit_tiny_patch4_32": model_cfg(**CIFAR_CFG),
    "mha_odevit_micro_patch1_8": model_cfg(**DIGITS_CFG),
    "mha_odevit_digits_patch2_8": model_cfg(**DIGITS_CFG),
    "ssog_odevit_small_patch16_224": model_cfg(),
    "ssog_odevit_medium_patch16_224": model_cfg(),
    "ssog_odevit_base_patch16_224": model_cfg(),
    "ssog_odevit_tiny_patch4_32": model_cfg(**CIFAR_CFG),
    "ssog_odevit_micro_patch1_8": model_cfg(**DIGITS_CFG),
    "ssog_odevit_digits_patch2_8": model_cfg(**DIGITS_CFG),
})


@register_model
def mha_odevit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with multi-head attention, the paper's small width (ViT-S/16, 224 px)."""
    model_args = dict(op="mha", embed_dim=384, num_heads=6, default_nfe=12)
    return build_registered(OdeViT, "mha_odevit_small_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_odevit_medium_patch16_224(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with multi-head attention, the paper's medium width (patch 16, 224 px)."""
    model_args = dict(op="mha", embed_dim=576, num_heads=9, default_nfe=12)
    return build_registered(OdeViT, "mha_odevit_medium_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_odevit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with multi-head attention, the paper's base width (ViT-B/16, 224 px)."""
    model_args = dict(op="mha", embed_dim=768, num_heads=12, default_nfe=12)
    return build_registered(OdeViT, "mha_odevit_base_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_odevit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with multi-head attention, CPU size: 32 px CIFAR images, 8x8 tokens."""
    model_args = dict(op="mha", img_size=32, patch_size=4, embed_dim=128, num_heads=4, default_nfe=6)
    return build_registered(OdeViT, "mha_odevit_tiny_patch4_32", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_odevit_micro_patch1_8(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with multi-head attention, CPU size: 8x8 single-channel digits, one token per pixel."""
    model_args = dict(op="mha", img_size=8, patch_size=1, embed_dim=64, num_heads=4, default_nfe=4)
    return build_registered(OdeViT, "mha_odevit_micro_patch1_8", pretrained, **dict(model_args, **kwargs))


@register_model
def mha_odevit_digits_patch2_8(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with multi-head attention, CPU size: 8x8 single-channel digits, 2x2-pixel patches, average pooling."""
    model_args = dict(op="mha", img_size=8, patch_size=2, embed_dim=64, num_heads=4, global_pool="avg", default_nfe=4)
    return build_registered(OdeViT, "mha_odevit_digits_patch2_8", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_odevit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with SSoG, the paper's small width (ViT-S/16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=384, num_heads=6, default_nfe=12)
    return build_registered(OdeViT, "ssog_odevit_small_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_odevit_medium_patch16_224(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with SSoG, the paper's medium width (patch 16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=576, num_heads=9, default_nfe=12)
    return build_registered(OdeViT, "ssog_odevit_medium_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_odevit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with SSoG, the paper's base width (ViT-B/16, 224 px)."""
    model_args = dict(op="ssog", embed_dim=768, num_heads=12, default_nfe=12)
    return build_registered(OdeViT, "ssog_odevit_base_patch16_224", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_odevit_tiny_patch4_32(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with SSoG, CPU size: 32 px CIFAR images, 8x8 tokens."""
    model_args = dict(op="ssog", img_size=32, patch_size=4, embed_dim=128, num_heads=4, default_nfe=6)
    return build_registered(OdeViT, "ssog_odevit_tiny_patch4_32", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_odevit_micro_patch1_8(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with SSoG, CPU size: 8x8 single-channel digits, one token per pixel."""
    model_args = dict(op="ssog", img_size=8, patch_size=1, embed_dim=64, num_heads=4, default_nfe=4)
    return build_registered(OdeViT, "ssog_odevit_micro_patch1_8", pretrained, **dict(model_args, **kwargs))


@register_model
def ssog_odevit_digits_patch2_8(pretrained: bool = False, **kwargs: Any) -> OdeViT:
    """OdeViT with SSoG, CPU size: 8x8 single-channel digits, 2x2-pixel patches, average pooling."""
    model_args = dict(op="ssog", img_size=8, patch_size=2, embed_dim=64, num_heads=4, global_pool="avg", default_nfe=4)
    return build_registered(OdeViT, "ssog_odevit_digits_patch2_8", pretrained, **dict(model_args, **kwargs))


def _check_integration(nfe: int | None, rtol: float | None, atol: float | None) -> None:
    """``nfe`` an integer >= 1; adaptive solvers' tolerances finite, ``rtol > 0`` (it keeps the
    step size from collapsing) and ``atol >= 0``; ``None`` keeps the setting."""
    check_integer("nfe", nfe, 1)
    check_number("rtol", rtol, 0, low_open=True, noun="tolerance")
    check_number("atol", atol, 0, noun="tolerance")
