"""The ``ssog`` command line: one entry point, one module per sub-command.

Each module in :data:`COMMANDS` defines ``register(subparsers)``, which adds its parser
and sets ``func`` (``args -> int`` exit status). The command line only parses arguments
and calls into the library; no experiment logic lives here.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import signal
import sys
from types import ModuleType
from typing import NoReturn, Sequence

from ssog import __version__  # the installed metadata's (pyproject.toml)

__all__ = ["COMMANDS", "build_parsers", "main", "one_line", "refuse_unknown_options"]

COMMANDS: tuple[str, ...] = (
    "info",
    "flops",
    "bench",
    "bench-op",
    "train",
    "eval",
    "analyze",
    "export",
)


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")


def build_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``ssog`` parser, and each command's by name."""
    parser = argparse.ArgumentParser(
        prog="ssog",
        description="SSoG: separable sum-of-Gaussians token mixing for Vision Transformers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        _command_module(name).register(subparsers)
    for command in subparsers.choices.values():
        # no abbreviations: timm's --drop (classifier dropout) would silently be --drop-path
        command.allow_abbrev = False
    return parser, dict(subparsers.choices)


def refuse_unknown_options(command: str, parser: argparse.ArgumentParser, unknown: Sequence[str]) -> NoReturn:
    """Exit (status 2) through ``parser.error`` naming the first of ``unknown`` that looks like
    an option, the nearest option ``command`` has, and the command's own hint
    (``unknown_option_hint(option)`` of its module, e.g. ``ssog train``'s ``--set``)."""
    options = [text for text in unknown if text.startswith("-")]
    if not options:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    option = options[0].split("=", 1)[0]
    known = [flag for action in parser._actions for flag in action.option_strings]
    near = difflib.get_close_matches(option, known, n=1, cutoff=0.7)
    message = f"unrecognized option {option}" + (f"; did you mean {near[0]}?" if near else "")
    hint = getattr(_command_module(command), "unknown_option_hint", None)
    if hint is not None:
        message += f" ({hint(option)})"
    parser.error(message)


def main(argv: Sequence[str] | None = None) -> int:
    if list(sys.argv[1:] if argv is None else argv) == ["--version"]:
        # answered before the commands' parsers are built, which load training, data and benchmark code
        print(f"ssog {__version__}")
        return 0
    from ssog.logs import install_cli_handler

    install_cli_handler()
    parser, commands = build_parsers()
    args, unknown = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: a command may repeat it (a launch line)
    if unknown:
        refuse_unknown_options(args.command, commands[args.command], unknown)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, FloatingPointError, MemoryError) as error:
        # Bad input (and a diverged run, a full disk, a device out of memory) is reported as
        # one clear line, not a traceback from deep inside torch.
        print(f"ssog {args.command}: error: {one_line(error)}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        from ssog.runtime import is_out_of_memory

        if not is_out_of_memory(error):
            raise
        print(f"ssog {args.command}: error: out of memory ({one_line(error)}); lower the image size or the batch "
              "size", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ssog {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def one_line(error: BaseException) -> str:
    """The message of ``error`` on one line.

    An error raised in a data-loader worker reaches the main process as a copy whose message
    is the worker's whole traceback; its last line is the original message.
    """
    lines = [line for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    if len(lines) > 1 and lines[1].startswith("Original Traceback"):
        return lines[-1].partition(": ")[2] or lines[-1]
    return " ".join(line.strip() for line in lines)


if __name__ == "__main__":
    raise SystemExit(main())
