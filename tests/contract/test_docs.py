"""Every Python block of README.md and docs/ runs as written, and every `$ ssog ...` console
block shows what the command prints.

Each block runs alone, in a fresh namespace and an empty working folder, unless its first
line is ``# continues the block above`` (it then runs in the namespace of the block before
it). A block whose first line is ``# needs: ...`` (data, a GPU, the network, a trained run,
minutes) says what it needs and is skipped; so is a block stopped by a missing optional
extra (ssog's ``ImportError`` that says ``pip install 'ssog[...]'``).
"""
from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test runs a whole example of the docs

ROOT = Path(__file__).resolve().parents[2]
# The model cards of exported weights (a README.md beside the hub layout's config.json) are the hub's
# pages, not docs: their usage block names a hub repository to fill in.
PAGES = [ROOT / "README.md", *sorted(page for page in (ROOT / "docs").rglob("*.md")
                                     if not (page.name == "README.md" and (page.parent / "config.json").is_file()))]
CONTINUES = "# continues the block above"
NEEDS = "# needs:"


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


BLOCKS = [(page, index) for page in PAGES for index in range(len(python_blocks(page)))]


def run_block(page: Path, index: int) -> dict:
    """Run block ``index`` of ``page`` (after the blocks it continues); its namespace."""
    blocks = python_blocks(page)
    first = index
    while first > 0 and blocks[first].startswith(CONTINUES):
        first -= 1
    namespace: dict = {"__name__": "__docs__"}
    for number in range(first, index + 1):
        block = blocks[number]
        if block.startswith(NEEDS):
            pytest.skip(f"{page.name} block {number} {block.splitlines()[0][2:]}")
        try:
            exec(compile(block, f"{page} python block {number}", "exec"), namespace)
        except ImportError as error:
            if "pip install 'ssog[" not in str(error):
                raise
            pytest.skip(f"{page.name} block {number}: {error}")
    return namespace


@pytest.fixture
def empty_folder(tmp_path, monkeypatch):
    """Blocks write where a user's would (the working folder, tempfile's folder): here, in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(("page", "index"), BLOCKS, ids=[f"{p.relative_to(ROOT)}:{i}" for p, i in BLOCKS])
def test_python_block_runs(page, index, empty_folder):
    run_block(page, index)


def test_every_page_with_python_is_collected():
    assert {page.name for page, _ in BLOCKS} >= {"README.md", "models.md"}


def test_models_page_examples_give_what_their_comments_say(empty_folder):
    page = ROOT / "docs" / "models.md"
    blocks = python_blocks(page)
    features = run_block(page, next(i for i, block in enumerate(blocks) if "features_only=True" in block))
    assert len(features["maps"]) == 3 and features["maps"][0].shape == (2, 128, 8, 8)
    decay = run_block(page, next(i for i, block in enumerate(blocks) if "layer_decay=0.75" in block))
    assert decay["scales"] == [0.5625, 0.75, 1.0]


def test_blocks_continue_or_are_skipped_as_their_first_line_says(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n```python\n# continues the block above\ny = x + 1\n```\n\n"
                    "```python\n# needs: a GPU\nraise RuntimeError\n```\n\n```python\ny = x\n```\n")
    assert run_block(page, 1)["y"] == 2
    with pytest.raises(pytest.skip.Exception, match="block 2 needs: a GPU"):
        run_block(page, 2)
    with pytest.raises(NameError):
        run_block(page, 3)  # alone: x is not defined


def console_commands(page: Path) -> list[tuple[str, str]]:
    """``(command, output)`` of each ``$ ssog ...`` line of the page's console blocks."""
    pairs = []
    for block in re.findall(r"^```console\n(.*?)^```", page.read_text(), flags=re.S | re.M):
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = chunk.partition("\n")
            pairs.append((command, output))
    return pairs


COMMANDS = [(page, command, output) for page in PAGES for command, output in console_commands(page)]


@pytest.mark.parametrize(("page", "command", "output"), COMMANDS, ids=[c for _, c, _ in COMMANDS])
def test_console_output_is_what_the_command_prints(page, command, output, capsys):
    from ssog.cli import main

    program, *args = shlex.split(command)
    assert program == "ssog", f"{page.name}: console blocks show ssog commands, got {command!r}"
    assert main(args) == 0
    assert capsys.readouterr().out == output, f"{page.name}: regenerate the output of `{command}`"
