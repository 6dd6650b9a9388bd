"""Recipe files: YAML with YAML 1.2's floats, ``base:`` inheritance, and ``key=value`` overrides.

The layout of a recipe (``base:``, ``variants:``) is described in :mod:`ssog.train.config`,
which resolves recipes into a :class:`~ssog.train.config.TrainConfig`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

try:  # libyaml's loader where PyYAML was built with it
    from yaml import CSafeLoader as _SafeLoader
except ImportError:
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

__all__ = ["load_recipe", "merge_settings", "parse_override", "read_yaml_values", "recipe_variants"]


def merge_settings(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override``'s settings: mappings merged key by key, other values replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_settings(merged[key], value)
        else:
            merged[key] = value
    return merged


class _RecipeLoader(_SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: ``1e-3`` and ``5e-1`` without a dot are
    numbers, as every recipe writer means, at any depth (``model_kwargs: {sigma_min: 5e-1}``);
    YAML 1.1, which PyYAML follows, reads them as strings."""


_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


#: The most values (mappings, lists and scalars, every alias counted as what it repeats) a
#: recipe or an override may hold: a recipe holds hundreds; YAML aliases nested a few levels
#: deep repeat a value billions of times, which every later step would walk.
MAX_YAML_VALUES = 100_000


def read_yaml_values(text: str) -> Any:
    """``text`` parsed as a recipe's YAML (safe, with YAML 1.2's floats: :class:`_RecipeLoader`);
    a :class:`yaml.YAMLError` when it holds more than :data:`MAX_YAML_VALUES` values with its
    aliases expanded, refers to itself, or nests too deeply."""
    values = yaml.load(text, Loader=_RecipeLoader)  # safe: a SafeLoader subclass
    try:
        size = _expanded_size(values, {}, set())
    except RecursionError:
        raise yaml.YAMLError("the YAML nests too deeply") from None
    if size > MAX_YAML_VALUES:
        raise yaml.YAMLError(f"with its aliases expanded the YAML holds more than {MAX_YAML_VALUES:,} values "
                             "(a recipe holds hundreds)")
    return values


def _expanded_size(value: Any, sizes: dict[int, int], open_ids: set[int]) -> int:
    """How many values ``value`` holds with every alias expanded, each shared list or mapping
    counted once per use but walked once (``sizes``, by id); a YAMLError if it contains itself."""
    if not isinstance(value, (list, dict)):
        return 1
    key = id(value)
    if key in sizes:
        return sizes[key]
    if key in open_ids:
        raise yaml.YAMLError("the YAML refers to itself (an alias inside its own anchor)")
    open_ids.add(key)
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    size = 1
    for item in items:
        size += _expanded_size(item, sizes, open_ids)
        if size > MAX_YAML_VALUES:
            break
    open_ids.discard(key)
    sizes[key] = size
    return size


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise IsADirectoryError(f"config file {path} is a folder, not a YAML file; give the recipe file itself "
                                "(e.g. configs/cifar10_tiny.yaml)")
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        data = read_yaml_values(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"config file {path} is not valid YAML: {_yaml_problem(error)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of settings, got {type(data).__name__}")
    return data


def load_recipe(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The settings of a recipe file with its ``base:`` files merged in (``variants`` kept)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ValueError(f"config inheritance cycle: {' -> '.join(str(p) for p in (*_seen, path))}")
    data = _read_yaml(path)
    bases = data.pop("base", None) or []
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        parent = load_recipe(path.parent / base, (*_seen, path))
        parent.pop("variants", None)  # variants belong to the file that declares them
        merged = merge_settings(merged, parent)
    return merge_settings(merged, data)


def recipe_variants(path: str | Path) -> list[str]:
    """Names of the variants a recipe declares (empty if it has none)."""
    return list(load_recipe(path).get("variants") or {})


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` or ``key.sub=value`` (value parsed as YAML) into ``(key, value)``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"override {text!r} must look like key=value (e.g. model_kwargs.depth=6)")
    try:
        return key.strip(), read_yaml_values(value)
    except yaml.YAMLError as error:
        raise ValueError(f"override {text!r}: the value is not valid YAML ({_yaml_problem(error)})") from None


def _yaml_problem(error: yaml.YAMLError) -> str:
    """One line from a YAML error: what went wrong and where (yaml's own text spans lines)."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem
