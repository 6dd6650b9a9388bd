"""The house rules of src/ssog (docs/architecture.md): the import rules are import-linter's
contracts in pyproject.toml (``lint-imports``), run here so that a broken rule fails the suite;
what import-linter cannot see is checked on the source: no module imports another's private
name, every public module says what it exports, torchdiffeq is used through its public API; and
the page's path of ``ssog train`` to the operator is the one a run takes."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from importlinter.api import read_configuration
from importlinter.application.use_cases import lint_imports

import ssog
from ssog.cli import main

PYPROJECT = str(Path(__file__).resolve().parents[2] / "pyproject.toml")
CONTRACTS = read_configuration(PYPROJECT)["contracts_options"]
SRC = Path(ssog.__file__).parent
MODULES = sorted(p for p in SRC.rglob("*.py"))


def test_the_import_contracts_hold(capsys):
    # What `lint-imports` runs, without its command line's logging.config.dictConfig, which
    # would disable every logger already made in this process (the ssog loggers among them).
    kept = lint_imports(config_filename=PYPROJECT, cache_dir=None, no_logo=True)
    report = capsys.readouterr().out
    assert kept, report
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in report, report


def test_the_operator_contract_forbids_every_other_dependency():
    """``torch-alone`` lists what ops and layers may not import: every package ssog depends on
    (core and extras, as installed; the dev tools aside) but torch and numpy, so a new
    dependency joins it."""
    contract, = [c for c in CONTRACTS if c["id"] == "torch-alone"]
    forbidden = set(contract["forbidden_modules"])
    top_level = importlib.metadata.packages_distributions()

    def key(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    for requirement in importlib.metadata.requires("ssog"):
        dist = key(re.match(r"[A-Za-z0-9_.-]+", requirement).group())
        if dist in ("torch", "numpy") or re.search(r"""extra == ["']dev["']""", requirement):
            continue
        names = {name for name, dists in top_level.items() if dist in map(key, dists)} or {dist.replace("-", "_")}
        assert names & forbidden, f"{requirement}: none of {sorted(names)} is in torch-alone's forbidden_modules"


def _name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(absolute ssog module, imported names)`` of every ``from ... import`` of ``path``."""
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module == "ssog" or module.startswith("ssog."):
            found.append((module, [alias.name for alias in node.names]))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_name_crosses_modules(path):
    own = _name(path)
    for module, names in _imports(path):
        private = [name for name in names if name.startswith("_") and not name.startswith("__")]
        assert module == own or not private, f"{own} imports {private} from {module}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_public_modules_declare_their_exports(path):
    public = not any(part.startswith("_") for part in path.relative_to(SRC).with_suffix("").parts) \
        or path.name == "__init__.py"
    if public and path.parent.name != "cli" and path.name != "__main__.py":
        tree = ast.parse(path.read_text())
        names = {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(target, ast.Name)}
        assert "__all__" in names, f"{path.relative_to(SRC)} has no __all__"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_torchdiffeq_is_used_through_its_public_api(path):
    """``from torchdiffeq import odeint``, never its private ``_impl`` (which moves between releases)."""
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        private = [name for name in names if name.startswith("torchdiffeq.")]
        assert not private, f"{path.relative_to(SRC)} imports {private}: use torchdiffeq's public odeint"


ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _path_section() -> str:
    text = ARCHITECTURE.read_text()
    start = text.index("## The path of `ssog train`")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_architecture_names_the_path_of_ssog_train(tmp_path, monkeypatch):
    """docs/architecture.md lists the ssog functions from ``main`` to the operator's first
    forward pass as a run takes them: the call stack when the first SSoG mixer is built,
    then the one when the fused ops first mix (comprehensions left out)."""
    section = _path_section()
    listed = re.findall(r"^\d+\. `([^`]+)`", section, flags=re.M)
    functions, files = map(int, re.search(r"(\d+) functions in (\d+) files", section).groups())
    stacks: dict[str, list[str]] = {}

    def ssog_stack(frame) -> list[str]:
        names = []
        while frame is not None:
            code = frame.f_code
            if code.co_filename.startswith(str(SRC)) and "<genexpr>" not in code.co_name:
                names.append(f"{Path(code.co_filename).relative_to(SRC)}:{code.co_qualname}")
            frame = frame.f_back
        return names[::-1]

    def watch(frame, event, arg) -> None:
        if event != "call":
            return
        where = Path(frame.f_code.co_filename)
        if "build" not in stacks and where == SRC / "layers" / "ssog_attention.py" \
                and frame.f_code.co_qualname == "SSoGAttention.__init__":
            stacks["build"] = ssog_stack(frame)
        if where == SRC / "ops" / "fused.py" and frame.f_code.co_name == "_mix":
            stacks["forward"] = ssog_stack(frame)
            sys.setprofile(None)

    monkeypatch.chdir(tmp_path)
    sys.setprofile(watch)
    try:
        assert main(["train", "--device", "cpu", "--epochs", "1", "--max-steps", "1", "--no-progress",
                     "--output", "run"]) == 0
    finally:
        sys.setprofile(None)
    traced = list(dict.fromkeys(stacks["build"] + stacks["forward"]))
    assert listed == traced
    assert (functions, files) == (len(traced), len({name.split(":")[0] for name in traced}))
