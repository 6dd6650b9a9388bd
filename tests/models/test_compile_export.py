"""Every export path of the three families: ``torch.compile(fullgraph=True)``,
``torch.jit.trace`` (at another image size too), ``torch.export`` with a dynamic batch and
with a dynamic image size, ONNX (at any image size too); and what cannot be recorded says so
in one line.

Compiled with the ``aot_eager`` backend: whole-graph capture by dynamo and the AOT autograd
graph are what can break (as torchdiffeq's data-dependent checks did); inductor's code
generation only adds minutes of C++ compilation on a CPU.
"""
from __future__ import annotations

import pytest
import timm
import torch

from ssog.export import dynamic_image_shapes, export_onnx, missing_export_packages
from ssog.layers import ssog_mixers
from ssog.models import list_models  # noqa: F401  (registers the models)

pytestmark = pytest.mark.slow  # seconds per test: torch.compile, ONNX and torch.export

FAMILIES = ("vit", "loopvit", "odevit")
SMALL = dict(embed_dim=16, num_heads=2)
STEERED = dict(steer=("mu", "sigma", "lambda"), steer_gate_init=0.0)
#: The mixers every export path must record: attention, fixed SSoG, steered SSoG (every part).
MIXERS = {"mha": ("mha", {}), "fixed": ("ssog", {}), "steered": ("ssog", STEERED)}


#: One block application per family (recording takes time in proportion to the graph).
ONE_APPLICATION = {"vit": dict(depth=1), "loopvit": dict(num_loops=1), "odevit": dict(nfe=1)}


def _model(family: str, mixer: str, preset: str = "micro_patch1_8", **kwargs):
    """A tiny model of ``family`` with ``mixer``, one block application unless ``kwargs`` say."""
    op, options = MIXERS[mixer]
    torch.manual_seed(0)
    size = {} if "solver" in kwargs or "nfe" in kwargs else ONE_APPLICATION[family]
    return timm.create_model(f"{op}_{family}_{preset}", **SMALL, **options, **{**size, **kwargs}).eval()


#: Patch 4 at 32 px (an 8x8 grid), RGB: the size a model is recorded at, and two others, one not square.
ANY_SIZE = "tiny_patch4_32"
OTHER_SIZES = ((16, 24), (48, 40))


#: Every SSoG mixing a family offers: fixed, steered, and (continuous only) kernels that move with t.
COMPILE_CASES = {f"{family}-{kind}": (family, options) for family in FAMILIES
                 for kind, options in (("fixed", {}), ("steered", STEERED))}
COMPILE_CASES["odevit-time_kernels"] = ("odevit", dict(time_kernels=True))


@pytest.mark.parametrize(("family", "options"), COMPILE_CASES.values(), ids=COMPILE_CASES.keys())
def test_compile_fullgraph_equals_eager(family, options):
    torch.manual_seed(0)
    model = timm.create_model(f"ssog_{family}_micro_patch1_8", **options, **SMALL)
    with torch.no_grad():  # away from the zero-initialised gates and maps, so every branch carries a signal
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
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
def test_onnx_export_of_a_steered_model_matches_eager(tmp_path):
    result = export_onnx(_model("vit", "steered"), tmp_path / "steered.onnx", (1, 8, 8))
    assert result["verified_batch_size"] == 3 and result["max_abs_diff"] <= 1e-4


@needs_export
def test_onnx_export_that_fails_its_check_leaves_no_file(tmp_path, monkeypatch):
    import ssog.export.onnx_file

    def mismatch(*args, **kwargs):
        raise RuntimeError("onnxruntime's output differs")

    monkeypatch.setattr(ssog.export.onnx_file, "verify_onnx", mismatch)
    with pytest.raises(RuntimeError, match="model.onnx: onnxruntime's output differs; nothing was written"):
        export_onnx(_model("vit", "mha"), tmp_path / "model.onnx", (1, 8, 8))
    assert list(tmp_path.iterdir()) == []
    # an earlier file (replaced only after the check passes) is kept, not deleted with the failed one
    (tmp_path / "model.onnx").write_bytes(b"an earlier export")
    with pytest.raises(RuntimeError, match="the earlier file is kept"):
        export_onnx(_model("vit", "mha"), tmp_path / "model.onnx", (1, 8, 8))
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
    assert (tmp_path / "model.onnx").read_bytes() == b"an earlier export"
    monkeypatch.undo()
    with pytest.raises(FileExistsError, match="model.onnx already exists"):
        export_onnx(_model("vit", "mha"), tmp_path / "model.onnx", (1, 8, 8), overwrite=False)


@needs_export
def test_onnx_export_of_an_adaptive_solver_refuses_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="cannot record the adaptive solver 'dopri5'"):
        export_onnx(_model("odevit", "fixed", solver="dopri5"), tmp_path / "model.onnx", (1, 8, 8))
    assert list(tmp_path.iterdir()) == []


