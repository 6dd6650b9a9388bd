"""ssog.data's layers (timm's factory -> sources -> readers): the factory alone imports the
sources, no module imports a private name of another, and the imports form no circle."""
from __future__ import annotations

import ast
from pathlib import Path

import ssog.data

DATA = Path(ssog.data.__file__).parent
SOURCES = {"builtin", "folder", "timm_map", "streams"}


def _imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Each module of ssog.data: the ``(ssog.data module, names)`` of its ``from ... import``s."""
    found = {}
    for path in DATA.glob("*.py"):
        nodes = ast.walk(ast.parse(path.read_text()))
        found[path.stem] = [(node.module.split(".")[2], [alias.name for alias in node.names]) for node in nodes
                            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ssog.data.")]
    return found


def test_only_the_factory_imports_the_sources_and_no_private_name_crosses():
    imports = _imports()
    for module, pairs in imports.items():
        for target, names in pairs:
            assert module in ("factory", "__init__") or target not in SOURCES, f"{module} imports {target}"
            assert target != "factory" or module == "__init__", f"{module} imports the factory"
            assert not [name for name in names if name.startswith("_")], f"{module} imports private names of {target}"


def test_the_modules_import_no_circle():
    graph = {module: {target for target, _ in pairs} for module, pairs in _imports().items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module not in done:
            for target in graph.get(module, ()):
                visit(target, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())
