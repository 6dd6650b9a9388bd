"""The ``ssog`` command line: one entry point, one module per sub-command.

Each module in :data:`COMMANDS` defines ``register(subparsers)``, which adds its parser
and sets ``func`` (``args -> int`` exit status). The command line only parses arguments
and calls into the library; no experiment logic lives here.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

COMMANDS: tuple[str, ...] = (
    "info",
    "flops",
    "bench",
    "bench-op",
    "train",
    "eval",
    "analyze",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ssog",
        description="SSoG: separable sum-of-Gaussians token mixing for Vision Transformers.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name.replace('-', '_')}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as error:
        # Bad input is reported as one clear line, not a traceback from deep inside torch.
        print(f"ssog {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
