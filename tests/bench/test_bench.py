"""Tests of the inference benchmark: measurement helpers, sweep, results files, plots, CLI."""
from __future__ import annotations

import csv
import json
import sys
from collections import Counter

import pytest
import torch

from ssog.bench import is_out_of_memory, peak_memory, tensor_bytes, time_callable, time_interleaved
from ssog.bench.plots import plot_results
from ssog.bench.report import comparison_table, paired_points
from ssog.bench.results import BenchResults, environment
from ssog.bench.sweep import SweepConfig, _groups, model_name, run_model_sweep
from ssog.bench.timing import TimingStats, quartiles, resolve_device
from ssog.cli import main
from ssog.layers import MultiHeadAttention

MB = 1_000_000


# --------------------------------------------------------------------- timing / memory


def test_time_callable_counts_warmup_and_iterations():
    calls = []
    stats = time_callable(lambda: calls.append(1), warmup=3, iters=5)
    assert len(calls) == 8
    assert len(stats.samples) == 5
    assert stats.min <= stats.q1 <= stats.median <= stats.q3 <= stats.max


def test_timing_stats_summary():
    stats = TimingStats((4.0, 1.0, 3.0, 2.0, 5.0))
    assert stats.median == 3.0
    assert (stats.q1, stats.q3) == (2.0, 4.0)
    assert stats.to_dict()["iters"] == 5
    single = TimingStats((0.5,))
    assert single.q1 == single.median == single.q3 == 0.5
    assert quartiles([3.0, 1.0, 2.0]) == (1.5, 2.0, 2.5)


@pytest.mark.parametrize("kwargs", [{"warmup": -1}, {"iters": 0}])
def test_time_callable_rejects_bad_counts(kwargs):
    with pytest.raises(ValueError, match="warmup|iters"):
        time_callable(lambda: None, **kwargs)


@pytest.mark.parametrize("device", ["tpu", "nonsense"])
def test_resolve_device_rejects_unknown(device):
    with pytest.raises(ValueError, match="device"):
        resolve_device(device)


