"""``torch.compile(fullgraph=True)`` and ONNX export of the three families.

Compiled with the ``aot_eager`` backend: whole-graph capture by dynamo and the AOT autograd
graph are what can break (as torchdiffeq's data-dependent checks did); inductor's code
generation only adds minutes of C++ compilation on a CPU.
"""
from __future__ import annotations

import pytest
import timm
import torch

from ssog.export import export_onnx, missing_export_packages
from ssog.models import list_models  # noqa: F401  (registers the models)

FAMILIES = ("vit", "loopvit", "odevit")
SMALL = dict(embed_dim=16, num_heads=2)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("steer", [(), ("mu", "sigma", "lambda")], ids=["fixed", "steered"])
def test_compile_fullgraph_equals_eager(family, steer):
    torch.manual_seed(0)
    model = timm.create_model(f"ssog_{family}_micro_patch1_8", steer=steer, steer_gate_init=0.0, **SMALL)
    x = torch.randn(2, 1, 8, 8)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    outputs, grads = [], []
    for net in (model, compiled):
        model.zero_grad()
        out = net(x)
        out.square().sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
    for eager, comp in zip(*grads):
        torch.testing.assert_close(comp, eager, rtol=1e-4, atol=1e-6)


needs_export = pytest.mark.skipif(bool(missing_export_packages()),
                                  reason=f"ONNX export needs {', '.join(missing_export_packages())} (the export extra)")


@needs_export
@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_export_with_dynamic_batch_matches_eager(tmp_path, family):
    torch.manual_seed(0)
    model = timm.create_model(f"ssog_{family}_micro_patch1_8", **SMALL)
    result = export_onnx(model, tmp_path / "model.onnx", (1, 8, 8), batch_size=2)
    assert result["verified_batch_size"] == 3 and result["output_shape"] == [3, 10]
    assert result["max_abs_diff"] <= 1e-4


@needs_export
def test_cli_export_verifies_a_model(tmp_path, capsys):
    from ssog.cli import main

    output = tmp_path / "vit.onnx"
    assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--output", str(output)]) == 0
    assert output.is_file() and "onnxruntime on batch 3 matches PyTorch" in capsys.readouterr().out
