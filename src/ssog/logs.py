"""One diagnostics channel. Library code reports through ``logging.getLogger(__name__)``
(``ssog.<module>``) and never prints, so a caller of :func:`ssog.train.train` can silence or
capture every message with :mod:`logging`; the ``ssog`` command line installs the handler
that prints (:func:`install_cli_handler`), as timm's scripts do for timm's loggers.

Without a handler, Python shows warnings and errors on stderr (its last-resort handler) and
drops information.
"""
from __future__ import annotations

import logging
import os
import sys

from tqdm import tqdm

__all__ = ["CliHandler", "install_cli_handler"]


class CliHandler(logging.Handler):
    """Prints each record above any progress bar (``tqdm.write``): information on stdout,
    warnings and errors on stderr after ``warning: `` / ``error: ``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            if record.levelno >= logging.WARNING:
                prefix = "error: " if record.levelno >= logging.ERROR else "warning: "
                tqdm.write(prefix + message, file=sys.stderr)
            else:
                tqdm.write(message, file=sys.stdout)
        except Exception:  # logging's contract: a handler reports its failure, never raises
            self.handleError(record)


def install_cli_handler(level: int | None = None) -> CliHandler:
    """Print the ``ssog`` loggers' records at ``level`` and above (:class:`CliHandler`),
    replacing a handler installed before; the records do not also reach the root logger's.

    The default level is information in the first process and warnings in the others of a
    ``torchrun`` launch (``RANK`` > 0), so that a run's notes are printed once, not per process.
    """
    if level is None:
        level = logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING
    logger = logging.getLogger("ssog")
    for handler in [h for h in logger.handlers if isinstance(h, CliHandler)]:
        logger.removeHandler(handler)
    handler = CliHandler()
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
