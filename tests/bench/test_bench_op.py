"""ssog bench-op: the operator benchmark harness (tiny shapes; no timing is asserted)."""
from __future__ import annotations

import json

import pytest

from ssog.bench.operator import OperatorConfig, run_operator_benchmark
from ssog.cli import main

TINY = ["--grids", "3", "5", "--batch", "1", "--heads", "2", "--head-dim", "4", "--rounds", "2", "--warmup", "0"]


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    assert main(["bench-op", *TINY, "--steered-grid", "4", "--output", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "operator.json").read_text())
    rows = payload["results"]
    expected = {(g, p, c) for g in (3, 5) for p in ("forward", "forward+backward")
                for c in ("sdpa", "auto", "dense", "separable", "local", "fused")}
    assert {(r["grid"], r["pass_"], r["candidate"]) for r in rows} == expected
    for row in rows:
        assert row["tokens"] == row["grid"] ** 2 and row["median_ms"] > 0 and row["peak_mib"] > 0
        if row["candidate"] == "sdpa":
            assert row["speedup_median"] == row["peak_ratio"] == row["footprint_ratio"] == 1.0
    assert {r["extra"]["picked"] for r in rows if r["candidate"] == "auto"} <= {"dense", "separable", "fused", "cpp"}
    assert payload["steered_memory"]["grid"] == 4 and payload["steered_memory"]["forward_peak_mib"] > 0
    assert payload["environment"]["threads"] >= 1
    assert (tmp_path / "operator_speedup.png").stat().st_size > 0
    assert "| 5 | 25 | forward | auto" in (tmp_path / "operator.md").read_text()
    assert "wrote" in capsys.readouterr().out


def test_dense_is_skipped_above_its_grid_limit():
    config = OperatorConfig(grids=(3, 5), batch=1, heads=1, head_dim=2, rounds=1, warmup=0,
                            backward=False, backends=("dense",), dense_max_grid=4)
    candidates = {(m.grid, m.candidate) for m in run_operator_benchmark(config, progress=lambda _: None)}
    assert candidates == {(3, "sdpa"), (3, "dense"), (5, "sdpa")}


@pytest.mark.parametrize("args,message", [
    (["--batch", "0"], "batch must be >= 1"),
    (["--grids", "0"], "grids must be positive"),
])
def test_bad_configuration_is_one_clear_line(args, message, tmp_path, capsys):
    assert main(["bench-op", *args, "--output", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_candidates_survive_more_grids_than_the_recompile_limit(monkeypatch):
    """Every grid and pass recompiles the same code; torch refuses a ninth recompilation under
    fullgraph=True. The eager backend keeps the test fast; the limit is the same for inductor."""
    import functools

    import torch
    import torch._dynamo.config

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    grids = tuple(range(2, 11))
    config = OperatorConfig(grids=grids, batch=1, heads=2, head_dim=4, rounds=1, warmup=0, backward=False,
                            backends=("separable",), compiled=("separable",))
    with torch._dynamo.config.patch(recompile_limit=8):  # torch's default; under pytest it is raised
        rows = run_operator_benchmark(config, progress=lambda _: None)
    assert [m.grid for m in rows if m.candidate == "compile:separable"] == list(grids)
    assert all(m.median_ms > 0 for m in rows)


def test_only_shape_static_backends_are_compiled():
    with pytest.raises(ValueError, match=r"cannot time \['cpp', 'local'\] under torch.compile"):
        OperatorConfig(compiled=("separable", "local", "cpp"))


def test_unknown_backend_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as error:
        main(["bench-op", "--backends", "flash"])
    assert error.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_steered_layer_comparison_writes_rows_for_mha_and_each_backend(tmp_path, capsys):
    from ssog.bench.operator import STEERED_LAYER_BACKENDS

    assert main(["bench-op", "--steered-layer", "3", "4", "--rounds", "2", "--warmup", "0",
                 "--output", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "steered_layer.json").read_text())["rows"]
    expected = {(g, c) for g in (3, 4) for c in ("mha", *(f"ssog-{b}" for b in STEERED_LAYER_BACKENDS))}
    assert {(r["grid"], r["candidate"]) for r in rows} == expected
    assert all(r["median_ms"] > 0 for r in rows)
    assert all(r["speedup_median"] == 1.0 for r in rows if r["candidate"] == "mha")
    assert "| 4 | 16 | ssog-local |" in (tmp_path / "steered_layer.md").read_text()
