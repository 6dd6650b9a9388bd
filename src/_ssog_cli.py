"""The ``ssog`` command's entry point, kept outside the ``ssog`` package: ``import ssog``
registers the models with timm and so imports torch, which ``ssog --version`` does not need.
Everything but ``--version`` goes to :func:`ssog.cli.main`."""
from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:] == ["--version"]:
        from importlib.metadata import version

        print(f"ssog {version('ssog')}")  # as ssog.cli.main prints it
        return 0
    from ssog.cli import main as ssog_main

    return ssog_main()
