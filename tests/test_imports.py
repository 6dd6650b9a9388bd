"""``import ssog`` registers the models with timm (SPEC §4), whichever of ssog and timm is
imported first; each case runs in a fresh interpreter, since imports are process-wide.
(That the operator's modules import torch alone is tests/test_ops.py's.)"""
from __future__ import annotations

import os
import sys

import pytest

from ssog.cli import OPENMP_SPIN_COUNT


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


SPIN_COUNT_AT_TORCH_IMPORT = """
import os, sys
seen = []
sys.addaudithook(lambda event, args: event == "import" and args[0] == "torch" and not seen
                 and seen.append(os.environ.get("GOMP_SPINCOUNT")))
from ssog.cli import main
main(["info", "ssog_vit_micro_patch1_8", "--json"])
print("spin count when torch loaded:", seen)
"""


@pytest.mark.parametrize("environment,expected", [
    ({}, [OPENMP_SPIN_COUNT]),
    ({"GOMP_SPINCOUNT": "7"}, ["7"]),
    ({"OMP_WAIT_POLICY": "active"}, [None]),
])
def test_the_command_line_limits_openmp_spinning_before_torch_loads(environment, expected, run_child):
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: the command line's default
    must be in place by then, and a choice of the user's must be left alone."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    result = run_child([sys.executable, "-c", SPIN_COUNT_AT_TORCH_IMPORT], 300, env={**env, **environment})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == f"spin count when torch loaded: {expected}"
