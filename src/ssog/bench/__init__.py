"""Inference benchmarks: throughput and peak memory of models and of the token mixers.

- :mod:`ssog.bench.timing` and :mod:`ssog.bench.memory`: the measurement helpers shared by
  every benchmark mode (median/quartiles of per-iteration times; allocator peak memory on
  CPU and CUDA; out-of-memory detection).
"""
from ssog.bench.memory import is_out_of_memory, module_bytes, peak_memory, tensor_bytes
from ssog.bench.timing import TimingStats, resolve_device, synchronize, time_callable, time_interleaved

__all__ = [
    "TimingStats",
    "is_out_of_memory",
    "module_bytes",
    "peak_memory",
    "resolve_device",
    "synchronize",
    "tensor_bytes",
    "time_callable",
    "time_interleaved",
]
