"""``ssog.convert``: timm ViTs (DeiT distilled, registers) with every attention made SSoG; and the
same conversion of attention weights on their way into an SSoG model (``--init-from``)."""
from __future__ import annotations

import copy
import re

import pytest
import timm
import torch

import ssog
from ssog import SSoGAttention


def _converted(name: str, **kwargs):
    torch.manual_seed(0)
    # The architecture of `name` on 64 px images (a 4x4 grid): the same weights, a cheap test.
    original = timm.create_model(name, pretrained=False, img_size=64, num_classes=5, **kwargs).eval()
    before = {k: v.clone() for k, v in original.state_dict().items()}
    return ssog.convert(original, num_atoms=2), before


@pytest.mark.parametrize("name,kwargs,prefix", [
    ("vit_tiny_patch16_224", {}, 1),
    ("deit_tiny_distilled_patch16_224", {}, 2),
    ("vit_tiny_patch16_224", {"reg_tokens": 4}, 5),
])
def test_convert_keeps_every_weight_that_applies(name, kwargs, prefix):
    model, before = _converted(name, **kwargs)
    mixers = [block.attn for block in model.blocks]
    assert all(isinstance(m, SSoGAttention) and m.num_prefix_tokens == prefix for m in mixers)
    after = model.state_dict()
    dim = model.embed_dim
    for i in range(len(mixers)):
        attn = f"blocks.{i}.attn."
        assert torch.equal(after[attn + "v.weight"], before[attn + "qkv.weight"][2 * dim:])
        assert torch.equal(after[attn + "v.bias"], before[attn + "qkv.bias"][2 * dim:])
        assert torch.equal(after[attn + "proj.weight"], before[attn + "proj.weight"])
    kept = [k for k in before if ".attn." not in k]
    assert kept and all(torch.equal(after[k], before[k]) for k in kept)  # embeddings, tokens, norms, MLPs, heads
    with torch.no_grad():
        logits = model(torch.randn(2, 3, 64, 64))
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()


def test_prefix_tokens_as_the_operator_defines_them():
    model, _ = _converted("deit_tiny_distilled_patch16_224")
    captured = {}
    model.blocks[0].attn.register_forward_hook(lambda m, args, out: captured.update(x=args[0], out=out))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
        mixer, x = model.blocks[0].attn, captured["x"]
        matrix = mixer.attention_matrix(x, (4, 4))
        values = mixer.v(x)
        # A prefix query's output is the mean of the patch values.
        torch.testing.assert_close(
            captured["out"][:, :2], mixer.proj(values[:, 2:].mean(1, keepdim=True)).expand(-1, 2, -1)
        )
    assert torch.all(matrix[:, :, :, :2] == 0)  # no query reads a prefix token


def _small_vit(**kwargs):
    """A 2-block width-32 timm ViT on 32 px images of 8 px patches (a 4x4 grid)."""
    torch.manual_seed(0)
    args = dict(pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    return timm.create_model("vit_tiny_patch16_224", **{**args, **kwargs})


def _kernel_gradients(model):
    """Summed |gradient| of each block's kernel parameters after one backward pass."""
    model(torch.randn(2, 3, 32, 32)).logsumexp(-1).sum().backward()
    grads = []
    for block in model.blocks:
        params = (block.attn.mu, block.attn.rho, block.attn.logits)
        grads.append(sum(0.0 if p.grad is None else p.grad.abs().sum().item() for p in params))
    return grads


def test_class_token_pooling_trains_no_last_kernel_and_says_so(ssog_log):
    model = ssog.convert(_small_vit(), num_atoms=2)
    [warning] = [r for r in ssog_log.records if r.name == "ssog.conversion"]
    assert warning.levelname == "WARNING"
    message = warning.getMessage()
    assert "vit_tiny_patch16_224" in message and "last block's kernels get no gradient" in message
    assert "global_pool='avg'" in message
    first, last = _kernel_gradients(model)
    assert first > 0 and last == 0


def test_convert_can_pool_the_patches_instead(ssog_log):
    vit = _small_vit()
    head = vit.head.weight.detach().clone()
    model = ssog.convert(vit, num_atoms=2, global_pool="avg")
    assert not [r for r in ssog_log.records if r.name == "ssog.conversion"]
    assert model.global_pool == "avg" and torch.equal(model.head.weight, head)  # the head is kept
    assert all(grad > 0 for grad in _kernel_gradients(model))


def test_convert_pools_only_where_the_head_follows_global_pool():
    with pytest.raises(ValueError, match="expected None or one of"):
        ssog.convert(_small_vit(), global_pool="token")
    distilled = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, depth=1)
    with pytest.raises(ValueError, match="reads its class and distillation tokens"):
        ssog.convert(distilled, global_pool="avg")


