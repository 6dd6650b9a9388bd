"""``import ssog`` registers the models with timm (SPEC §4), whichever of ssog and timm is
imported first; each case runs in a fresh interpreter, since imports are process-wide.
(That the operator's modules import torch alone is the torch-alone import contract in pyproject.toml.)"""
from __future__ import annotations

import os
import sys

import pytest


@pytest.mark.parametrize("code,expected", [
    ("import ssog, timm; print(len(timm.list_models('ssog_vit_*')) > 0, "
     "type(timm.create_model('ssog_vit_micro_patch1_8')).__name__)", "True ViT"),
    ("import timm, ssog; print(len(timm.list_models('ssog_vit_*')) > 0)", "True"),
    ("import ssog.ops; import timm; print('ssog_vit_micro_patch1_8' in timm.list_models())", "True"),
    # registration is plain imports: no import hook is left behind
    ("import sys; finders = list(sys.meta_path); import ssog; print([f for f in sys.meta_path if f not in finders])",
     "[]"),
])
def test_import_registers_the_models(code, expected, run_child):
    result = run_child([sys.executable, "-c", code], 300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


OPENMP_AT_TORCH_IMPORT = """
import os, sys
seen = []
sys.addaudithook(lambda event, args: event == "import" and args[0] == "torch" and not seen
                 and seen.append({k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_", "KMP_"))}))
from ssog.cli import main
main(["info", "ssog_vit_micro_patch1_8", "--json"])
print("OpenMP variables when torch loaded:", seen, "after:", {k for k in os.environ if k.startswith(("OMP_", "GOMP_"))})
"""


@pytest.mark.parametrize("environment", [{}, {"GOMP_SPINCOUNT": "7"}])
def test_the_command_line_sets_no_openmp_variable(environment, run_child):
    """OpenMP's settings are the user's: the command line neither sets nor changes one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
    result = run_child([sys.executable, "-c", OPENMP_AT_TORCH_IMPORT], 300, env={**env, **environment})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == (
        f"OpenMP variables when torch loaded: [{environment}] after: {set(environment) or set()}")
