"""Benchmark results: rows of measurements plus the environment they were taken in.

Saved side by side as ``results.json`` (environment, configuration, rows, and whether the
sweep finished; what ``ssog bench --plot`` reads back) and ``results.csv`` (the rows only,
one per measured or skipped point, for spreadsheets and pandas).
"""
from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ssog.files import replacing

__all__ = ["BenchResults", "environment"]

JSON_NAME = "results.json"
CSV_NAME = "results.csv"
#: The stems of the figures :mod:`ssog.bench.plots` draws from the results (``.png`` and ``.pdf``).
FIGURES = ("fig5_scaling", "fig4_improvement", "fig1_width")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: torch.device, dtype: str) -> dict[str, Any]:
    """What a measurement depends on: device, dtype, library versions, threads, load."""
    import timm

    env: dict[str, Any] = {
        "device": str(device),
        "device_name": _device_name(device),
        "dtype": dtype,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "ssog": _package_version("ssog"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if device.type == "cpu":
        from ..ops import cpp_kernels

        # Whether auto could take the fused CPU kernels (and why not): inference speeds differ.
        env["cpp_backend"] = "available" if cpp_kernels.available() else cpp_kernels.unavailable_reason()
    # How OpenMP threads wait at barriers, where the user set it: on a shared CPU it decides
    # how much a busy neighbour costs (docs/bench.md, "Measuring on a shared CPU").
    env["openmp_wait"] = {name: os.environ[name] for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                          if name in os.environ}
    if hasattr(os, "getloadavg"):
        # The 1-minute load average before the run: other processes sharing the CPU.
        env["load_average_1min"] = round(os.getloadavg()[0], 2)
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
    return env


@dataclass
class BenchResults:
    """One model sweep: environment, configuration and rows.

    Each row is a flat dict with the same keys in the same order (the CSV columns).
    ``complete`` is false while a sweep runs and after it was interrupted: the rows are
    those of the points measured so far (files written before it existed say true).
    """

    environment: dict[str, Any]
    config: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = True

    @property
    def columns(self) -> list[str]:
        columns: dict[str, None] = {}
        for row in self.rows:
            columns.update(dict.fromkeys(row))
        return list(columns)

    def save(self, output_dir: str | os.PathLike) -> list[Path]:
        """Write ``results.json`` and ``results.csv`` into ``output_dir`` (created if needed)."""
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        json_path, csv_path = output_dir / JSON_NAME, output_dir / CSV_NAME
        payload = {
            "environment": self.environment,
            "config": self.config,
            "rows": self.rows,
            "complete": self.complete,
        }
        buffer = io.StringIO(newline="")
        writer = csv.DictWriter(buffer, fieldnames=self.columns)
        writer.writeheader()
        writer.writerows(self.rows)
        with replacing(json_path, csv_path) as (json_tmp, csv_tmp):
            json_tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
            csv_tmp.write_text(buffer.getvalue(), encoding="utf-8", newline="")
        return [json_path, csv_path]

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BenchResults":
        """Read a ``results.json`` file, or the one inside the directory ``path``."""
        path = Path(path)
        if path.is_dir():
            path = path / JSON_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"no benchmark results at {path} (expected a {JSON_NAME} or a directory holding one)"
            )
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
            return cls(payload["environment"], payload["config"], payload["rows"], payload.get("complete", True))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{path} is not a benchmark results file written by 'ssog bench': {error}") from error