def test_converted_copies_take_their_grid_from_their_own_images():
    """The grid hook of a deep copy (an EMA model) sets the copy's mixers, on a non-square grid."""
    model = ssog.convert(_small_vit(img_size=(32, 48), global_pool="avg"), num_atoms=2).eval()
    copied = copy.deepcopy(model)
    with torch.no_grad():
        torch.testing.assert_close(copied(torch.ones(1, 3, 32, 48)), model(torch.ones(1, 3, 32, 48)))
    assert copied.blocks[0].attn.grid_size == (4, 6)


def test_convert_keeps_a_scale_norm():
    vit = _small_vit(scale_attn_norm=True, global_pool="avg")
    norm = vit.blocks[0].attn.norm
    model = ssog.convert(vit)
    assert model.blocks[0].attn.norm is norm
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


def test_convert_rejects_what_it_cannot_keep():
    with pytest.raises(ValueError, match="takes a timm VisionTransformer"):
        ssog.convert(torch.nn.Linear(2, 2))
    model, _ = _converted("vit_tiny_patch16_224")
    with pytest.raises(ValueError, match="no attention mask"):
        model.blocks[0].attn(torch.randn(1, 17, model.embed_dim), attn_mask=torch.ones(17, 17, dtype=torch.bool))


def test_init_from_timm_builds_the_converted_model():
    from ssog.train import TrainConfig
    from ssog.train.builders import build_model

    cfg = TrainConfig(init_from="timm:vit_tiny_patch16_224", model_kwargs={"num_atoms": 2}, dataset="synthetic",
                      img_size=32)
    assert cfg.model == "vit_tiny_patch16_224"  # what logs, summary.json and config.yaml name
    model = build_model(cfg, num_classes=4, in_chans=3, img_size=32)
    assert type(model).__name__ == "VisionTransformer" and model.num_classes == 4
    assert all(isinstance(block.attn, SSoGAttention) and block.attn.num_atoms == 2 for block in model.blocks)
    with pytest.raises(ValueError, match="model 'ssog_vit_tiny_patch4_32' would be ignored; leave model unset"):
        TrainConfig(model="ssog_vit_tiny_patch4_32", init_from="timm:vit_tiny_patch16_224")
    bad = TrainConfig(init_from="timm:no_such_vit", dataset="synthetic")
    with pytest.raises(ValueError, match="timm has no model 'no_such_vit'"):
        build_model(bad, num_classes=4, in_chans=3, img_size=32)



def _timm_vit_weights(path):
    """A small random timm ViT (class token, 16 patches of 8 px) and its plain weights file."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                            depth=2, num_heads=2, num_classes=5).eval()
    save_file(vit.state_dict(), str(path))
    return vit


def _ssog_vit(**layout):
    """The SSoG ViT of ``_timm_vit_weights``'s architecture, with ``layout``."""
    return timm.create_model("ssog_vit_tiny_patch4_32", patch_size=8, embed_dim=32, depth=2, num_heads=2,
                             num_classes=5, **layout).eval()


