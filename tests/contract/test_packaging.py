"""What a user of the package finds besides the code: version, licence, citation, changelog."""
from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
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


def test_version_answers_before_the_commands_load():
    """``import ssog`` registers the models (torch and timm); the commands' own modules do not load."""
    probe = ("import sys; from ssog.cli import main; main(['--version']); "
             "print(sorted(name for name in ('ssog.train', 'ssog.bench', 'ssog.analysis', 'ssog.data') "
             "if name in sys.modules))")
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


def test_the_core_install_is_light_and_the_extras_hold_the_rest():
    requirements = METADATA.get_all("Requires-Dist")
    core = {re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in requirements if "extra ==" not in r}
    assert core == {"torch", "torchvision", "timm", "torchdiffeq", "numpy", "pyyaml", "tqdm", "safetensors"}

    def extra(name: str) -> set[str]:
        return {re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in requirements if f'extra == "{name}"' in r}

    assert extra("plot") == {"matplotlib"}
    assert {"matplotlib", "scikit-learn", "pytest", "onnxruntime", "datasets"} <= extra("dev")
    import ssog.data.builtin

    assert ssog.data.builtin.DIGITS_FILE.is_file()  # package data: the digits travel with the code


#: Python that hides matplotlib and scikit-learn from the code that follows, as on a core install.
WITHOUT_EXTRAS = "import sys; sys.modules['matplotlib'] = None; sys.modules['sklearn'] = None\n"


@pytest.mark.subprocess
def test_ssog_train_runs_on_the_core_install(tmp_path, run_child):
    """The README's first command: ``ssog train`` trains on the embedded digits without
    matplotlib or scikit-learn; the run says it draws no curves and why."""
    import sys

    code = WITHOUT_EXTRAS + (
        "from ssog.cli import main\n"
        f"raise SystemExit(main(['train', '--output', {str(tmp_path / 'run')!r}, '--no-progress', '--threads', '1',"
        " '--set', 'max_steps=2', '--set', 'epochs=1']))\n")
    result = run_child([sys.executable, "-c", code], 600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "curves.png is not drawn: matplotlib is not installed (pip install 'ssog[plot]')" in result.stdout
    assert (tmp_path / "run" / "best.safetensors").is_file() and not (tmp_path / "run" / "curves.png").exists()


@pytest.mark.parametrize("argv, needed_by", [
    (["bench-op", "--grids", "4", "--output", "OUT"], "ssog bench-op"),
    (["bench", "--output", "OUT"], "ssog bench (without --no-plots)"),
    (["analyze", "kernels", "--model", "ssog_vit_micro_patch1_8", "--output", "OUT"], "ssog analyze kernels --output"),
])
def test_a_command_that_draws_figures_names_the_extra_it_needs(argv, needed_by, tmp_path, monkeypatch, capsys):
    from ssog.cli import main

    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    assert main([str(tmp_path / "out") if a == "OUT" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(
        f"{needed_by} draws figures with matplotlib, which is not installed: pip install 'ssog[plot]'\n")
    assert not (tmp_path / "out").exists()
