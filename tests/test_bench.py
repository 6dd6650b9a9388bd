"""Tests of the inference benchmark: measurement helpers, sweep, results files, plots, CLI."""
from __future__ import annotations

import pytest
import torch

from ssog.bench import is_out_of_memory, peak_memory, tensor_bytes, time_callable
from ssog.bench.timing import TimingStats, resolve_device

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


def test_tensor_bytes_counts_shared_storage_once():
    weight = torch.zeros(10, 10)
    assert tensor_bytes([weight, weight.t(), weight[0]]) == 400


def test_is_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    cpu_oom = RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
    assert is_out_of_memory(cpu_oom)
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))
