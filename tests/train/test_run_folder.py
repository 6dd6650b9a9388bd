"""The run folder's rules (ssog.train.run_folder): a run's config.yaml is told from a user's
recipe by the marker a run writes (or, for older runs, the config's header); no torch needed."""
from __future__ import annotations

import ast
import inspect

import pytest

from ssog.train import run_folder
from ssog.train.run_folder import CONFIG_HEADER, RUN_FILES, RUN_MARKER, check_output, claim_run_folder, is_run_config

CONFIG = {"model": "m", "epochs": 1, "overwrite": False}


def test_the_module_imports_no_torch():
    imported = set()
    for node in ast.walk(ast.parse(inspect.getsource(run_folder))):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert "torch" not in imported and "timm" not in imported, imported


def test_a_claimed_folder_holds_the_marker_and_its_config_is_a_runs(tmp_path):
    run = tmp_path / "run"
    claim_run_folder(run, CONFIG, resuming=False).release()
    assert RUN_MARKER in RUN_FILES and (run / RUN_MARKER).is_file()
    assert (run / "config.yaml").read_text().startswith(CONFIG_HEADER)
    assert is_run_config(run / "config.yaml")
    # the marker alone tells: a run's config.yaml without its header line is still the run's
    (run / "config.yaml").write_text("model: m\n")
    assert is_run_config(run / "config.yaml")
    with pytest.raises(ValueError, match="already holds a run .*config.yaml.*pass --overwrite"):
        check_output(run, resuming=False)
    claim_run_folder(run, {**CONFIG, "overwrite": True}, resuming=False, overwrite=True).release()
    assert (run / RUN_MARKER).is_file() and (run / "config.yaml").read_text().startswith(CONFIG_HEADER)


def test_a_recipe_is_not_a_runs_config_and_older_runs_are(tmp_path):
    recipe = tmp_path / "config.yaml"
    recipe.write_text("epochs: 1\nvariants:\n  short: {epochs: 1}\n")
    assert not is_run_config(recipe)
    with pytest.raises(ValueError, match="holds a config.yaml that is not a run's"):
        check_output(tmp_path, resuming=False, overwrite=True)
    recipe.write_text(CONFIG_HEADER + "epochs: 1\n")  # a run's from before the marker
    assert is_run_config(recipe)
    fields = [f"field_{i}" for i in range(30)] + ["output"]
    older = "".join(f"{name}: 1\n" for name in fields[:-1]) + f"output: {tmp_path}\n"  # before the header
    recipe.write_text(older)
    assert is_run_config(recipe, config_fields=fields) and not is_run_config(recipe)