def test_init_from_attention_weights_converts_them_as_convert_does(tmp_path, ssog_log):
    from ssog.train import init_from_checkpoint

    vit = _timm_vit_weights(tmp_path / "vit.safetensors")
    model = _ssog_vit(class_token=True, global_pool="token")
    init_from_checkpoint(model, tmp_path / "vit.safetensors", keep_head=True)
    [note] = [r.getMessage() for r in ssog_log.records if r.name == "ssog.train.transfer"]
    assert "attention converted to SSoG (6 kernel tensors at their initialisation)" in note
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ssog.convert(vit)(x), rtol=0, atol=1e-6)

    with pytest.raises(ValueError, match="has a class token and this one has none.*class_token: true"):
        init_from_checkpoint(_ssog_vit(), tmp_path / "vit.safetensors")


def test_cli_fine_tunes_an_ssog_model_from_an_mha_run(tmp_path, capsys, tiny_config):
    from ssog.cli import main
    from ssog.train import train

    mha = tiny_config(tmp_path / "mha", model="mha_vit_micro_patch1_8", epochs=1)
    train(mha)
    capsys.readouterr()
    layout = {**mha.model_kwargs, "class_token": True, "global_pool": "token"}
    args = ["train", "--model", "ssog_vit_micro_patch1_8", "--init-from", str(tmp_path / "mha"),
            "--dataset", "synthetic", "--img-size", "8", "--epochs", "1", "--batch-size", "16",
            "--augment", "none", "--no-progress", "--output", str(tmp_path / "ssog"),
            "--set", "synthetic_size=64", "--set", "synthetic_classes=4", "--set", "init_keep_head=true"]
    args += [a for k, v in layout.items() for a in ("--set", f"model_kwargs.{k}={v}")]
    assert main(args) == 0
    assert "head loaded; attention converted to SSoG" in capsys.readouterr().out


def test_init_from_timm_without_its_pretrained_weights_is_an_error(monkeypatch):
    from ssog.train import TrainConfig
    from ssog.train.builders import build_model

    real = timm.create_model

    def offline(name, pretrained=False, **kwargs):
        if pretrained:
            raise ConnectionError("no network")
        return real(name, pretrained=False, **kwargs)

    monkeypatch.setattr(timm, "create_model", offline)
    cfg = TrainConfig(init_from="timm:vit_tiny_patch16_224", dataset="synthetic", img_size=32)
    with pytest.raises(ValueError, match="init_from timm:vit_tiny_patch16_224: cannot load timm's pretrained "
                                         "weights .*ConnectionError: no network"):
        build_model(cfg, num_classes=4, in_chans=3, img_size=32, load_timm_weights=True)
    assert build_model(cfg, num_classes=4, in_chans=3, img_size=32).num_classes == 4  # a resume needs none


def test_attn_layer_learns_the_grid_and_prefix_tokens_from_the_model():
    """timm's ViT built with attn_layer=SSoGAttention on a non-square image, with register tokens and
    dynamic_img_size: follow_model_grid makes its layers take each image's grid and the model's prefix count."""
    from ssog.layers import follow_model_grid

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, attn_layer=SSoGAttention, img_size=(32, 48),
                              patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, reg_tokens=4,
                              dynamic_img_size=True, global_pool="avg").eval()
    with pytest.raises(ValueError, match=r"follow_model_grid\(model\)"):  # 24 patches + 5 prefix: no square
        model(torch.randn(1, 3, 32, 48))
    mixers = follow_model_grid(model)
    assert len(mixers) == 2 and all(m.num_prefix_tokens == 5 for m in mixers)
    images = torch.randn(2, 3, 32, 48)
    assert model(images).shape == (2, 5) and mixers[0].grid_size == (4, 6)
    # the grid is each image's: another size under dynamic_img_size, the same result as a grid given by hand
    other = torch.randn(1, 3, 40, 24)
    assert model(other).shape == (1, 5) and mixers[0].grid_size == (5, 3)
    seen = []
    hook = mixers[0].register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
    model(other)
    hook.remove()
    tokens, out = seen[0]
    torch.testing.assert_close(mixers[0](tokens, grid_size=(5, 3)), out)
    with pytest.raises(ValueError, match="takes a timm ViT"):
        follow_model_grid(torch.nn.Linear(2, 2))