def test_peak_memory_cpu_counts_allocator_peak_and_resident():
    def work():
        a = torch.ones(MB // 4)  # 1 MB
        b = torch.ones(2 * MB // 4)  # 2 MB, live together with a: peak 3 MB
        del a
        c = torch.ones(MB // 8)  # 0.5 MB while b is live: 2.5 MB < 3 MB
        return b, c

    resident = torch.ones(MB // 16)  # 0.25 MB; its view must not count twice
    assert peak_memory(work, device="cpu") == 3 * MB
    assert peak_memory(work, device="cpu", resident=[resident, resident[:5]]) == 3 * MB + MB // 4


def test_peak_memory_cpu_keeps_the_profilers_lines_off_stderr_and_nothing_else(run_child):
    """Only the profiler's own start/stop lines are dropped: what the measured call writes to
    file descriptor 2, and everything after, still arrives, also when the call raises."""
    code = (
        "import os, sys, torch\n"
        "from ssog.bench import peak_memory\n"
        "def work():\n"
        "    os.write(2, b'inside\\n')\n"
        "    return torch.ones(1000)\n"
        "peak_memory(work)\n"
        "def broken():\n"
        "    raise KeyError('boom')\n"
        "try:\n"
        "    peak_memory(broken)\n"
        "except KeyError:\n"
        "    os.write(2, b'after\\n')\n"
    )
    result = run_child([sys.executable, "-c", code], 300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.splitlines() == ["inside", "after"]


def test_tensor_bytes_counts_shared_storage_once():
    weight = torch.zeros(10, 10)
    assert tensor_bytes([weight, weight.t(), weight[0]]) == 400


def test_is_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    cpu_oom = RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
    assert is_out_of_memory(cpu_oom)
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))


@pytest.mark.parametrize("names,iters", [("a", 3), ("ab", 9), ("abcd", 25), ("abcdefg", 40)])
def test_time_interleaved_runs_each_callable_once_a_round_after_each_other_equally_often(names, iters):
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in names}
    n = len(names)
    stats = time_interleaved(fns, warmup=1, iters=iters)
    assert order[: 2 * n] == list(names) * 2  # warmup, then the first round in the given order
    rounds = [order[i : i + n] for i in range(n, len(order), n)]
    assert len(rounds) == iters and all(sorted(r) == list(names) for r in rounds)
    # over the whole timed sequence, round boundaries included, every callable ran right after
    # every other one equally often (within one), and never right after itself
    transitions = Counter(zip(order[n:], order[n + 1 :]))
    if n > 1:
        counts = [transitions[a, b] for a in names for b in names if a != b]
        assert max(counts) - min(counts) <= 1 and not any(transitions[a, a] for a in names)
    assert {name: len(s.samples) for name, s in stats.items()} == {name: iters for name in names}


# --------------------------------------------------------------------- sweep

COLUMNS = [
    "family", "op", "size", "model", "dim", "params_m", "resolution", "tokens", "batch_size", "device",
    "dtype", "mode", "status", "images_per_s", "latency_ms", "latency_ms_q1", "latency_ms_q3", "peak_memory_mib",
    "gflops_per_image", "attention_gflops_per_image", "speedup", "speedup_q1", "speedup_q3",
]
# The "micro" preset (8x8 single-channel images, patch 1) keeps every point to milliseconds.
TINY = dict(size="micro", resolutions=(4, 8), batch_sizes=(1, 2), width_sizes=(), warmup=1, iters=2, device="cpu")


@pytest.fixture(scope="module")
def sweep_results():
    config = SweepConfig(families=("vit", "odevit"), **{**TINY, "width_sizes": ("micro", "tiny")})
    seen = []
    results = run_model_sweep(config, on_row=seen.append)
    assert seen == results.rows
    return results


@pytest.mark.slow
def test_sweep_rows(sweep_results):
    rows = sweep_results.rows
    # 2 families x 2 resolutions x 2 batch sizes x 2 ops, plus the tiny width at 8 px, batch 1.
    assert len(rows) == 2 * 2 * 2 * 2 + 2 * 2
    assert all(list(row) == COLUMNS for row in rows)
    assert all(row["status"] == "ok" and row["images_per_s"] > 0 and row["peak_memory_mib"] > 0 for row in rows)
    micro = [row for row in rows if row["size"] == "micro"]
    # MHA models carry timm's class token; SSoG models pool by average without one.
    assert {(row["op"], row["resolution"], row["tokens"]) for row in micro} == {
        ("mha", 4, 1 + 16), ("mha", 8, 1 + 64), ("ssog", 4, 16), ("ssog", 8, 64),
    }
    assert {row["dim"] for row in micro} == {64}
    assert {(row["size"], row["resolution"], row["batch_size"]) for row in rows if row["size"] == "tiny"} == {
        ("tiny", 8, 1)
    }
    by_op = {(row["family"], row["op"], row["resolution"], row["batch_size"]): row for row in micro}
    for (family, op, resolution, batch), row in by_op.items():
        if op == "ssog":  # no query/key projections: fewer parameters and FLOPs than MHA
            mha = by_op[family, "mha", resolution, batch]
            assert row["params_m"] < mha["params_m"]
            assert row["attention_gflops_per_image"] < mha["attention_gflops_per_image"]
            assert row["model"] == f"ssog_{family}_micro_patch1_8"
    for (_family, op, _resolution, _batch), row in by_op.items():
        if op == "ssog":
            assert row["speedup_q1"] <= row["speedup"] <= row["speedup_q3"]
        else:
            assert row["speedup"] is None
    # Peak memory grows with the batch (the activations) on top of the same parameters.
    assert by_op["vit", "mha", 8, 2]["peak_memory_mib"] > by_op["vit", "mha", 8, 1]["peak_memory_mib"]


def test_results_files_round_trip(sweep_results, tmp_path):
    json_path, csv_path = sweep_results.save(tmp_path)
    with csv_path.open() as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == COLUMNS
    assert len(table) == len(sweep_results.rows)
    assert float(table[0]["images_per_s"]) == pytest.approx(sweep_results.rows[0]["images_per_s"])
    loaded = BenchResults.load(tmp_path)
    assert loaded.rows == sweep_results.rows and loaded.complete
    env = loaded.environment
    assert env["device"] == "cpu" and env["dtype"] == "fp32"
    assert env["torch"] == torch.__version__ and env["threads"] == 1  # conftest's one torch thread
    assert loaded.config["resolutions"] == [4, 8]


def test_environment_records_how_openmp_threads_wait(monkeypatch):
    monkeypatch.setenv("GOMP_SPINCOUNT", "123")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert environment(torch.device("cpu"), "fp32")["openmp_wait"] == {"GOMP_SPINCOUNT": "123"}


def _oom_after(tokens: int, error: Exception, calls: list):
    """A MultiHeadAttention.forward that runs out of memory above ``tokens`` tokens."""
    original = MultiHeadAttention.forward

    def forward(self, x, grid_size, **kwargs):
        if x.device.type != "meta":  # FLOP counting runs on the meta device
            calls.append(x.shape[1])
            if x.shape[1] > tokens:
                raise error
        return original(self, x, grid_size, **kwargs)

    return forward


@pytest.mark.slow
@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
    ],
    ids=["cuda", "cpu"],
)
def test_sweep_marks_oom_and_skips_larger_resolutions(monkeypatch, error):
    calls = []
    monkeypatch.setattr(MultiHeadAttention, "forward", _oom_after(17, error, calls))
    config = SweepConfig(families=("vit",), **{**TINY, "resolutions": (4, 8, 12), "batch_sizes": (1,)})
    rows = run_model_sweep(config).rows
    status = {(row["op"], row["resolution"]): row["status"] for row in rows}
    assert status == {
        ("mha", 4): "ok", ("mha", 8): "oom", ("mha", 12): "skipped",
        ("ssog", 4): "ok", ("ssog", 8): "ok", ("ssog", 12): "ok",
    }
    assert 1 + 12 * 12 not in calls  # the skipped resolution never ran
    skipped = next(row for row in rows if row["status"] == "skipped")
    assert skipped["images_per_s"] is None and skipped["peak_memory_mib"] is None


