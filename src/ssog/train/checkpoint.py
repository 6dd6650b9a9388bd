"""Checkpoints: the whole training state in one safetensors file, written atomically.

A checkpoint is a nested state (model and EMA weights, optimizer, scheduler, scaler, RNG
states, progress counters, the run's config) stored as a single ``.safetensors`` file:
every tensor becomes one entry named by its path in the state (``model/blocks.0.mlp.fc1.weight``,
``optimizer/state/3/exp_avg``; :data:`MODEL_KEY` and :data:`SEPARATOR` follow
:data:`ssog.models.weights.CHECKPOINT_MODEL_PREFIX`, which reads them), and the rest of the
structure is JSON in the file's metadata. One file means one atomic ``os.replace``: a run killed while saving leaves the
previous checkpoint intact, never a mix of two. Loading never unpickles anything.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Mapping

import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from ssog.files import replacing
from ssog.models.weights import CHECKPOINT_MODEL_PREFIX

__all__ = [
    "FORMAT", "MODEL_KEY", "SEPARATOR", "save_checkpoint", "save_checkpoints", "load_checkpoint",
    "read_checkpoint_info", "check_stored_config", "checkpoint_path", "FILE_KEYS",
]

FORMAT = "ssog-checkpoint-v1"
_META_KEY = "ssog_state"
#: The state's entry of the model weights, and the separator of a tensor's path in the state:
#: the model's tensors are stored as ``CHECKPOINT_MODEL_PREFIX + <parameter name>``.
MODEL_KEY, SEPARATOR = CHECKPOINT_MODEL_PREFIX[:-1], CHECKPOINT_MODEL_PREFIX[-1]


def _join(path: str, key: Any) -> str:
    return f"{path}{SEPARATOR}{key}" if path else str(key)


def _encode(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON skeleton of ``obj``; tensors and arrays are moved into ``tensors`` under ``path``."""
    if isinstance(obj, torch.Tensor):
        # A private contiguous CPU copy: safetensors refuses shared or strided storage.
        tensors[path] = obj.detach().to("cpu", copy=True).contiguous()
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        tensors[path] = torch.from_numpy(obj.astype(np.int64) if obj.dtype == np.uint32 else obj.copy())
        return {"__ndarray__": path, "dtype": str(obj.dtype)}
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, _join(path, i), tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, _join(path, k), tensors) for k, v in obj.items()}
        return {"__items__": [[k, _encode(v, _join(path, k), tensors)] for k, v in obj.items()]}
    raise TypeError(f"cannot store {type(obj).__name__} at {path!r} in a checkpoint")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        return tensors[obj["__ndarray__"]].numpy().astype(obj["dtype"])
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {k: _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically (:func:`ssog.files.replacing`: a temporary file in
    the same folder, renamed over the old one; a full disk leaves the old file and a one-line
    :class:`~ssog.files.WriteError`).

    The :data:`MODEL_KEY` (and ``ema``) entries must be flat state dicts: their tensors are
    stored as ``model/<parameter name>``, readable by any safetensors tool.
    """
    return save_checkpoints({path: state})[0]


def save_checkpoints(states: Mapping[str | Path, dict[str, Any]]) -> list[Path]:
    """Write several checkpoints (a run's ``best`` and ``last``) so that they change together:
    every one is written to its temporary before any replaces its file, so a full disk or an
    error leaves all of them as they were. Returns the paths."""
    paths = [Path(path) for path in states]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(*paths) as temporaries:
        for tmp, state in zip(temporaries, states.values()):
            tensors: dict[str, torch.Tensor] = {}
            skeleton_json = json.dumps(_encode(state, "", tensors))
            # Serialised in memory and written by Python, not by safetensors' save_file: its
            # errors (a full disk) are then OSErrors naming the cause.
            data = save_safetensors(tensors, metadata={"format": "pt", "ssog_format": FORMAT,
                                                       _META_KEY: skeleton_json})
            del tensors
            with open(tmp, "xb") as handle:
                handle.write(data)
            del data  # one serialised checkpoint in memory at a time
    return paths


def load_checkpoint(path: str | Path, *, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint`; ``only`` restricts it to some top-level keys.

    Header and data are read through one file handle. Not ``safetensors.safe_open``: its
    torch tensors reopen the file by name, so a reader racing a run that replaces the
    checkpoint (``ssog eval`` on a training run, a progress poller) could pair one
    version's header with the next version's data. One handle always sees one version,
    since writers replace the file and never write into it. Tensor data is only read when
    the requested keys hold tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    with open(path, "rb") as handle:
        metadata = _read_metadata(handle, path)
        if metadata.get("ssog_format") != FORMAT:
            raise ValueError(
                f"{path} is not an ssog training checkpoint (format {metadata.get('ssog_format')!r}, "
                f"expected {FORMAT!r}); plain weight files are accepted by --init-from"
            )
        try:
            skeleton = json.loads(metadata[_META_KEY])
        except (KeyError, TypeError, ValueError, RecursionError) as error:
            raise ValueError(f"checkpoint {path} has no readable ssog state in its metadata "
                             f"({type(error).__name__}: {error})") from None
        if not isinstance(skeleton, dict):
            raise ValueError(f"checkpoint {path} is corrupt: its ssog state is a {type(skeleton).__name__}, "
                             "not a mapping")
        check_stored_config(skeleton.get("config"), path)
        if only is not None:
            skeleton = {k: v for k, v in skeleton.items() if k in only}
        tensors = {}
        if _holds_tensors(skeleton):
            try:
                handle.seek(0)  # the whole file in one read: no second copy to join the parts
                tensors = load_safetensors(handle.read())
            except Exception as error:  # safetensors raises its own error type
                raise ValueError(f"checkpoint {path} is truncated or corrupt ({error})") from error
    try:
        return _decode(skeleton, tensors)
    except (KeyError, TypeError) as error:
        raise ValueError(f"checkpoint {path} is corrupt: its state names a missing tensor {error}") from error
    except RecursionError:
        raise ValueError(f"checkpoint {path} is corrupt: its state is nested too deeply") from None


def _read_metadata(handle: BinaryIO, path: Path) -> dict[str, Any]:
    """The ``__metadata__`` of the safetensors file open in ``handle`` (a mapping; empty if none),
    read without trusting its header: a length beyond the file or JSON nested too deeply is a
    ValueError naming ``path``, not an OverflowError, MemoryError or RecursionError."""
    size = os.fstat(handle.fileno()).st_size
    try:
        (header_size,) = struct.unpack("<Q", handle.read(8))
        if header_size > size - 8:
            raise ValueError(f"its header claims {header_size:,} bytes of a {size:,}-byte file")
        header = json.loads(handle.read(header_size))
        metadata = header.get("__metadata__") or {}
        if not isinstance(metadata, dict):
            raise ValueError(f"its metadata is a {type(metadata).__name__}, not a mapping")
    except (struct.error, ValueError, AttributeError, RecursionError) as error:
        reason = "JSON nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise ValueError(f"checkpoint {path} is truncated or not a safetensors file ({reason})") from None
    return metadata


#: ``model_kwargs`` (at any depth) that make timm open a file or download one: a checkpoint, a
#: pretrained config's file, URL or hub id. A stored config that sets one is refused.
FILE_KEYS = ("checkpoint_path", "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "file",
             "url", "hf_hub_id", "hf_hub_filename")


def check_stored_config(config: Any, path: str | Path) -> None:
    """Raise ValueError unless ``config`` (a checkpoint's stored run config, or None) is a
    mapping whose ``model_kwargs`` name no file or URL (:data:`FILE_KEYS`, a value with ``://``):
    a checkpoint is data, and reading one never makes ssog open what it says."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise ValueError(f"checkpoint {path} is corrupt: its stored config is a {type(config).__name__}, "
                         "not a mapping")
    kwargs = config.get("model_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"checkpoint {path} is corrupt: its stored model_kwargs are a {type(kwargs).__name__}, "
                         "not a mapping")
    found = _file_settings(kwargs, "model_kwargs")
    if found:
        raise ValueError(f"checkpoint {path}: its stored config sets {found[0]}, which names a file or URL to "
                         "read; a run's stored config never does (refused: not written by ssog train)")


def _file_settings(value: Any, where: str) -> list[str]:
    """The dotted names under ``where`` of :data:`FILE_KEYS` and URL values in ``value``."""
    if isinstance(value, dict):
        return [name for key, item in value.items()
                for name in ([f"{where}.{key}"] if key in FILE_KEYS else _file_settings(item, f"{where}.{key}"))]
    if isinstance(value, (list, tuple)):
        return [name for i, item in enumerate(value) for name in _file_settings(item, f"{where}[{i}]")]
    return [where] if isinstance(value, str) and "://" in value else []


def _holds_tensors(skeleton: Any) -> bool:
    if isinstance(skeleton, dict):
        return "__tensor__" in skeleton or "__ndarray__" in skeleton or any(map(_holds_tensors, skeleton.values()))
    if isinstance(skeleton, list):
        return any(map(_holds_tensors, skeleton))
    return False


def read_checkpoint_info(path: str | Path) -> dict[str, Any]:
    """The JSON part of a checkpoint (config, progress, metrics), read from its header only."""
    return load_checkpoint(path, only=("config", "progress", "metrics", "kind"))


def checkpoint_path(run_or_file: str | Path, name: str = "last") -> Path:
    """``DIR/<name>.safetensors`` for a run folder, or the file itself."""
    path = Path(run_or_file)
    if path.is_dir():
        candidate = path / f"{name}.safetensors"
        if candidate.is_file():
            return candidate
        others = sorted(p.name for p in path.glob("*.safetensors"))
        if others:
            raise FileNotFoundError(
                f"the run folder {path} has no {candidate.name} (it holds {', '.join(others)}); "
                f"pass one of those files, e.g. {path / others[0]}"
            )
        raise FileNotFoundError(
            f"{path} holds no checkpoint: expected a run folder of ssog train (last.safetensors, "
            f"best.safetensors) or a .safetensors file"
        )
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path
