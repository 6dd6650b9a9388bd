"""What a user of the package finds besides the code: version, licence, citation, changelog."""
from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: The installed package's metadata, which pip wrote from pyproject.toml.
METADATA = importlib.metadata.metadata("ssog")


def test_version_comes_from_the_installed_metadata(capsys):
    import ssog
    from ssog.cli import main

    installed = METADATA["Version"]
    assert re.search(rf'^version = "{re.escape(installed)}"$', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert ssog.__version__ == installed
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ssog {installed}"


def test_version_answers_without_importing_torch():
    probe = ("import sys; from ssog.cli import main; main(['--version']); "
             "print(sorted(name for name in ('torch', 'timm') if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"ssog {importlib.metadata.version('ssog')}", "[]"]


def test_license_file_is_the_mit_license_pyproject_declares():
    text = (ROOT / "LICENSE").read_text()
    assert METADATA["License"] == "MIT"
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the ssog authors\n")
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text


def test_citation_cites_the_paper_and_this_version():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["type"] == "software"
    assert {"message", "title", "authors"} <= citation.keys()
    assert citation["version"] == METADATA["Version"] and citation["license"] == "MIT"
    paper = citation["preferred-citation"]
    assert paper["title"] == "Beyond Quadratic Attention: Separable Gaussian Operators for ODE Vision Transformers"
    assert [a["family-names"] for a in paper["authors"]] == ["Boned Riera", "Romero Sanchez", "Ramos Terrades"]
    assert str(paper["date-published"]) == "2026-11-05"
    assert paper["url"] == "https://arxiv.org/abs/2611.08236"
    assert {"type": "other", "value": "arXiv:2611.08236", "description": "arXiv identifier"} in paper["identifiers"]


def test_changelog_keeps_an_unreleased_section_first():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[(.+?)\]", text, flags=re.M)
    assert versions and versions[0] == "Unreleased"
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
    assert set(re.findall(r"^### (\w+)", unreleased, flags=re.M)) <= {
        "Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