def test_sweep_propagates_other_errors(monkeypatch):
    monkeypatch.setattr(MultiHeadAttention, "forward", _oom_after(0, RuntimeError("shape mismatch"), []))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_model_sweep(SweepConfig(families=("vit",), **TINY))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"families": ("transformer",)}, "unknown families"),
        ({"ops": ()}, "ops must not be empty"),
        ({"size": "huge"}, "sizes registered"),
        ({"resolutions": (0, 8)}, "resolutions"),
        ({"resolutions": (4, 6), "size": "tiny"}, "not multiples of .* patch size 4"),
        ({"batch_sizes": (0,)}, "batch sizes"),
        ({"warmup": 0}, "warmup"),
        ({"dtype": "int8"}, "dtype"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_sweep_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        SweepConfig(**{**TINY, **overrides}).validate()


def test_width_sweep_points():
    """Fig. 1 widths run at the largest resolution only; the grid's width joins when its batch differs."""
    config = SweepConfig(families=("vit",), **{**TINY, "width_sizes": ("micro", "tiny"), "width_batch_size": 3})
    assert list(_groups(config)) == [
        ("vit", "micro", 4, (1, 2)), ("vit", "micro", 8, (1, 2)), ("vit", "micro", 8, (3,)), ("vit", "tiny", 8, (3,)),
    ]
    shared = SweepConfig(families=("vit",), **{**TINY, "width_sizes": ("micro", "tiny"), "width_batch_size": 2})
    assert [group[1:] for group in _groups(shared)][2:] == [("tiny", 8, (2,))]


def test_model_name_resolves_presets():
    assert model_name("ssog", "odevit", "base") == "ssog_odevit_base_patch16_224"
    assert model_name("mha", "loopvit", "tiny") == "mha_loopvit_tiny_patch4_32"


# --------------------------------------------------------------------- report / plots


def _row(op, resolution, batch, status="ok", speed=None, memory=None):
    return {
        "family": "vit", "op": op, "size": "small", "resolution": resolution, "batch_size": batch,
        "tokens": 1 + (resolution // 16) ** 2, "status": status, "images_per_s": speed, "peak_memory_mib": memory,
    }


def test_comparison_table_ratios_and_oom():
    rows = [
        _row("mha", 224, 4, speed=10.0, memory=200.0),
        _row("ssog", 224, 4, speed=15.0, memory=150.0),
        _row("mha", 448, 4, status="oom"),
        _row("ssog", 448, 4, speed=5.0, memory=300.0),
    ]
    pairs = paired_points(rows)
    assert pairs[0]["throughput_ratio"] == pytest.approx(1.5)
    assert pairs[0]["memory_ratio"] == pytest.approx(0.75)
    assert pairs[1]["throughput_ratio"] is None
    rows[1].update(speedup=1.4, speedup_q1=1.3, speedup_q3=1.6)
    table = comparison_table(rows).splitlines()
    assert len(table) == 4
    assert "| 1.50x | 1.40x [1.30, 1.60] |" in table[2] and "| 0.75x |" in table[2]
    assert "| OOM |" in table[3] and "| 5.00 |" in table[3]


@pytest.mark.slow
def test_plots_written(sweep_results, tmp_path):
    paths = plot_results(sweep_results, tmp_path)
    names = sorted(path.name for path in paths)
    assert names == sorted(f"{fig}.{ext}" for fig in ("fig1_width", "fig4_improvement", "fig5_scaling")
                           for ext in ("png", "pdf"))
    assert all(path.stat().st_size > 1000 for path in paths)


@pytest.mark.slow
def test_plots_with_oom_marks(tmp_path):
    rows = [
        {**_row("mha", 224, 4, speed=10.0, memory=200.0), "gflops_per_image": 4.6, "attention_gflops_per_image": 1.4},
        {**_row("ssog", 224, 4, speed=15.0, memory=150.0), "gflops_per_image": 3.8, "attention_gflops_per_image": 0.7},
        {**_row("mha", 448, 4, status="oom"), "gflops_per_image": 19.0, "attention_gflops_per_image": 7.0},
        {**_row("ssog", 448, 4, speed=5.0, memory=300.0), "gflops_per_image": 14.0, "attention_gflops_per_image": 2.4},
        {**_row("mha", 224, 8, status="oom"), "gflops_per_image": 4.6, "attention_gflops_per_image": 1.4},
        {**_row("ssog", 224, 8, speed=12.0, memory=250.0), "gflops_per_image": 3.8, "attention_gflops_per_image": 0.7},
    ]
    results = BenchResults({}, {"size": "small"}, rows)
    paths = plot_results(results, tmp_path)
    assert sorted(path.name for path in paths) == sorted(
        f"{fig}.{ext}" for fig in ("fig4_improvement", "fig5_scaling") for ext in ("png", "pdf")
    )


def test_plot_results_rejects_results_without_grid_rows(tmp_path):
    with pytest.raises(ValueError, match="no rows of the sweep's width 'base'"):
        plot_results(BenchResults({}, {"size": "base"}, [_row("mha", 224, 4, speed=1.0, memory=1.0)]), tmp_path)


def test_load_rejects_foreign_json(tmp_path):
    (tmp_path / "results.json").write_text('{"results": []}')
    with pytest.raises(ValueError, match="not a benchmark results file"):
        BenchResults.load(tmp_path)


# --------------------------------------------------------------------- command line

CLI_TINY = ["--size", "micro", "--families", "vit", "--resolutions", "4", "8", "--batch-sizes", "1",
            "--width-sizes", "--warmup", "1", "--iters", "2", "--device", "cpu"]


@pytest.mark.slow
def test_cli_bench_writes_results_and_plots(tmp_path, capsys):
    assert main(["bench", *CLI_TINY, "--output", str(tmp_path)]) == 0
    for name in ("results.json", "results.csv", "summary.md", "fig5_scaling.png", "fig5_scaling.pdf",
                 "fig4_improvement.png", "fig4_improvement.pdf"):
        assert (tmp_path / name).is_file(), name
    assert "| vit | micro | 8 | 65 | 1 |" in capsys.readouterr().out
    for path in tmp_path.glob("fig*"):
        path.unlink()
    assert main(["bench", "--plot", str(tmp_path / "results.json")]) == 0
    assert (tmp_path / "fig5_scaling.pdf").is_file()


@pytest.mark.slow
def test_size_governs_the_whole_sweep(tmp_path):
    """--size micro alone measures micro models only: not the preset's width sweep (ViT-S, M)."""
    assert main(["bench", "--size", "micro", "--families", "vit", "--ops", "ssog", "--resolutions", "8",
                 "--batch-sizes", "1", "--warmup", "1", "--iters", "1", "--device", "cpu", "--no-plots",
                 "--output", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {row["size"] for row in rows} == {"micro"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--resolutions", "0"], "resolutions must be positive"),
        (["--size", "huge"], "no unique timm model"),
        (["--warmup", "0"], "warmup >= 1"),
        (["--device", "tpu"], "device"),
        (["--threads", "0"], "--threads must be positive"),
        (["--plot", "/nonexistent/results"], "no benchmark results"),
    ],
)
def test_cli_bench_rejects_bad_arguments(args, message, tmp_path, capsys):
    assert main(["bench", *CLI_TINY, "--output", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["--families", "transformer"], ["--mode", "serve"]])
def test_cli_bench_rejects_unknown_choices(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_sweep_bf16_autocast():
    config = SweepConfig(families=("loopvit",), **{**TINY, "resolutions": (4,), "batch_sizes": (2,), "dtype": "bf16"})
    results = run_model_sweep(config)
    assert results.environment["dtype"] == results.config["dtype"] == "bf16"
    assert [(row["dtype"], row["status"]) for row in results.rows] == [("bf16", "ok")] * 2


def test_train_mode_times_optimisation_steps(monkeypatch, tmp_path, capsys):
    """Each timed call is forward + backward + optimizer step; the step changes the weights,
    and the optimizer's state is counted as resident memory."""
    from ssog.bench import sweep

    steps = []
    original = sweep._train_step

    def counted_step(model, optimizer, *args):
        before = next(model.parameters()).detach().clone()
        original(model, optimizer, *args)
        steps.append(not torch.equal(before, next(model.parameters())))

    monkeypatch.setattr(sweep, "_train_step", counted_step)
    assert main(["bench", *CLI_TINY, "--resolutions", "4", "--mode", "train", "--no-plots",
                 "--output", str(tmp_path)]) == 0
    rows = BenchResults.load(tmp_path).rows
    assert [(row["op"], row["mode"], row["status"]) for row in rows] == [
        ("mha", "train", "ok"), ("ssog", "train", "ok")
    ]
    assert all(row["images_per_s"] > 0 and row["peak_memory_mib"] > 0 for row in rows)
    assert rows[1]["speedup"] > 0
    # per model: 1 warmup + 2 timed + 1 peak-memory step, each one changing the weights
    assert steps == [True] * 2 * (1 + 2 + 1)
    inference = run_model_sweep(SweepConfig(families=("vit",), **{**TINY, "resolutions": (4,), "batch_sizes": (1,)}))
    train_memory = {row["op"]: row["peak_memory_mib"] for row in rows}
    for row in inference.rows:
        assert row["mode"] == "inference" and row["peak_memory_mib"] < train_memory[row["op"]]


def test_an_interrupted_sweep_keeps_its_points_and_summarises_them(monkeypatch, tmp_path, capsys):
    """Ctrl-C during the second point: the first is on disk, summarised, and the output said k/N."""
    from ssog.bench import sweep

    calls = []

    def timing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return time_interleaved(*args, **kwargs)

    monkeypatch.setattr(sweep, "time_interleaved", timing)
    args = ["bench", *CLI_TINY, "--resolutions", "4", "--batch-sizes", "1", "2", "--no-plots"]
    assert main([*args, "--output", str(tmp_path)]) == 130
    out, err = capsys.readouterr()
    assert "1/2: vit micro, 4 px, batch 1 done" in out and "2/2" not in out
    assert "Interrupted after 1 of 2 points" in err and "ssog bench: interrupted" in err
    results = BenchResults.load(tmp_path)
    assert not results.complete
    assert [(row["op"], row["batch_size"], row["status"]) for row in results.rows] == [
        ("mha", 1, "ok"), ("ssog", 1, "ok")
    ]
    with (tmp_path / "results.csv").open() as handle:
        assert [row["batch_size"] for row in csv.DictReader(handle)] == ["1", "1"]
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("Interrupted after 1 of 2 points") and "| vit | micro | 4 | 17 | 1 |" in summary


def test_scaling_plot_shows_the_throughputs_quartiles_as_error_bars(tmp_path, monkeypatch):
    from matplotlib.container import ErrorbarContainer

    from ssog.bench import plots

    def timed(op, resolution, q1, median, q3):  # latencies in ms of a batch of 4
        return {**_row(op, resolution, 4, speed=4e3 / median, memory=100.0), "latency_ms": median,
                "latency_ms_q1": q1, "latency_ms_q3": q3}

    rows = [timed("mha", 224, 90.0, 100.0, 125.0), timed("ssog", 224, 40.0, 50.0, 80.0),
            timed("mha", 448, 380.0, 400.0, 500.0), timed("ssog", 448, 150.0, 200.0, 250.0)]
    assert plots.throughput_spread(rows[0]) == pytest.approx((40.0 - 32.0, 4e3 / 90.0 - 40.0))
    assert plots.throughput_spread(_row("mha", 224, 4, speed=1.0, memory=1.0)) is None
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, stem: figures.append(fig) or [])
    plots.plot_scaling(rows, tmp_path / "fig5", error_bars=True)
    plots.plot_scaling(rows, tmp_path / "fig5")
    with_bars, without = (fig.axes[0] for fig in figures)
    bars = [c for c in with_bars.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2 and not without.containers
    (mha_segments,) = bars[0].lines[2]
    low, high = mha_segments.get_segments()[0][:, 1]
    assert (low, high) == pytest.approx((32.0, 4e3 / 90.0))  # images/s at the latency's third and first quartile
