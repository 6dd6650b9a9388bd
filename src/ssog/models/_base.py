"""What the three families share: patch/position embedding, final norm, pooling, head.

Attribute names follow timm's ``VisionTransformer`` (``patch_embed``, ``cls_token``,
``pos_embed``, ``norm``, ``head``, ``num_prefix_tokens``, ``global_pool``,
``num_features``, ``head_hidden_size``) so timm's utilities (pos-embed and patch-embed
resampling, feature extraction, its train/validate scripts) work on every family.
A family only says how the tokens are mixed: :meth:`ViTBase.forward_tokens` and
:meth:`ViTBase._states`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import torch
from timm.layers import (
    PatchEmbed, get_device_dtype, resample_abs_pos_embed, to_2tuple, trunc_normal_,
)
from timm.models._features import feature_take_indices
from timm.models import checkpoint
from timm.models._manipulate import named_apply
from timm.models.vision_transformer import get_init_weights_vit
from torch import Tensor, nn

from ..layers import SSoGAttention, describe_initial_kernels, kernel_scale_for_grid, named_mixers, ssog_mixers
from ..layers.options import check_heads, check_integer, check_kernel_reach, check_number, check_probability, token_grid
from ._blocks import MIXERS, resolve_mixer_args
from .weights import load_run_checkpoint

GLOBAL_POOLS: tuple[str, ...] = ("token", "avg", "")
#: ``(global_pool, class_token)`` of each operator when the caller gives neither. An SSoG
#: class token only reads the mean of the patch values, so with class-token pooling the last
#: mixing step never reaches the logits (in the discrete family its kernels get no gradient);
#: average pooling measured better (docs/results/accuracy.md). MHA keeps timm's layout.
DEFAULT_LAYOUT: dict[str, tuple[str, bool]] = {"mha": ("token", True), "ssog": ("avg", False)}
#: timm's ``VisionTransformer(weight_init=...)`` modes (:meth:`ViTBase.init_weights`).
WEIGHT_INITS: tuple[str, ...] = ("", "jax", "jax_nlhb", "moco")


class ViTBase(nn.Module):
    """Base of the discrete, looped and continuous families (not a model by itself).

    Args:
        img_size: nominal input size (sets the position-embedding grid); any size divisible
            by ``patch_size`` is accepted at run time (pos-embed resampled bicubically).
        patch_size: patch side in pixels.
        in_chans: input channels.
        num_classes: classifier outputs; 0 for no head (``forward`` returns pooled features).
        global_pool: ``"token"`` (class token), ``"avg"`` (mean of patch tokens) or ``""``;
            ``None``: the operator's default (:data:`DEFAULT_LAYOUT`): timm's class token for
            ``mha``, average pooling without a class token for ``ssog``.
        embed_dim, num_heads, mlp_ratio: width, heads and MLP expansion.
        op: token mixer, ``"mha"`` (fused SDPA attention) or ``"ssog"``.
        qkv_bias: bias of the mixer's input projection(s).
        class_token: prepend a learned class token (a prefix token SSoG patches never read);
            ``None``: the operator's default (:data:`DEFAULT_LAYOUT`).
        drop_rate: dropout before the head. proj_drop_rate: dropout after mixer/MLP outputs.
        drop_path_rate: stochastic depth (the family documents how it is spread).
        mixer_kwargs: options of the token mixer (for ``op="ssog"`` those of
            :class:`~ssog.layers.SSoGAttention`: ``num_atoms``, ``sigma_min``, ``steer``,
            ``steer_radius``, ``steer_gate_init``, ``backend``, ``centre_init``,
            ``centre_radius``, ``width_init``, ...; ``None`` = its default), every constructor
            argument of the mixer but those the model sets (:data:`~ssog.models._blocks.MODEL_SET`).
        **mixer_options: the same options as keywords (``steer=("mu",)``, what recipes'
            ``model_kwargs`` and timm's ``create_model`` give), merged with ``mixer_kwargs``; an
            option the mixer does not take is an error naming the mixer that does.
        kernel_units: ``"image"`` (SSoG default): the initial kernel lengths
            (``centre_radius``, the width ladder) and ``steer_radius`` are given for an 8x8
            token grid and scaled by this model's grid over 8 per axis, so every layer starts
            covering the same fraction of the image whatever the patch size and resolution
            (:func:`~ssog.layers.kernel_init.kernel_scale_for_grid`); ``"tokens"``: as
            given, in tokens of this model's grid. An error with ``op="mha"``.
        dynamic_img_size: timm's option: accept any input size divisible by the patch, the
            position embedding resampled to its grid at every forward (the default here);
            ``False`` accepts ``img_size`` only, as timm's ViT does by default.
        weight_init: timm's ViT init mode (:data:`WEIGHT_INITS`, :meth:`init_weights`):
            ``""`` trunc-normal(0.02) Linear weights (default), ``"jax"`` Flax's
            xavier-uniform (the init DiT gives its adaLN-Zero blocks), ``"jax_nlhb"``,
            ``"moco"``.

    Every numeric option (a family's too: it checks its own before calling this; the mixer's
    with the mixer's ``check_options``) is checked before any module is built; a bad value is a
    one-line ``ValueError`` naming it and its range.
    """

    #: Family name used in registered model names (``ssog info``'s ``family``).
    family: str = ""

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str | None = None,
        embed_dim: int = 768,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        op: str = "mha",
        qkv_bias: bool = True,
        class_token: bool | None = None,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        mixer_kwargs: Mapping[str, Any] | None = None,
        kernel_units: str | None = None,
        dynamic_img_size: bool = True,
        weight_init: str = "",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **mixer_options: Any,
    ) -> None:
        super().__init__()
        dd: dict[str, Any] = {"device": device, "dtype": dtype}
        # Every option is checked before any module is built; the kernel lengths (centre_radius,
        # steer_radius) against the token grid too, below.
        check_integer("in_chans", in_chans, 1)
        check_integer("num_classes", num_classes, 0)
        check_number("mlp_ratio", mlp_ratio, 0, low_open=True)
        for name, rate in (("drop_rate", drop_rate), ("proj_drop_rate", proj_drop_rate),
                           ("drop_path_rate", drop_path_rate)):
            check_probability(name, rate)
        check_heads(embed_dim, num_heads, "embed_dim")
        if weight_init not in WEIGHT_INITS:
            raise ValueError(f"weight_init={weight_init!r}: expected one of timm's ViT modes {WEIGHT_INITS}")
        grid = token_grid(img_size, patch_size)
        global_pool, class_token = _pool_layout(op, global_pool, class_token)
        _check_pool(global_pool, class_token)
        twice = sorted(set(mixer_kwargs or {}) & set(mixer_options))
        if twice:
            raise ValueError(f"mixer option(s) {twice} given both in mixer_kwargs and as keywords: give each once")
        self.mixer_kwargs = resolve_mixer_args(op, {**(mixer_kwargs or {}), **mixer_options})
        if op != "ssog" and kernel_units is not None:
            raise ValueError(f"kernel_units only applies to op='ssog', not op={op!r}")
        units = kernel_units or "image"
        self.kernel_units = units if op == "ssog" else None
        if op == "ssog":
            self.mixer_kwargs["kernel_scale"] = kernel_scale_for_grid(grid, units)
            check_kernel_reach(self.mixer_kwargs, grid, self.mixer_kwargs["kernel_scale"], units)
        MIXERS[op].check_options(self.mixer_kwargs)  # the kernel lengths were held to the grid above
        self.op = op
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.mlp_ratio = mlp_ratio
        self.qkv_bias = qkv_bias
        self.proj_drop_rate = proj_drop_rate
        self.drop_path_rate = drop_path_rate
        self.has_class_token = class_token
        self.num_prefix_tokens = 1 if class_token else 0
        self.dynamic_img_size = dynamic_img_size
        self.weight_init = weight_init

        # NHWC output: the grid size is read off the embedded tensor, so any input size works.
        # timm annotates patch_size as int; it takes a (height, width) pair too (to_2tuple).
        self.patch_embed = PatchEmbed(
            img_size=img_size, patch_size=patch_size,  # type: ignore[arg-type]
            in_chans=in_chans, embed_dim=embed_dim,
            strict_img_size=not dynamic_img_size, output_fmt="NHWC", **dd,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim, **dd)) if class_token else None
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.patch_embed.num_patches + self.num_prefix_tokens, embed_dim, **dd)
        )
        self.norm: nn.Module = nn.LayerNorm(embed_dim, eps=1e-6, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        # Run checkpoints (`model/<name>` keys) load through load_state_dict, hence through
        # timm.create_model(checkpoint_path=...) too.
        self.register_load_state_dict_pre_hook(load_run_checkpoint)

    # ------------------------------------------------------------------ construction helpers
    def _block_args(self) -> dict[str, Any]:
        """Keyword arguments shared by every block/vector field of this model."""
        return dict(
            dim=self.embed_dim, num_heads=self.num_heads, mlp_ratio=self.mlp_ratio, op=self.op,
            num_prefix_tokens=self.num_prefix_tokens, qkv_bias=self.qkv_bias,
            proj_drop=self.proj_drop_rate, mixer_kwargs=self.mixer_kwargs, **get_device_dtype(self),
        )

    def init_weights(self, mode: str | None = None) -> None:
        """timm's ViT init in ``mode`` (default: the model's ``weight_init``), by timm's own
        per-module functions: trunc-normal(0.02) position embedding, near-zero class token,
        then ``""`` trunc-normal(0.02) Linear weights and zero biases; ``"jax"`` xavier-uniform
        Linear weights, LeCun-normal patch embedding and a zero head (``"jax_nlhb"``: head
        bias ``-log(num_classes)``); ``"moco"`` xavier-uniform with Q, K, V apart. The mixers'
        own kernel parameters keep their init (no module is reset)."""
        mode = self.weight_init if mode is None else mode
        if mode not in WEIGHT_INITS:
            raise ValueError(f"weight_init={mode!r}: expected one of timm's ViT modes {WEIGHT_INITS}")
        head_bias = -math.log(self.num_classes) if "nlhb" in mode and self.num_classes > 1 else 0.0
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        try:
            init_module = get_init_weights_vit(mode, head_bias, needs_reset=False)
        except TypeError:  # timm before needs_reset, whose functions never reset a module
            init_module = get_init_weights_vit(mode, head_bias)
        named_apply(init_module, self)

    def config(self) -> dict[str, Any]:
        """The architecture as plain values (what ``ssog info`` prints)."""
        return {
            "family": self.family,
            "op": self.op,
            "img_size": list(self.patch_embed.img_size),
            "patch_size": list(self.patch_embed.patch_size),
            "in_chans": self.in_chans,
            "num_classes": self.num_classes,
            "embed_dim": self.embed_dim,
            "num_heads": self.num_heads,
            "mlp_ratio": self.mlp_ratio,
            "global_pool": self.global_pool,
            "class_token": self.has_class_token,
            "drop_path_rate": self.drop_path_rate,
            "weight_init": self.weight_init,
            **self._family_config(),
            **({"ssog": {k: list(v) if isinstance(v, tuple) else v for k, v in self.mixer_kwargs.items()},
                "kernel_units": self.kernel_units,
                "initial_kernels": describe_initial_kernels(self.num_heads, self.mixer_kwargs)}
               if self.op == "ssog" else {}),
        }

    def _family_config(self) -> dict[str, Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------ token mixing (family)
    def forward_tokens(self, x: Tensor, grid_size: tuple[int, int]) -> Tensor:
        """Mix embedded tokens ``x (B, P + Hg*Wg, D)`` -> same shape (before the final norm)."""
        raise NotImplementedError

    @property
    def num_intermediates(self) -> int:
        """How many intermediate states :meth:`forward_intermediates` can return."""
        raise NotImplementedError

    def _states(self, x: Tensor, grid_size: tuple[int, int], last: int) -> Iterator[Tensor]:
        """Yield the token state after each of the first ``last + 1`` intermediates."""
        raise NotImplementedError

    # ------------------------------------------------------------------ embedding
    def _check_input(self, x: Tensor) -> None:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected images of shape (B, {self.in_chans}, H, W), got {tuple(x.shape)}"
            )
        (height, width), (ph, pw) = x.shape[-2:], self.patch_embed.patch_size
        if height % ph or width % pw:
            raise ValueError(
                f"image size {height}x{width} is not divisible by the patch size {ph}x{pw}"
            )
        if not self.dynamic_img_size and (height, width) != tuple(self.patch_embed.img_size):
            size = "x".join(map(str, self.patch_embed.img_size))
            raise ValueError(f"image size {height}x{width} is not the model's {size}: it was built with "
                             "dynamic_img_size=False (True accepts any size divisible by the patch)")

    def embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Images ``(B, C, H, W)`` -> tokens ``(B, P + Hg*Wg, D)`` and the grid ``(Hg, Wg)``.

        The position embedding is resampled (bicubic, timm) when the grid differs from the
        one it was trained for.
        """
        self._check_input(x)
        x = self.patch_embed(x)
        batch, rows, cols, dim = x.shape
        pos_embed = resample_abs_pos_embed(
            self.pos_embed, new_size=(rows, cols), old_size=self.patch_embed.grid_size,
            num_prefix_tokens=self.num_prefix_tokens,
        )
        # timm's NHWC patch embedding is a permuted view of the convolution's output; kept so
        # (no class token to concatenate), every element-wise op after it keeps that layout
        # and every LayerNorm copies it back: 25 copies per forward of the small ViT.
        x = x.reshape(batch, rows * cols, dim).contiguous()
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(batch, -1, -1), x], dim=1)
        return x + pos_embed, (rows, cols)

    def set_input_size(
        self,
        img_size: int | tuple[int, int] | None = None,
        patch_size: int | tuple[int, int] | None = None,
        rescale_kernels: bool = False,
    ) -> None:
        """Change the nominal input size and/or patch size, as timm's ``VisionTransformer``.

        The patch-embedding kernel is PI-resized and the position embedding resampled
        (bicubic) to the new grid, both by timm. With ``rescale_kernels`` every SSoG layer's
        ``mu``, ``sigma`` and steering radius (token units) are multiplied by the grid ratio
        new/old per axis, so each Gaussian keeps covering the same image area (Table 13,
        "rescaled"; the rule of ``kernel_units="image"``).
        """
        old_grid = self.patch_embed.grid_size
        self.patch_embed.set_input_size(
            img_size=None if img_size is None else to_2tuple(img_size),
            patch_size=None if patch_size is None else to_2tuple(patch_size),
        )
        new_grid = self.patch_embed.grid_size
        if new_grid != old_grid:
            self.pos_embed = nn.Parameter(
                resample_abs_pos_embed(
                    self.pos_embed.detach(), new_size=new_grid, old_size=old_grid,
                    num_prefix_tokens=self.num_prefix_tokens,
                ),
                requires_grad=self.pos_embed.requires_grad,
            )
        if rescale_kernels:
            for module in ssog_mixers(self):
                module.rescale_kernels((new_grid[0] / old_grid[0], new_grid[1] / old_grid[1]))

    # ------------------------------------------------------------------ timm model contract
    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``(B, C, H, W)`` -> normalised tokens ``(B, P + Hg*Wg, D)``."""
        x, grid_size = self.embed(x)
        return self.norm(self.forward_tokens(x, grid_size))

    def pool(self, x: Tensor, pool_type: str | None = None) -> Tensor:
        """Tokens ``(B, P + N, D)`` -> ``(B, D)`` (or unchanged for pool type ``""``)."""
        pool_type = self.global_pool if pool_type is None else pool_type
        if pool_type == "token":
            return x[:, 0]
        if pool_type == "avg":
            return x[:, self.num_prefix_tokens:].mean(dim=1)
        return x

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens ``(B, P + N, D)`` -> logits ``(B, num_classes)`` (pooled features with
        ``pre_logits``)."""
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Images ``(B, C, H, W)`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a fresh one of ``num_classes`` outputs (0: no head)."""
        if global_pool is not None:
            _check_pool(global_pool, self.has_class_token)
            self.global_pool = global_pool
        self.num_classes = num_classes
        dd = get_device_dtype(self)
        self.head = nn.Linear(self.embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.head.train(self.training)
        if isinstance(self.head, nn.Linear):
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    # ------------------------------------------------------------------ training utilities (timm)
    #: Recompute each block application in the backward pass instead of storing its
    #: activations (:meth:`set_grad_checkpointing`).
    grad_checkpointing: bool = False

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing per block application: each block (discrete), each loop
        iteration (looped) or each vector-field evaluation (continuous) keeps only its input
        and is recomputed in the backward pass. Outputs and gradients are unchanged."""
        self.grad_checkpointing = enable

    def _maybe_checkpoint(self, function: Callable[..., Tensor], *args: Any) -> Tensor:
        """``function(*args)``, under an activation checkpoint when checkpointing is on and
        autograd is recording."""
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(function, *args)
        return function(*args)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter groups, from input to output (layer-wise lr decay, e.g.
        ``timm.optim.create_optimizer_v2(model, layer_decay=0.75)``): the stem (patch and
        position embedding, class token), then one group per block of the family
        (:meth:`_block_groups`), then the head (what no pattern matches)."""
        return dict(stem=r"^cls_token|^pos_embed|^patch_embed", blocks=self._block_groups())

    def _block_groups(self) -> list[tuple[str, Any]]:
        """``group_matcher``'s block patterns: ``(regex, suffix)`` as timm's."""
        raise NotImplementedError

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Embeddings and the SSoG kernel parameters (positions/widths/mixture logits in
        token units, which weight decay would pull towards arbitrary values)."""
        names = {"pos_embed"} | ({"cls_token"} if self.cls_token is not None else set())
        for prefix, module in named_mixers(self, SSoGAttention):
            linears = {name for name, m in module.named_modules() if isinstance(m, nn.Linear)}
            names.update(
                f"{prefix}.{name}" for name, _ in module.named_parameters()
                if name.rpartition(".")[0] not in linears  # mu, rho, logits, steering gates
            )
        return names

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        reduction = max(self.patch_embed.patch_size)
        return [
            dict(module=self._feature_module(i), num_chs=self.embed_dim, reduction=reduction)
            for i in range(self.num_intermediates)
        ]

    def _feature_module(self, index: int) -> str:
        raise NotImplementedError

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        """timm's intermediate-feature API: states after blocks / loop iterations / solver steps.

        Args:
            indices: last ``n`` states if int, all if None, else the listed indices.
            return_prefix_tokens: pair each patch feature with its prefix tokens.
            norm: apply the final norm to each intermediate.
            stop_early: stop mixing after the last requested state.
            output_fmt: ``"NCHW"`` (``(B, D, Hg, Wg)``) or ``"NLC"`` (``(B, Hg*Wg, D)``).
            intermediates_only: return only the intermediates.

        Returns:
            The intermediates, or ``(final normalised tokens, intermediates)``.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, max_index = feature_take_indices(self.num_intermediates, indices)
        last = max_index if stop_early or intermediates_only else self.num_intermediates - 1
        x, (rows, cols) = self.embed(x)
        intermediates = []
        for i, state in enumerate(self._states(x, (rows, cols), last)):
            x = state  # the final state feeds the returned norm below
            if i in take:
                intermediates.append(self.norm(state) if norm else state)
        prefix = [y[:, :self.num_prefix_tokens] for y in intermediates]
        intermediates = [y[:, self.num_prefix_tokens:] for y in intermediates]
        if output_fmt == "NCHW":
            intermediates = [
                y.reshape(y.shape[0], rows, cols, -1).permute(0, 3, 1, 2).contiguous()
                for y in intermediates
            ]
        if return_prefix_tokens and self.num_prefix_tokens:
            intermediates = list(zip(intermediates, prefix))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(
        self,
        indices: int | list[int] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> list[int]:
        """Drop what the requested intermediates do not need (timm's feature extraction)."""
        take, _ = feature_take_indices(self.num_intermediates, indices)
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take


def _pool_layout(op: str, global_pool: str | None, class_token: bool | None) -> tuple[str, bool]:
    """Fill in the operator's default pooling and class token (:data:`DEFAULT_LAYOUT`)."""
    default_pool, default_token = DEFAULT_LAYOUT.get(op, DEFAULT_LAYOUT["mha"])
    if global_pool is None and class_token is None:
        global_pool = default_pool
    elif global_pool is None:
        global_pool = "token" if class_token else "avg"  # a class token asked for is what is pooled
    if class_token is None:
        class_token = True if global_pool == "token" else default_token
    return global_pool, class_token


def _check_pool(global_pool: str, class_token: bool) -> None:
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f"unknown global_pool {global_pool!r}: expected one of {GLOBAL_POOLS}")
    if global_pool == "token" and not class_token:
        raise ValueError("global_pool='token' needs class_token=True")
