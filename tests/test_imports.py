"""``import ssog`` registers the models with timm (SPEC §4), whichever of ssog and timm is
imported first; each case runs in a fresh interpreter, since imports are process-wide.
(That ``import ssog.ops`` needs torch alone is tests/test_ops.py's.)"""
from __future__ import annotations

import sys

import pytest


@pytest.mark.parametrize("code,expected", [
    ("import ssog, timm; print(len(timm.list_models('ssog_vit_*')) > 0, "
     "type(timm.create_model('ssog_vit_micro_patch1_8')).__name__)", "True ViT"),
    ("import timm, ssog; print(len(timm.list_models('ssog_vit_*')) > 0)", "True"),
    ("import ssog.ops; import timm; print('ssog_vit_micro_patch1_8' in timm.list_models())", "True"),
])
def test_import_registers_models_without_loading_timm_for_the_operator(code, expected, run_child):
    result = run_child([sys.executable, "-c", code], 300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected
