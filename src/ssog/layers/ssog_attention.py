"""``SSoGAttention``: the SSoG token mixer as a drop-in for self-attention (docs/operator.md,
"Definition")."""
from __future__ import annotations

import ctypes
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops import ssog_matrix
from ..ops.capture import capturing_graph, functorch_wrapped, holds_values
from ..ops.checks import MAX_CENTRE_OFFSET, check_steer, check_tokens
from ..ops.functional import forced_backend_name, matrix_unchecked, mix_unchecked
from ..ops.registry import BACKENDS, check_backend
from ._tokens import prefix_mean_rows, refuse_torchscript
from .kernel_init import axis_pair, initial_centres, initial_widths, inverse_softplus
from .options import check_heads, check_integer, check_number, check_probability

STEERABLE = ("mu", "sigma", "lambda")
#: Why an SSoG model pooled by its class token never trains its last block's kernels (the
#: models and :func:`ssog.convert` warn with it).
CLASS_TOKEN_POOLING = ("only the class token's output of the last block reaches the loss, and SSoG mixes only patch "
                       "tokens (a class token reads the mean of the patch values), so the last block's kernels get "
                       "no gradient")
#: The key of each steered parameter in ``steer_proj`` / ``steer_gate``: its name, but for
#: ``lambda``, a Python keyword, which code that torch.fx generates (``torch.export``'s
#: ``ExportedProgram.module()``, ONNX export) writes as an attribute and cannot compile.
#: State dicts keep the name (``steer_proj.lambda.weight``): see :func:`_state_dict_names`.
STEER_KEYS = {"mu": "mu", "sigma": "sigma", "lambda": "lambda_"}
#: The last dimension of a kernel offset (:meth:`SSoGAttention.forward`'s ``kernel_offset``):
#: per head and atom, what is added to ``mu (y, x)``, ``rho (y, x)`` and the mixture logit.
KERNEL_OFFSET_SIZE = 5