def test_attn_layer_without_the_models_grid_refuses_where_a_square_would_fit():
    """4 register tokens and a 4x3 grid make 17 tokens: one class token and a 4x4 square would fit.
    A bare attn_layer refuses in one line naming follow_model_grid; once called, the layers mix
    each block's patch tokens on the 4x3 grid after the 5 prefix tokens."""
    from ssog.layers import follow_model_grid

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, attn_layer=SSoGAttention, img_size=(32, 24),
                              patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, reg_tokens=4,
                              global_pool="avg").eval()
    images = torch.randn(2, 3, 32, 24)
    with pytest.raises(ValueError, match=r"^SSoGAttention got 17 tokens and no token grid: .*"
                                         r"ssog\.layers\.follow_model_grid\(model\)"):
        model(images)
    mixers = follow_model_grid(model)
    seen = []
    hook = mixers[1].register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
    logits = model(images)
    hook.remove()
    tokens, out = seen[0]
    assert logits.shape == (2, 5) and tokens.shape[1] == 17 and mixers[1].num_prefix_tokens == 5
    by_hand = SSoGAttention(32, 2, num_prefix_tokens=5).eval()
    by_hand.load_state_dict(mixers[1].state_dict())
    torch.testing.assert_close(out, by_hand(tokens, grid_size=(4, 3)))


def test_convert_refuses_a_rope_model_naming_why():
    eva = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=56, num_classes=3)
    with pytest.raises(ValueError, match=r"cannot convert eva02_tiny_patch14_224 \(Eva\): its attention takes rotary "
                                         r"position embeddings \(RoPE\)"):
        ssog.convert(eva)
    assert not any(isinstance(m, SSoGAttention) for m in eva.modules())  # refused before anything changed


@pytest.mark.parametrize("name, kwargs, why", [
    ("beit_base_patch16_224", {}, "its attention adds relative position biases to the query-key scores"),
    ("vit_relpos_base_patch16_224", {}, "its attention adds relative position biases"),
    ("vit_srelpos_small_patch16_224", {}, "its attention adds relative position biases"),  # one bias shared by all
    ("cait_xxs24_224", {}, "its class-attention blocks (blocks_token_only) let the class token attend to the patches "
                           "by query and key"),
    ("vit_small_patch16_18x2_224", {}, "blocks.0 (ParallelThingsBlock) has no single attention attn to replace: "
                                       "its attention runs in parallel branches"),
    ("vit_small_patch16_224", {"block_fn": "ParallelScalingBlock"}, "blocks.0 (ParallelScalingBlock) has no single "
                                                                    "attention attn to replace"),
])
def test_convert_refuses_attention_it_cannot_replace_naming_why(name, kwargs, why):
    from timm.models import vision_transformer

    kwargs = {key: getattr(vision_transformer, value) for key, value in kwargs.items()}
    model = timm.create_model(name, pretrained=False, img_size=32, depth=2, embed_dim=64, num_heads=2, **kwargs)
    with pytest.raises(ValueError, match=rf"^convert\(\) cannot convert {name} \({type(model).__name__}\): "
                                         + re.escape(why)):
        ssog.convert(model)
    assert not any(isinstance(m, SSoGAttention) for m in model.modules())  # refused before anything changed


def test_convert_refuses_an_attention_holding_weights_ssog_has_no_place_for():
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2)
    model.blocks[1].attn.talk = torch.nn.Linear(3, 3)  # as CaiT's talking heads mix the heads' scores
    with pytest.raises(ValueError, match=r"blocks.1.attn \(Attention\) holds talk.bias, talk.weight, which SSoG has "
                                         r"no place for \(it keeps qkv's value slice and proj\)"):
        ssog.convert(model)
    assert not any(isinstance(m, SSoGAttention) for m in model.modules())
