"""The run folder's rules: what a run writes there and owns (:data:`RUN_FILES`), how it
claims the folder (a lock, ``overwrite``) and how a run's ``config.yaml`` is told from a
user's recipe. File-system policy only: no torch here (docs/training.md, "Who owns a run
folder").
"""
from __future__ import annotations

import os
import secrets
import shutil
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any, Collection, Mapping

import yaml

from ssog.files import FolderLock, is_temporary, write_atomic

__all__ = [
    "CONFIG_HEADER", "RUN_FILES", "RUN_MARKER", "check_output", "check_resumable", "claim_run_folder",
    "default_output", "is_run_config", "refuse_run_file", "saved_no_checkpoint",
]

#: A file every run writes in its folder with its ``config.yaml``: the folder's
#: ``config.yaml`` is then a run's, never a user's recipe.
RUN_MARKER = ".ssog-run"
#: What a run writes in its folder, and all it ever replaces or (with ``overwrite``) removes
#: there; every other file is the user's. Its temporaries are named ``.<one of these>.*.ssog-tmp*``.
RUN_FILES = ("config.yaml", "environment.json", "last.safetensors", "best.safetensors", "log.jsonl", "log.csv",
             "curves.png", "summary.json", "tensorboard", "wandb", RUN_MARKER)
#: First line of the config.yaml a run writes; runs written before :data:`RUN_MARKER`
#: existed are told by it.
CONFIG_HEADER = "# ssog train: the resolved configuration of the run in this folder\n"
#: The marker's text: what the file is, for a user who finds it.
_MARKER_TEXT = "this folder holds an ssog training run (ssog train); its files are listed in docs/training.md\n"


def default_output() -> Path:
    """``runs/<timestamp>-<6 random hex digits>``: runs started in the same second never share a folder."""
    return Path("runs") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def is_run_config(path: Path, config_fields: Collection[str] = ()) -> bool:
    """Whether ``path`` is the config.yaml of a run, not a user's recipe that a run would replace.

    A run's folder holds :data:`RUN_MARKER`; runs written before it start their config.yaml
    with :data:`CONFIG_HEADER`; runs older still (before the header) wrote a full dump of the
    config naming this folder, told by its keys: at least 30, all of ``config_fields`` (the
    names of the config's fields, none of a recipe's ``base``/``variants``).
    """
    if (path.parent / RUN_MARKER).is_file():
        return True
    try:
        text = path.read_text()
        if text.startswith(CONFIG_HEADER):
            return True
        values = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return (isinstance(values, dict) and not {"base", "variants"} & set(values)
            and set(values) <= set(config_fields) and len(values) >= 30
            and values.get("output") is not None and Path(values["output"]).resolve() == path.parent.resolve())


#: Why a run folder in which :func:`saved_no_checkpoint` finds no checkpoint cannot be resumed.
_NO_CHECKPOINT = ("that run saved no checkpoint (last.safetensors is written at every epoch's end, and every "
                  "--checkpoint-every N optimizer steps)")


def saved_no_checkpoint(run: Path, config_fields: Collection[str] = ()) -> bool:
    """Whether ``run`` holds a run (its ``config.yaml`` is a run's) that has neither
    ``last.safetensors`` nor ``summary.json``: stopped, or still running, before its first checkpoint."""
    config = run / "config.yaml"
    return (config.is_file() and not (run / "last.safetensors").exists() and not (run / "summary.json").exists()
            and is_run_config(config, config_fields))


def refuse_run_file(path: str | Path, option: str, reading: Collection[str | Path] = ()) -> None:
    """Raise ValueError when ``path`` (a file a command is about to write, given as ``option``)
    is a file a run owns (one of :data:`RUN_FILES` of a run's folder, :func:`is_run_config`, or
    inside one of them) or one of the files ``reading`` (the command's inputs): such a file is
    never replaced, ``--overwrite`` or not."""
    path = Path(path).expanduser().resolve()
    for given in reading:
        if Path(given).expanduser().resolve() == path:
            raise ValueError(f"{option} {path} is the file this command reads ({given}); write to another file")
    for folder in path.parents:
        if path.relative_to(folder).parts[0] in RUN_FILES and is_run_config(folder / "config.yaml"):
            raise ValueError(f"{option} {path} is a file of the run in {folder}, which is never replaced; "
                             "write to another file")


def check_resumable(run: Path) -> None:
    """Raise ValueError when ``run`` holds a run that saved no checkpoint yet, saying how to start it again."""
    if saved_no_checkpoint(run):
        raise ValueError(f"--resume {run}: {_NO_CHECKPOINT}, so there is nothing to resume (if it still runs, its "
                         f"first checkpoint is to come); start it again with --config {run / 'config.yaml'} "
                         f"--output {run} --overwrite")


def check_output(output: Path, resuming: bool, overwrite: bool = False, config_fields: Collection[str] = ()) -> None:
    """Raise ValueError unless a new run (or the resumed one) can be written to ``output``.

    A new run refuses a folder that holds files of another run (:data:`RUN_FILES`) unless
    ``overwrite``, and a ``config.yaml`` that is not a run's (a recipe; :func:`is_run_config`
    with ``config_fields``) always.
    """
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is an existing file, not a folder; choose another --output")
    if not resuming and output.is_dir():
        config = output / "config.yaml"
        if config.is_file() and not is_run_config(config, config_fields):
            raise ValueError(f"--output {output} holds a config.yaml that is not a run's (a recipe?), which the run "
                             "would replace; choose another --output")
        found = [name for name in RUN_FILES if (output / name).exists()]
        if found and not overwrite:
            if "last.safetensors" in found:
                hint = f"continue it with --resume {output}, "
            elif saved_no_checkpoint(output, config_fields):
                hint = f"{_NO_CHECKPOINT}, so it cannot be resumed; "
            else:
                hint = ""
            raise ValueError(f"{output} already holds a run ({', '.join(found)}): {hint}choose another --output, "
                             "or pass --overwrite to replace that run's files")
    existing = next(parent for parent in (output, *output.parents) if parent.exists())
    if not existing.is_dir():
        raise ValueError(f"--output {output}: {existing} is a file, not a folder; choose another --output")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--output {output}: {existing} is not writable; choose another --output")


def claim_run_folder(output: Path, config: Mapping[str, Any], resuming: bool, overwrite: bool = False) -> FolderLock:
    """Create and lock the run folder, check it again under the lock (another run may have
    used it meanwhile), clear this run's leftovers (and, with ``overwrite``, an earlier run's
    files), and write ``config.yaml`` (``config``, the resolved
    configuration, whose keys are the config's fields) and :data:`RUN_MARKER`. Returns the held lock."""
    created = not output.exists()
    try:
        output.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(output, "training run")
    except FileExistsError as error:
        raise ValueError(str(error)) from None
    except OSError as error:  # e.g. a read-only file system, which os.access may not tell
        raise ValueError(f"cannot write the run folder {output}: {error.strerror or error}") from error
    try:
        check_output(output, resuming, overwrite, config_fields=config.keys())
        ours = tuple(f".{name}." for name in RUN_FILES)
        for entry in output.iterdir():
            if is_temporary(entry) and entry.name.startswith(ours):  # left by a run killed while saving
                entry.unlink()
            elif overwrite and not resuming and entry.name in RUN_FILES:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        write_atomic(output / "config.yaml", CONFIG_HEADER + yaml.safe_dump(dict(config), sort_keys=False))
        write_atomic(output / RUN_MARKER, _MARKER_TEXT)
    except BaseException:
        lock.release()
        if created:
            with suppress(OSError):
                output.rmdir()  # only if empty: it was created for this run
        raise
    return lock
