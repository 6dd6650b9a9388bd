"""The README's commands and examples stay true."""
from __future__ import annotations

import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_commands = [line for line in ci_lines if line.startswith("python3 -m venv")]
    assert len(ci_commands) == 1
    assert ci_commands[0] in README


def test_readme_opens_with_main_job_then_tests():
    commands = re.findall(r"```bash\n(.+?)\n```", README)
    assert commands[0].endswith("ssog train")
    assert commands[1].endswith("pytest -q -n auto")

