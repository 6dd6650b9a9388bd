"""``environment.json``: what a run ran with (versions, git commit, command, host), kept in its folder."""
from __future__ import annotations

import importlib.metadata
import json
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ssog.files import write_atomic

__all__ = ["ENVIRONMENT_FILE", "environment", "record_environment"]

ENVIRONMENT_FILE = "environment.json"
#: Packages whose versions a run records (those not installed are left out).
PACKAGES = ("ssog", "torch", "torchvision", "timm", "torchdiffeq", "numpy", "safetensors", "pillow", "datasets",
            "webdataset", "tensorboard", "wandb", "onnx", "onnxruntime")


def _git(*args: str) -> str | None:
    """``git args`` run in the ssog package's folder, or None (no git, or not a checkout)."""
    try:
        result = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def environment() -> dict[str, Any]:
    """Versions of Python and :data:`PACKAGES`, the git commit of the ssog source (and whether it
    had uncommitted changes) when it is a checkout, the command line, the host and the time."""
    import torch

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    # a commit only where the package's own files are tracked (an editable install of a checkout)
    commit = _git("rev-parse", "HEAD") if _git("ls-files", "--error-unmatch", "__init__.py") is not None else None
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ssog": versions.get("ssog"),
        "git_commit": commit,
        "git_dirty": bool(status) if status is not None else None,
        "python": platform.python_version(),
        "packages": versions,
        "cuda": torch.version.cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "command": list(sys.argv),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
    }


def record_environment(output: Path, resumed: bool) -> dict[str, Any]:
    """Write ``output/environment.json``: a new run's :func:`environment`; a resumed run adds
    its own to the ``resumes`` list, keeping what the run started with."""
    path = Path(output) / ENVIRONMENT_FILE
    current = environment()
    record = current
    if resumed and path.is_file():
        try:
            record = json.loads(path.read_text())
        except ValueError:  # unreadable: start the record again rather than lose the run
            record = {**current, "note": f"the earlier {ENVIRONMENT_FILE} could not be read"}
        else:
            record.setdefault("resumes", []).append(current)
    write_atomic(path, json.dumps(record, indent=2) + "\n")
    return record