@needs_export
def test_cli_export_verifies_a_model(tmp_path, capsys):
    from ssog.cli import main

    output = tmp_path / "vit.onnx"
    assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--img-size", "12", "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert output.is_file() and "(input (batch, 1, 12, 12), dynamic batch, kernels rescaled x1.5); onnxruntime on " \
        "batch 3 at 12x12 matches PyTorch" in out
    assert main(["export", "--model", "ssog_vit_digits_patch2_8", "--img-size", "7",
                 "--output", str(tmp_path / "7.onnx")]) == 2
    assert "--img-size must be a positive multiple of the patch size 2x2, got 7" in capsys.readouterr().err


@pytest.mark.skipif(bool(missing_export_packages()), reason="needs onnx and onnxruntime")
def test_export_at_another_size_rescales_the_kernels_as_eval_does_unless_told(tmp_path, capsys):
    import onnxruntime

    from ssog.cli import main
    from ssog.models import create_model
    from ssog.train.transfer import move_to_input_size

    images = torch.randn(2, 1, 16, 16)
    outputs = {}
    for flag in ("--rescale-kernels", "--no-rescale-kernels"):
        torch.manual_seed(0)  # the same random weights in the command's model and here
        output = tmp_path / f"{flag}.onnx"
        assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--img-size", "16", flag,
                     "--output", str(output)]) == 0
        session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
        outputs[flag] = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: images.numpy()})[0])
    assert "kernels rescaled x2" in capsys.readouterr().out
    torch.manual_seed(0)
    model = create_model("ssog_vit_micro_patch1_8").eval()
    tokens = model(images).detach()
    assert move_to_input_size(model, 16) == (2.0, True)  # what ssog eval --img-size 16 does by default
    rescaled = model(images).detach()
    assert (rescaled - tokens).abs().max() > 1e-4  # a random model's logits: small, but apart
    torch.testing.assert_close(outputs["--rescale-kernels"], rescaled, atol=1e-5, rtol=0)
    torch.testing.assert_close(outputs["--no-rescale-kernels"], tokens, atol=1e-5, rtol=0)
    # the default is eval's: rescaled
    torch.manual_seed(0)
    assert main(["export", "--model", "ssog_vit_micro_patch1_8", "--img-size", "16",
                 "--output", str(tmp_path / "default.onnx")]) == 0
    assert "kernels rescaled x2" in capsys.readouterr().out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_jit_trace_runs_at_another_batch_like_eager(family, mixer, grad):
    """A traced model is a graph of torch ops for any batch: no cached matrix, no cpp call,
    no block sizes, key windows or autograd.Function of the example (the matrix cache's key
    used to fail here with an INTERNAL ASSERT, the kernels' Function with unordered_map::at)."""
    model = _model(family, mixer)
    with torch.set_grad_enabled(grad):
        model(torch.randn(2, 1, 8, 8))  # eager first: a cached inference matrix must not leak into the graph
        traced = torch.jit.trace(model, torch.randn(2, 1, 8, 8))
        images = torch.randn(3, 1, 8, 8)
        torch.testing.assert_close(traced(images), model(images), rtol=1e-5, atol=1e-6)
        if mixer == "fixed":  # the graph reads the parameters, as eager does after a change
            with torch.no_grad():
                for module in ssog_mixers(model):
                    module.mu.add_(0.5)
            torch.testing.assert_close(traced(images), model(images), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mixer", MIXERS)
def test_torch_export_keeps_the_batch_dynamic_without_choosing_a_backend(family, mixer):
    """``auto`` used to weigh dense against separable by the example's batch (a guard that
    violated the dynamic batch); it now chooses from the grid alone under a symbolic batch."""
    model = _model(family, mixer)
    program = torch.export.export(model, (torch.randn(2, 1, 8, 8),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    images = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(program.module()(images), model(images), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family, mixer", [(family, mixer) for family in FAMILIES for mixer in ("mha", "fixed")]
                         + [("vit", "steered")])
def test_torch_export_with_a_dynamic_image_size_matches_eager_at_other_sizes(family, mixer):
    """Height and width as multiples of the patch: the grid is symbolic, the position embedding
    resampled in the graph, and the operator chooses its backend and blocks from no size
    (ssog.ops.capture.any_grid); it used to guard on the example's grid (``x.size()[2] // 4 == 8``)."""
    model = _model(family, mixer, ANY_SIZE)
    program = torch.export.export(model, (torch.randn(2, 3, 32, 32),), dynamic_shapes=dynamic_image_shapes(model))
    for batch, size in zip((3, 1), OTHER_SIZES):
        images = torch.randn(batch, 3, *size)
        torch.testing.assert_close(program.module()(images), model(images), rtol=1e-5, atol=1e-6)


def test_a_dynamic_image_size_needs_a_model_that_takes_any_size():
    model = timm.create_model("ssog_vit_micro_patch1_8", dynamic_img_size=False, **SMALL)
    assert dynamic_image_shapes(model, dynamic_size=False)[0].keys() == {0}
    with pytest.raises(ValueError, match="this ViT was built with dynamic_img_size=False: export it at one size"):
        dynamic_image_shapes(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_jit_trace_at_another_image_size_matches_eager(family, monkeypatch):
    """A trace is recorded at one size (documented as meant for that size); here not the preset's.
    torch.jit.trace records twice, with and then without autograd: at 64 px (a 16x16 grid) the
    fixed kernels' backend, and with small query chunks the steered chunks, used to depend on
    autograd ('Graphs differed across invocations')."""
    from ssog.ops import steered_backends

    monkeypatch.setattr(steered_backends, "STEERED_CHUNK_BYTES", 2**18)  # two query chunks without autograd
    for mixer in MIXERS:
        model = _model(family, mixer, ANY_SIZE)
        traced = torch.jit.trace(model, torch.randn(2, 3, 64, 64))
        images = torch.randn(3, 3, 64, 64)
        torch.testing.assert_close(traced(images), model(images), rtol=1e-5, atol=1e-6, msg=mixer)


@needs_export
def test_onnx_export_with_a_dynamic_image_size_runs_at_two_sizes(tmp_path):
    """Steered SSoG (per-query kernels on a symbolic grid) in onnxruntime at the traced size and another."""
    import onnxruntime

    model = _model("vit", "steered", ANY_SIZE)
    result = export_onnx(model, tmp_path / "any.onnx", (3, 16, 16), dynamic_size=True)
    assert result["verified_sizes"] == [[16, 16], [24, 20]] and result["max_abs_diff"] <= 1e-4
    session = onnxruntime.InferenceSession(str(tmp_path / "any.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", 3, "4*patch_rows", "4*patch_cols"]


@pytest.mark.parametrize("backend", ["separable", "local"])
def test_separable_blocks_sized_for_one_image_record_one_graph_for_every_batch(backend, monkeypatch):
    from ssog.ops import backends

    monkeypatch.setattr(backends, "SEPARABLE_BLOCK_BYTES", 2048)  # several blocks of query rows
    model = _model("vit", "fixed", backend=backend)
    example, images = torch.randn(2, 1, 8, 8), torch.randn(3, 1, 8, 8)
    traced = torch.jit.trace(model, example)
    program = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    for recorded in (traced, program.module()):
        torch.testing.assert_close(recorded(images), model(images), rtol=1e-5, atol=1e-6)


def test_what_cannot_be_recorded_says_what_to_use():
    images = torch.randn(2, 1, 8, 8)
    adaptive = _model("odevit", "fixed", solver="dopri5")
    for record in (lambda: torch.jit.trace(adaptive, images), lambda: torch.export.export(adaptive, (images,))):
        with pytest.raises(ValueError, match=r"cannot record the adaptive solver 'dopri5'.*configure_solver\('rk4'"):
            record()
    for mixer in ("mha", "fixed"):
        with pytest.raises(RuntimeError, match=r"torch.jit.script cannot compile .*torch.jit.trace\(model, images\)"):
            torch.jit.script(_model("vit", mixer))


def test_adjoint_models_trace_their_steps():
    model = _model("odevit", "fixed", adjoint=True)
    traced = torch.jit.trace(model, torch.randn(2, 1, 8, 8))
    images = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(traced(images), model(images), rtol=1e-5, atol=1e-6)


def test_adaptive_solver_through_timm_ignores_the_presets_nfe():
    model = timm.create_model("ssog_odevit_micro_patch1_8", solver="dopri5", rtol=1e-2, atol=1e-3, **SMALL)
    assert (model.solver, model.steps, model.rtol, model.atol) == ("dopri5", None, 1e-2, 1e-3)
    assert model.config()["nfe"] is None
    model(torch.randn(1, 1, 8, 8))
    assert model.nfe >= 6  # dopri5's evaluations follow the tolerances
    model.configure_solver("euler")
    assert model.config()["nfe"] == 4  # the preset's evaluations, for a fixed-step solver again
    with pytest.raises(ValueError, match="'dopri5' is adaptive: its evaluations follow rtol/atol, nfe cannot be set"):
        timm.create_model("ssog_odevit_micro_patch1_8", solver="dopri5", nfe=12)


def test_steering_state_dict_keeps_the_parameter_names():
    """``lambda`` steering lives under ``lambda_`` (torch.fx writes module paths as Python);
    checkpoints still name it ``lambda``, and old ones load."""
    model = _model("vit", "steered")
    keys = list(model.state_dict())
    assert "blocks.0.attn.steer_proj.lambda.weight" in keys and "blocks.0.attn.steer_gate.lambda" in keys
    assert not any("lambda_" in key for key in keys)
    other = _model("vit", "steered")
    other.load_state_dict(model.state_dict())
    for (name, a), b in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(a, b), name