class SSoGAttention(nn.Module):
    """Mix patch tokens with a learned sum of separable Gaussians per head.

    ``x -> proj(concat_h A_h (x W_v)_h)``: a value and an output projection, no query or
    key. ``A_h = sum_r lambda_r Ky_r (x) Kx_r`` with row-normalised Gaussian kernels whose
    centre ``mu`` (relative to the query) and width ``sigma = sigma_min + softplus(rho)``
    are in token units, and ``lambda = softmax(logits)``.

    Initialisation (``centre_init``, ``width_init``): centres on a ring of
    ``centre_radius`` = 2 tokens, so the atoms of a layer point in different directions
    (:func:`initial_centres`; ``"zero"`` is a blur around the query that cannot tell left
    from right); widths on a geometric ladder from 0.5 to 4 tokens spread over the atoms
    and heads (:func:`initial_widths`, never below ``sigma_min + 0.05``); equal mixture
    weights. docs/results/accuracy.md measures these choices. ``kernel_scale`` (a number
    or a ``(y, x)`` pair) multiplies these lengths and the steering radius per axis: the
    models set it to their token grid over :data:`REFERENCE_GRID` (:func:`kernel_scale_for_grid`), so
    that the lengths above hold on an 8x8 grid and scale with the grid, in image units.

    Steering (``steer`` any subset of ``{"mu", "sigma", "lambda"}``) makes those
    parameters depend on the query token ``u`` (the block's normalised input)::

        mu_q     = mu + g_mu * M * tanh(W_mu u)
        sigma_q  = sigma_min + softplus(rho + g_sigma * W_sigma u)
        lambda_q = softmax(logits + g_lambda * W_lambda u)

    with per-head gates ``g = sigmoid(alpha)``, ``alpha`` starting at ``steer_gate_init``
    (``-8``: cold, the layer starts as the fixed operator) and ``M = steer_radius`` tokens.

    Prefix tokens (CLS, registers): patch queries never read them; a prefix query's output
    is the mean of the patch values. So in a model that pools by its class token, the last
    layer's kernels get no gradient (only its class token reaches the loss): pool by average
    (docs/models.md, "Converting a timm ViT").

    As timm's ``attn_layer`` (``VisionTransformer(attn_layer=SSoGAttention)``) the layer
    takes timm ``Attention``'s arguments and call ``attn(x, attn_mask=None)``, which carries no
    grid: :func:`follow_model_grid` (which :func:`ssog.convert` calls) gives the layers of the
    model each image's grid and the model's prefix count (:meth:`token_grid`);
    :meth:`configured` gives the class other defaults.

    Args:
        dim: token width ``D``; num_heads: ``H`` (must divide ``D``); num_atoms: ``R``.
        sigma_min: width floor in tokens (> 0). backend: see :func:`ssog.ops.ssog_mix`.
        centre_init, centre_radius, width_init: kernel initialisation, see above.
        kernel_scale: multiplies the initial centres and widths and ``steer_radius``, per
            axis ``(y, x)``; ``1``: the lengths as given, in tokens.
        qkv_bias: bias of the value projection (named for drop-in use with timm blocks).
        proj_bias: bias of the output projection. proj_drop: dropout after it.
        qk_norm: normalise (``norm_layer(dim)``, ``q_norm``) the query tokens that steer the
            kernels; SSoG has no key, and without steering no query (then an error).
        scale_norm: normalise (``norm_layer(dim)``, ``norm``) the mixed tokens before ``proj``.
        attn_drop: dropout of the patch-to-patch mixing weights ``A`` in training; the layer
            then builds ``A (B, H, N, N)`` densely, as attention would.
        norm_layer: the normalisation of ``qk_norm`` and ``scale_norm`` (``nn.LayerNorm`` if
            ``None``).
        device, dtype: where and in which dtype the parameters are created (timm's factory
            arguments; ``device="meta"`` allocates nothing).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_atoms: int = 4,
        sigma_min: float = 0.25,
        steer: Iterable[str] = (),
        steer_radius: float = 4.0,
        steer_gate_init: float = -8.0,
        num_prefix_tokens: int = 1,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        backend: str = "auto",
        centre_init: str = "ring",
        centre_radius: float = 2.0,
        width_init: str = "ladder",
        kernel_scale: float | tuple[float, float] = 1.0,
        proj_bias: bool = True,
        qk_norm: bool = False,
        scale_norm: bool = False,
        attn_drop: float = 0.0,
        norm_layer: Callable[..., nn.Module] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dd: dict[str, Any] = {"device": device, "dtype": dtype}
        self.check_options(dict(dim=dim, num_heads=num_heads, num_atoms=num_atoms, sigma_min=sigma_min,
                                steer_radius=steer_radius, centre_radius=centre_radius,
                                num_prefix_tokens=num_prefix_tokens, steer_gate_init=steer_gate_init,
                                proj_drop=proj_drop, attn_drop=attn_drop))
        check_backend(backend)

        scale = axis_pair(kernel_scale, "kernel_scale")
        self.dim, self.num_heads, self.num_atoms = dim, num_heads, num_atoms
        self.head_dim = dim // num_heads
        self.sigma_min = float(sigma_min)
        self.steer = check_steer(steer, STEERABLE)
        #: ``M`` of the steered centres per axis ``(y, x)``, in tokens.
        self.steer_radius: tuple[float, float] = (steer_radius * scale[0], steer_radius * scale[1])
        self.num_prefix_tokens = num_prefix_tokens
        self.backend = backend

        if qk_norm and not self.steer:
            raise ValueError(
                "qk_norm normalises the query tokens that steer the kernels, and this layer steers none: SSoG "
                f"has no key, and without steering no query; use qk_norm=False or steer some of {STEERABLE}"
            )
        norm_layer = norm_layer or nn.LayerNorm
        self.v = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

        scale_yx = torch.tensor(scale, dtype=torch.float32)
        widths = (initial_widths(num_heads, num_atoms, width_init).unsqueeze(-1) * scale_yx).clamp_min(
            self.sigma_min + 0.05)
        centres = initial_centres(num_heads, num_atoms, centre_init, centre_radius) * scale_yx
        self.mu = nn.Parameter(centres.to(**dd))
        # contiguous: the width ladder broadcasts to a permuted layout, which safetensors refuses
        self.rho = nn.Parameter(inverse_softplus(widths - self.sigma_min).contiguous().to(**dd))
        self.logits = nn.Parameter(torch.zeros(num_heads, num_atoms, **dd))

        components = {"mu": 2, "sigma": 2, "lambda": 1}
        self.steer_proj = nn.ModuleDict(
            {STEER_KEYS[name]: nn.Linear(dim, num_heads * num_atoms * components[name], bias=False, **dd)
             for name in self.steer}
        )
        self.steer_gate = nn.ParameterDict(
            {STEER_KEYS[name]: nn.Parameter(torch.full((num_heads,), float(steer_gate_init), **dd))
             for name in self.steer}
        )
        self.register_state_dict_post_hook(_state_dict_names)
        self.register_load_state_dict_pre_hook(_module_names)
        # (key, (ky, kx)) of the last fixed 1-D kernels built without gradients: see fixed_tables.
        self._tables_cache: tuple[tuple, tuple[Tensor, Tensor]] | None = None

    @staticmethod
    def check_options(options: Mapping[str, Any]) -> None:
        """The numeric options of this mixer in ``options`` (absent or ``None``: the default),
        each in its range (a one-line ``ValueError`` naming it and the range). Lengths are in
        tokens, and the operator places no centre further than
        :data:`~ssog.ops.checks.MAX_CENTRE_OFFSET`; a model holds them to its grid too
        (:func:`ssog.layers.options.check_kernel_reach`). ``dim`` (where given) must split into
        ``num_heads`` equal heads. The constructor runs it, and the model families on their
        mixer options before they build anything."""
        if "dim" in options:
            check_heads(options["dim"], options["num_heads"])
        check_integer("num_atoms", options.get("num_atoms"), 1)
        check_number("sigma_min", options.get("sigma_min"), 0, low_open=True, unit="the width floor in tokens")
        check_number("steer_radius", options.get("steer_radius"), 0, MAX_CENTRE_OFFSET, low_open=True, unit="tokens")
        check_number("centre_radius", options.get("centre_radius"), 0, MAX_CENTRE_OFFSET, unit="tokens")
        check_integer("num_prefix_tokens", options.get("num_prefix_tokens"), 0)
        check_number("steer_gate_init", options.get("steer_gate_init"), unit="the steering gates' starting logit")
        check_probability("proj_drop", options.get("proj_drop"))
        check_probability("attn_drop", options.get("attn_drop"))

    @classmethod
    def configured(cls, **options: Any) -> type[SSoGAttention]:
        """A subclass whose constructor takes ``options`` as its defaults (arguments given at
        the call override them, as with ``functools.partial``): timm's ``attn_layer``, which
        must be a class (timm checks it with ``issubclass``), with SSoG's options, e.g.
        ``SSoGAttention.configured(num_prefix_tokens=0, steer=("mu",))``."""
        options_known = set(inspect.signature(cls).parameters) - {"dim", "num_heads"}
        unknown = sorted(set(options) - options_known)
        if unknown:
            raise TypeError(f"{cls.__name__}.configured() takes constructor options, not {unknown}")

        def __init__(self: SSoGAttention, dim: int, num_heads: int, **kwargs: Any) -> None:
            cls.__init__(self, dim, num_heads, **{**options, **kwargs})

        return type(cls.__name__, (cls,), {"__init__": __init__, "__doc__": f"{cls.__name__} with defaults {options}"})

    # ------------------------------------------------------------------ parameters
    def _width(self, rho: Tensor) -> Tensor:
        """Widths in tokens from their raw parameter: ``sigma_min + softplus(rho)``, any shape."""
        return self.sigma_min + F.softplus(rho)

    def sigma(self) -> Tensor:
        """Fixed widths ``(H, R, 2)`` in tokens."""
        return self._width(self.rho)

    def weight(self) -> Tensor:
        """Fixed mixture weights ``(H, R)``."""
        return self.logits.softmax(dim=-1)

    def steer_gate_of(self, name: str) -> Tensor:
        """The gate logits ``alpha (H,)`` of the steered parameter ``name`` (``"mu"``, ``"sigma"``, ``"lambda"``)."""
        return self.steer_gate[STEER_KEYS[name]]

    def kernel_parameters(self, kernel_offset: Tensor | None = None) -> dict[str, Tensor]:
        """The fixed (unsteered) mixture: ``mu, sigma (H, R, 2)`` and ``weight (H, R)``, moved by
        ``kernel_offset`` (see :meth:`forward`) if given."""
        mu, rho, logits = self._offset_parameters(kernel_offset)
        return {"mu": mu, "sigma": self._width(rho), "weight": logits.softmax(dim=-1)}

    def _offset_parameters(self, kernel_offset: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``mu, rho (H, R, 2)`` and ``logits (H, R)``, moved by ``kernel_offset (H, R, 5)`` if given."""
        if kernel_offset is None:
            return self.mu, self.rho, self.logits
        expected = (self.num_heads, self.num_atoms, KERNEL_OFFSET_SIZE)
        if tuple(kernel_offset.shape) != expected:
            raise ValueError(
                f"kernel_offset has shape {tuple(kernel_offset.shape)}: expected (heads, atoms, 5) = {expected}, "
                "what is added to mu (y, x), rho (y, x) and the mixture logit"
            )
        return (self.mu + kernel_offset[..., 0:2], self.rho + kernel_offset[..., 2:4],
                self.logits + kernel_offset[..., 4])

    def mixture(
        self, patches: Tensor | None = None, kernel_offset: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Mixture parameters, fixed or steered by the patch tokens ``(B, N, D)`` (through ``q_norm``),
        moved by ``kernel_offset`` (see :meth:`forward`) if given.

        Returns ``mu, sigma`` ``(H, R, 2)`` and ``weight (H, R)`` without steering, else
        ``(B, H, N, R, 2)`` and ``(B, H, N, R)``.
        """
        mu, rho, logits = self._offset_parameters(kernel_offset)
        if not self.steer:
            return mu, self._width(rho), logits.softmax(dim=-1)
        if patches is None:
            raise ValueError("a steered SSoGAttention needs the patch tokens to compute its mixture")
        patches = self.q_norm(patches)
        batch, n, _ = patches.shape
        heads, atoms = self.num_heads, self.num_atoms

        def steering(name: str, components: int) -> Tensor:
            # Contiguous in (B, H, N, R, c), the layout of the gradients that come back from
            # the backends: with an input laid out (B, N, H, R, c) instead, softplus_backward's
            # eager CPU kernel lays its output out like the gradient and its fake-tensor rule
            # like the input (PyTorch 2.14), and a view that torch.compile's backward graph
            # traced from the fake strides fails at run time. The copy is B*N*H*R*c numbers.
            out = self.steer_proj[STEER_KEYS[name]](patches).view(batch, n, heads, atoms, components).transpose(1, 2)
            out = out.contiguous()
            gate = torch.sigmoid(self.steer_gate_of(name)).view(1, heads, 1, 1, 1)
            return gate * out  # (B, H, N, R, components)

        shape = (batch, heads, n, atoms)
        mu = mu.unsqueeze(1).expand(*shape, 2)
        rho = rho.unsqueeze(1).expand(*shape, 2)
        logits = logits.unsqueeze(1).expand(*shape)
        if "mu" in self.steer:
            radius_y, radius_x = self.steer_radius
            reach = radius_y if radius_y == radius_x else mu.new_tensor(self.steer_radius)
            mu = mu + reach * torch.tanh(steering("mu", 2))
        if "sigma" in self.steer:
            rho = rho + steering("sigma", 2)
        if "lambda" in self.steer:
            logits = logits + steering("lambda", 1).squeeze(-1)
        return mu, self._width(rho), logits.softmax(dim=-1)

    @torch.no_grad()
    def rescale_kernels(self, scale: float | tuple[float, float]) -> None:
        """Scale centres, widths and the steering radius (tokens) by ``scale``, one number or
        per axis ``(y, x)``: the grid ratio new/old when the same image is cut into another
        number of tokens, so each Gaussian keeps covering the same image area (the rule of
        :func:`kernel_scale_for_grid`)."""
        scale = axis_pair(scale, "scale")
        factor = self.mu.new_tensor(scale)
        sigma = self.sigma() * factor
        self.mu.mul_(factor)
        self.rho.copy_(inverse_softplus((sigma - self.sigma_min).clamp_min(1e-4)))
        self.steer_radius = (self.steer_radius[0] * scale[0], self.steer_radius[1] * scale[1])

    # ------------------------------------------------------------------ forward
    __prepare_scriptable__ = refuse_torchscript

    #: The token grid ``(Hg, Wg)`` of calls without one (timm's ``attn(x)``); :func:`follow_model_grid`
    #: (which :func:`ssog.convert` calls) sets it from each image. ``None``: such calls are refused
    #: (:meth:`token_grid`).
    grid_size: tuple[int, int] | None = None

    def forward(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, attn_mask: Tensor | None = None,
        is_causal: bool = False, prepared: tuple[Tensor, Tensor] | None = None,
        kernel_offset: Tensor | None = None,
    ) -> Tensor:
        """``x (B, P + Hg*Wg, dim)`` -> same shape, on the grid ``grid_size`` (else
        :meth:`token_grid`'s). ``attn_mask`` and ``is_causal`` (timm's call) must be unset:
        SSoG mixes by position. ``prepared``: what :meth:`prepare` returned for this grid, in a
        model that applies the layer several times per forward pass. ``kernel_offset (H, R, 5)``:
        added to this call's ``mu (y, x)``, ``rho (y, x)`` and mixture logits (the continuous
        family's time-dependent kernels); ``prepared`` must then come from
        ``prepare(grid_size, kernel_offset)``."""
        if attn_mask is not None or is_causal:
            raise ValueError("SSoG mixes by position and takes no attention mask")
        grid_size = self.token_grid(x, grid_size)
        batch, tokens, _ = check_tokens(x, grid_size, self.num_prefix_tokens, self.dim)
        values = self.v(x)
        if self._takes_fused(values.device, values.dtype) and not functorch_wrapped(values):
            ky, kx = prepared if prepared is not None else self.fixed_tables(grid_size, kernel_offset)
            # the registered op (ssog.ops.fused.fixed_mix): (B, T, dim) in, (B, T, dim) out
            out = torch.ops.ssog.fixed_mix.default(values, ky, kx, self.num_prefix_tokens)
        else:
            by_head = values.view(batch, tokens, self.num_heads, self.head_dim)
            out = self._mix_by_backend(x, by_head, grid_size, kernel_offset).view(batch, tokens, self.dim)
        return self.proj_drop(self.proj(self.norm(out)))

    def _takes_fused(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether calls on values of ``dtype`` on ``device`` mix with the registered ops
        (:mod:`ssog.ops.fused`) in the projections' ``(B, T, H, d)`` layout: fixed kernels,
        backend ``auto`` or ``fused`` (or ``triton`` where it runs), no attention dropout in
        training, no :func:`ssog.ops.forced_backend`. (:meth:`forward` also leaves values that a
        ``torch.func`` transform wraps to the other backends.)"""
        if self.steer or (self.training and self.attn_drop.p > 0) or forced_backend_name() is not None:
            return False
        if self.backend not in ("auto", "fused", "triton"):
            return False
        name = "fused" if self.backend == "auto" else self.backend
        return BACKENDS[name].can_run(device, dtype, self.head_dim, False, torch.is_grad_enabled())

    def _mix_by_backend(
        self, x: Tensor, values: Tensor, grid_size: tuple[int, int], kernel_offset: Tensor | None = None,
    ) -> Tensor:
        """The mixer's tokens ``(B, T, H, d)`` by :func:`ssog.ops.functional.mix_unchecked` (steered
        kernels, an explicit backend other than ``fused``), or, with attention dropout in
        training, by the dense matrix, dropped out."""
        batch, tokens, heads, head_dim = values.shape
        prefix = self.num_prefix_tokens
        patch_values = values[:, prefix:].transpose(1, 2)  # (B, H, N, d)
        out = values.new_empty(batch, tokens, heads, head_dim)
        patch_out = out[:, prefix:].transpose(1, 2)  # written in place, no (B, H, N, d) copies
        mu, sigma, weight = self.mixture(x[:, prefix:], kernel_offset)
        if self.training and self.attn_drop.p > 0:
            matrix = matrix_unchecked(mu, sigma, weight, grid_size).expand(batch, heads, -1, -1)
            patch_out.copy_(self.attn_drop(matrix).to(patch_values.dtype) @ patch_values)
        else:
            mix_unchecked(patch_values, mu, sigma, weight, grid_size, self.backend, out=patch_out)
        if prefix:
            out[:, :prefix] = patch_values.mean(dim=2).unsqueeze(1)
        return out

    def prepare(
        self, grid_size: tuple[int, int], kernel_offset: Tensor | None = None,
    ) -> tuple[Tensor, Tensor] | None:
        """What a model that applies this layer several times per forward pass (the looped and
        continuous families) computes once and passes to each call as ``prepared``: the fixed
        1-D kernels (:meth:`fixed_tables`) where the layer mixes with the registered ops, else
        ``None``."""
        if not self._takes_fused(self.mu.device, self.mu.dtype):
            return None
        return self.fixed_tables(grid_size, kernel_offset)

    def fixed_tables(
        self, grid_size: tuple[int, int], kernel_offset: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The fixed mixture's 1-D kernels on ``grid_size`` (moved by ``kernel_offset``, see
        :meth:`forward`): ``ky (H, R, Hg, Hg)`` with the mixture weights folded in and ``kx (H, R,
        Wg, Wg)`` (float32, whatever the parameters' dtype; float64 for float64 parameters), from
        one op (:func:`ssog.ops.fused.layer_tables`). In inference (no gradients, outside graph
        capture, over parameters with values, no offset) they are kept until the parameters
        change (:meth:`_mixture_key`)."""
        mu, rho, logits = self._offset_parameters(kernel_offset)
        keep = (kernel_offset is None and not torch.is_grad_enabled() and not capturing_graph()
                and holds_values(self.mu))
        if keep:
            key = (tuple(grid_size), self._mixture_key())
            if self._tables_cache is not None and self._tables_cache[0] == key:
                return self._tables_cache[1]
        ky, kx, _ = torch.ops.ssog.layer_tables.default(mu, rho, logits, self.sigma_min, *grid_size)
        if keep:
            self._tables_cache = (key, (ky, kx))
        return ky, kx

    def token_grid(self, x: Tensor, grid_size: tuple[int, int] | None = None) -> tuple[int, int]:
        """The grid ``(Hg, Wg)`` of the tokens ``x (B, T, dim)``: ``grid_size`` if given, else
        :attr:`grid_size` if set, else a ValueError naming how to give it.

        The layer never guesses: ``T`` tokens read as ``num_prefix_tokens`` plus a square grid
        would mix a non-square grid of as many patches (8x2 read as 4x4) or a model's register
        tokens as patches without a sign, and a timm block's call carries nothing that tells
        them apart."""
        if grid_size is not None:
            return grid_size
        if self.grid_size is not None:
            return self.grid_size
        raise ValueError(
            f"SSoGAttention got {x.shape[1]} tokens and no token grid: in a timm ViT built with "
            "attn_layer=SSoGAttention, call ssog.layers.follow_model_grid(model) (ssog.convert does), which takes "
            "the grid from each image and the number of class and register tokens from the model; called alone, "
            "pass grid_size=(Hg, Wg)"
        )

    def _mixture_key(self) -> tuple:
        """What identifies the fixed mixture's current values. On the CPU, their bytes, read
        from memory without a torch call: exact, whatever changed them (``.data`` and NumPy
        edits included), for a microsecond. Elsewhere, reading them would synchronise with the
        device, so their storage and version counters, which every ``.to()`` and every in-place
        update through the parameters (optimizer steps, ``load_state_dict``, ``torch.no_grad()``
        edits) changes, but edits through ``.data`` do not: after those, call ``train()`` or
        ``eval()``."""
        parameters = (self.mu, self.rho, self.logits)
        if all(p.device.type == "cpu" and p.is_contiguous() for p in parameters):
            return tuple(ctypes.string_at(p.data_ptr(), p.numel() * p.element_size()) for p in parameters)
        return tuple((p.device, p.dtype, p.data_ptr(), p._version) for p in parameters)

    def train(self, mode: bool = True) -> SSoGAttention:
        """``nn.Module.train``, which also drops the kept 1-D kernels (:meth:`fixed_tables`)."""
        self._tables_cache = None
        return super().train(mode)

    def attention_matrix(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, kernel_offset: Tensor | None = None,
    ) -> Tensor:
        """The row-stochastic mixing matrix ``(B, H, P+N, P+N)`` this layer applies to ``x``
        (before attention dropout), on the grid of :meth:`token_grid`, with the kernels moved by
        ``kernel_offset`` (see :meth:`forward`) if given."""
        grid_size = self.token_grid(x, grid_size)
        batch, tokens, _ = check_tokens(x, grid_size, self.num_prefix_tokens, self.dim)
        prefix = self.num_prefix_tokens
        mu, sigma, weight = self.mixture(x[:, prefix:], kernel_offset)
        patch_block = ssog_matrix(mu, sigma, weight, grid_size)
        if patch_block.dim() == 3:
            patch_block = patch_block.expand(batch, -1, -1, -1)
        return prefix_mean_rows(patch_block, prefix)

    def extra_repr(self) -> str:
        steer = ",".join(self.steer) or "none"
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, num_atoms={self.num_atoms}, "
            f"sigma_min={self.sigma_min}, steer={steer}, backend={self.backend}"
        )


def _renamed(state_dict: dict[str, Tensor], prefix: str, names: dict[str, str]) -> None:
    """Rename, in place, the steering entries ``prefix + {steer_proj,steer_gate}.OLD...`` to NEW.
    Every entry under ``prefix`` is re-inserted in its order, so the layer's entries keep theirs."""
    for key in [key for key in state_dict if key.startswith(prefix)]:
        container, _, rest = key[len(prefix):].partition(".")
        name, dot, tail = rest.partition(".")
        if container in ("steer_proj", "steer_gate") and name in names:
            state_dict[f"{prefix}{container}.{names[name]}{dot}{tail}"] = state_dict.pop(key)
        else:
            state_dict[key] = state_dict.pop(key)


def _state_dict_names(module: nn.Module, state_dict: dict[str, Tensor], prefix: str, *_: object) -> None:
    """``state_dict`` post-hook: steering entries under the parameters' names (``lambda``)."""
    _renamed(state_dict, prefix, {key: name for name, key in STEER_KEYS.items() if key != name})


def _module_names(module: nn.Module, state_dict: dict[str, Tensor], prefix: str, *_: object) -> None:
    """``load_state_dict`` pre-hook: steering entries back to their module keys (``lambda_``)."""
    _renamed(state_dict, prefix, {name: key for name, key in STEER_KEYS.items() if key != name})


__all__ = ["CLASS_TOKEN_POOLING", "KERNEL_OFFSET_SIZE", "SSoGAttention", "STEERABLE"]
