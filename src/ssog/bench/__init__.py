"""Inference benchmarks: throughput and peak memory.

- :mod:`ssog.bench.timing`: per-iteration times with median and quartiles, interleaved timing
  of several callables; their clock and the allocator peak memory on CPU and CUDA are
  :mod:`ssog.measure`'s, which ``ssog train --dry-run`` reports too.
- :mod:`ssog.bench.sweep`: the model sweep of ``ssog bench`` (family x op x width x
  resolution x batch size); :mod:`ssog.bench.results` its files; :mod:`ssog.bench.report`
  SSoG/MHA ratios; :mod:`ssog.bench.plots` the paper's Fig. 1, 4 and 5.
- :mod:`ssog.bench.operator`: the token mixer alone against SDPA (``ssog bench-op``).
"""
from ssog.measure import peak_memory, tensor_bytes
from ssog.runtime import is_out_of_memory
from ssog.bench.timing import TimingStats, quartiles, resolve_device, synchronize, time_callable, time_interleaved

__all__ = [
    "TimingStats",
    "is_out_of_memory",
    "peak_memory",
    "quartiles",
    "resolve_device",
    "synchronize",
    "tensor_bytes",
    "time_callable",
    "time_interleaved",
]
