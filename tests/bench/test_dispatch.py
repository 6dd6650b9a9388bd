"""The fused path's budgets, counted on the CPU (ssog.bench.dispatch): kernels per call on the
CUDA path (over fake CUDA tensors; backward passes over real CPU tensors, the same ops), ATen
ops against attention on the CPU, host synchronisations, graph breaks under torch.compile and
what autograd keeps for the backward pass."""
from __future__ import annotations

import collections

import pytest
import timm
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ssog  # noqa: F401  (registers the models)
from ssog.bench.dispatch import count_dispatches
from ssog.layers import MultiHeadAttention, SSoGAttention
from ssog.ops import ssog_mix

# The operator bench's shape: batch 4, 12 heads, head_dim 64 (D = 768), 4 atoms, a class token.
BATCH, DIM, HEADS = 4, 768, 12
GRIDS = (14, 32, 64)
FAMILIES = ("ssog_vit_micro_patch1_8", "ssog_loopvit_micro_patch1_8", "ssog_odevit_micro_patch1_8")


def tokens(grid: int, **factory) -> torch.Tensor:
    return torch.randn(BATCH, 1 + grid * grid, DIM, **factory)


@pytest.mark.parametrize("grid", GRIDS)
def test_the_fused_layer_and_op_within_their_kernel_budgets_on_cuda(grid):
    with FakeTensorMode():
        layer = SSoGAttention(DIM, HEADS, device="cuda", dtype=torch.float16)
        x = tokens(grid, device="cuda", dtype=torch.float16, requires_grad=True)
        _, training = count_dispatches(lambda: layer(x, (grid, grid)))
        layer.eval()
        with torch.no_grad():
            layer(x, (grid, grid))
            _, inference = count_dispatches(lambda: layer(x, (grid, grid)))
        v = torch.empty(BATCH, HEADS, grid * grid, DIM // HEADS, device="cuda", dtype=torch.float16)
        mu, sigma = torch.zeros(HEADS, 4, 2, device="cuda"), torch.ones(HEADS, 4, 2, device="cuda")
        weight = torch.full((HEADS, 4), 0.25, device="cuda")
        _, public = count_dispatches(lambda: ssog_mix(v, mu, sigma, weight, (grid, grid)))
    assert training.kernels <= 8 and inference.kernels <= 8 and public.kernels <= 3, (training, inference, public)
    assert training.host_syncs == inference.host_syncs == public.host_syncs == 0
    assert "ssog::fixed_mix.default" in public.ops  # the values checked on the device, not the host
    assert "aten::_assert_async.msg" in public.ops


@pytest.mark.slow
@pytest.mark.parametrize("grid", GRIDS)
def test_the_fused_layer_backward_within_its_kernel_budget(grid):
    layer = SSoGAttention(DIM, HEADS)
    out = layer(tokens(grid, requires_grad=True), (grid, grid)).sum()
    _, backward = count_dispatches(out.backward)
    assert backward.kernels <= 20 and backward.host_syncs == 0, backward
    assert sum(op.startswith("ssog::") for op in backward.ops) == 3  # values', tables' and parameters' gradients


def test_the_layer_dispatches_no_more_aten_ops_than_attention_on_the_cpu():
    counts = {}
    for mixer in (MultiHeadAttention, SSoGAttention):
        torch.manual_seed(0)
        layer = mixer(DIM, HEADS)
        x = tokens(14, requires_grad=True)
        out, forward = count_dispatches(lambda layer=layer, x=x: layer(x, (14, 14)))
        loss = out.sum()
        _, backward = count_dispatches(loss.backward)
        layer.eval()
        with torch.no_grad():
            layer(x, (14, 14))
            _, inference = count_dispatches(lambda layer=layer, x=x: layer(x, (14, 14)))
        counts[mixer] = [len(c.ops) for c in (forward, backward, inference)]
        assert forward.host_syncs == backward.host_syncs == inference.host_syncs == 0
    assert all(s <= m for s, m in zip(counts[SSoGAttention], counts[MultiHeadAttention])), counts


@pytest.mark.parametrize("name", FAMILIES)
def test_the_families_build_their_tables_once_per_forward_without_host_syncs(name):
    model = timm.create_model(name)
    channels = model.pretrained_cfg["input_size"][0]
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to("cuda")
        images = torch.empty(2, channels, 8, 8, device="cuda")
        _, count = count_dispatches(lambda: model(images))
    applications = collections.Counter(op for op in count.ops if op.startswith("ssog::"))
    assert count.host_syncs == 0, count
    mixers = sum(isinstance(m, SSoGAttention) for m in model.modules())
    assert applications["ssog::layer_tables.default"] == mixers  # once per layer and forward pass
    assert applications["ssog::fixed_mix.default"] >= mixers


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("training", [True, False])
def test_compile_records_each_family_in_one_graph_with_the_fused_ops(name, training):
    torch._dynamo.reset()
    model = timm.create_model(name).train(training)
    images = torch.randn(2, model.pretrained_cfg["input_size"][0], 8, 8)
    with torch.set_grad_enabled(training):
        explained = torch._dynamo.explain(model)(images)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    targets = collections.Counter(str(node.target) for node in explained.graphs[0].graph.nodes)
    mixers = sum(isinstance(m, SSoGAttention) for m in model.modules())
    assert targets["ssog.layer_tables.default"] == mixers and targets["ssog.fixed_mix.default"] >= 1


def saved_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of ``layer(x)``, but
    the layer's parameters (kept by reference, not made by the call)."""
    parameters = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        layer(x, (14, 14))
    return sum(storages.values())


def test_the_fused_layer_keeps_less_for_backward_than_attention():
    x = tokens(14, requires_grad=True)
    ssog_bytes = saved_bytes(SSoGAttention(DIM, HEADS), x)
    attention_bytes = saved_bytes(MultiHeadAttention(DIM, HEADS), x)
    # SSoG keeps its input, the values and the mixed tokens (the projections' inputs) and the small
    # tables; attention its input, q, k and v, the output and the softmax statistics
    token_bytes = x.numel() * x.element_size()
    assert ssog_bytes < 3.1 * token_bytes, ssog_bytes / token_bytes
    assert ssog_bytes < 0.75 * attention_bytes, (ssog_bytes, attention_bytes)
