"""Turn a timm VisionTransformer into an SSoG ViT, keeping every weight that still applies.

:func:`convert` replaces each block's self-attention with :class:`ConvertedAttention` (an
:class:`~ssog.layers.SSoGAttention` called as timm's blocks call attention). SSoG has a
value and an output projection but no query or key, so it keeps the value slice of ``qkv``
and ``proj``; the query/key slices (and ``q_norm``/``k_norm``) are dropped. Everything else
(patch and position embedding, class/register/distillation tokens, norms, MLPs, heads) is
untouched. Prefix tokens follow docs/operator.md: patch queries never read them, a prefix
query's output is the mean of the patch values.

:func:`convert_state_dict` does the same to weights on their way into an SSoG model of the
source's layout (``ssog train --init-from`` an MHA checkpoint or timm ViT weights file).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from .layers import SSoGAttention, kernel_scale_for_grid, named_mixers

__all__ = ["ConvertedAttention", "convert", "convert_state_dict"]


class ConvertedAttention(SSoGAttention):
    """``SSoGAttention`` with timm's attention call ``attn(x, attn_mask=None)``.

    The token grid is not an argument there: :func:`convert` sets :attr:`grid_size` from
    each input image before the blocks run (a forward pre-hook on ``patch_embed``).
    """

    grid_size: tuple[int, int] | None = None

    def forward(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("SSoG mixes by position and takes no attention mask")
        grid = grid_size if grid_size is not None else self.grid_size
        if grid is None:
            raise ValueError("the token grid is unknown: run the converted model, or pass grid_size=(Hg, Wg)")
        return super().forward(x, grid)


def convert(model: nn.Module, kernel_units: str = "image", **ssog_options: Any) -> nn.Module:
    """Replace every attention of the timm ``VisionTransformer`` ``model`` by SSoG, in place.

    Args:
        model: a timm ``VisionTransformer`` (ViT, DeiT and distilled DeiT, with registers...)
            whose blocks have ``attn.qkv`` and ``attn.proj``.
        kernel_units: ``"image"``: the initial kernel lengths are scaled by the model's token
            grid over 8, as in the ssog models (``kernel_units`` of
            :class:`~ssog.models._base.ViTBase`); ``"tokens"``: as given.
        **ssog_options: :class:`~ssog.layers.SSoGAttention` options (``num_atoms``,
            ``sigma_min``, ``steer``, ``centre_init``, ...).

    Returns:
        ``model``, its attentions now :class:`ConvertedAttention` with the value slice of
        ``qkv`` and the output projection copied; everything else keeps its weights.
    """
    blocks = getattr(model, "blocks", None)
    patch_embed = getattr(model, "patch_embed", None)
    if blocks is None or patch_embed is None or not hasattr(model, "num_prefix_tokens"):
        raise ValueError(f"convert() takes a timm VisionTransformer (blocks, patch_embed), got {type(model).__name__}")
    if getattr(model, "dynamic_img_size", False):
        raise ValueError("convert() needs a fixed token grid: build the timm model with dynamic_img_size=False")
    ssog_options = {"kernel_scale": kernel_scale_for_grid(patch_embed.grid_size, kernel_units), **ssog_options}
    mixers = []
    for index, block in enumerate(blocks):
        mixers.append(_convert_attention(block.attn, model.num_prefix_tokens, f"blocks.{index}.attn", ssog_options))
        block.attn = mixers[-1]

    def set_grid(_: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        height, width = inputs[0].shape[-2:]
        patch_h, patch_w = patch_embed.patch_size
        for mixer in mixers:
            mixer.grid_size = (height // patch_h, width // patch_w)

    patch_embed.register_forward_pre_hook(set_grid)
    return model


def convert_state_dict(
    state: Mapping[str, Tensor], model: nn.Module
) -> tuple[dict[str, Tensor], tuple[str, ...]]:
    """Weights of a ViT with attention, converted for ``model``, the same ViT with SSoG mixers.

    Every SSoG mixer ``NAME`` of ``model`` whose weights ``state`` holds as an attention's
    (``NAME.qkv.*``, ``NAME.proj.*``: timm's ViTs and the ``mha_*`` models) gets the value
    slice of ``qkv`` and ``proj``, as :func:`convert` gives them; the query and key slices (and
    ``q_norm``/``k_norm``) are dropped. Everything else is returned as it is.

    Returns:
        The converted weights, and the keys of ``model`` that the converted mixers take from
        no weight (kernel and steering parameters: they keep ``model``'s initialisation).
    """
    state = dict(state)
    target = model.state_dict()
    initialised: list[str] = []
    for name, mixer in named_mixers(model, SSoGAttention):
        prefix = f"{name}."
        if f"{prefix}qkv.weight" not in state:
            continue
        attention = {k[len(prefix):]: state.pop(k) for k in list(state) if k.startswith(prefix)}
        unknown = sorted(k for k in attention if not k.startswith(("qkv.", "proj.", "q_norm.", "k_norm.")))
        if unknown:
            raise ValueError(f"{name}: attention weights {unknown} have no place in an SSoG mixer")
        state.update({prefix + k: v for k, v in _ssog_projections(attention, mixer.dim, name).items()})
        initialised += [k for k in target if k.startswith(prefix) and k not in state]
    return state, tuple(initialised)


def _ssog_projections(attention: Mapping[str, Tensor], dim: int, name: str) -> dict[str, Tensor]:
    """SSoG's ``v.*`` and ``proj.*`` from one attention's ``qkv.*`` and ``proj.*`` weights.

    ``qkv.weight (3D, D)`` stacks query, key and value (timm's order), so the value
    projection is rows ``2D:3D`` (and of ``qkv.bias (3D,)``, if any). ``proj.weight (D, D)``
    is kept, with its bias or zeros (SSoG's output projection always has one).
    """
    qkv, proj = attention["qkv.weight"], attention.get("proj.weight")
    if proj is None or tuple(qkv.shape) != (3 * dim, dim) or tuple(proj.shape) != (dim, dim):
        raise ValueError(
            f"{name}: qkv {tuple(qkv.shape)} and proj {None if proj is None else tuple(proj.shape)} are not the "
            f"plain width-preserving attention of width {dim} that SSoG replaces"
        )
    out = {"v.weight": qkv[2 * dim:], "proj.weight": proj}
    if "qkv.bias" in attention:
        out["v.bias"] = attention["qkv.bias"][2 * dim:]
    out["proj.bias"] = attention.get("proj.bias", proj.new_zeros(dim))
    return out


def _convert_attention(
    attn: nn.Module, num_prefix_tokens: int, name: str, options: dict[str, Any]
) -> ConvertedAttention:
    qkv, proj = getattr(attn, "qkv", None), getattr(attn, "proj", None)
    if not isinstance(qkv, nn.Linear) or not isinstance(proj, nn.Linear):
        raise ValueError(f"{name} ({type(attn).__name__}) has no fused qkv and proj Linear layers to convert")
    if not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
        raise ValueError(f"{name} normalises its attention output (scale_norm), which SSoG cannot keep")
    dim = proj.in_features
    weights = {f"{layer}.{k}": v for layer in ("qkv", "proj") for k, v in getattr(attn, layer).state_dict().items()}
    projections = _ssog_projections(weights, dim, name)
    mixer = ConvertedAttention(
        dim, attn.num_heads, num_prefix_tokens=num_prefix_tokens, qkv_bias=qkv.bias is not None,
        proj_drop=getattr(attn.proj_drop, "p", 0.0), device=qkv.weight.device, dtype=qkv.weight.dtype,
        **options,
    )
    mixer.load_state_dict(projections, strict=False)  # the kernel parameters keep their initialisation
    return mixer
