"""Libraries' log noise held down where the zoo calls them, never at import time."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def quiet(*names: str, level: int = logging.ERROR):
    """Raise these loggers to `level` for the duration of a call (each restored after)."""
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(level, logger.level))
    try:
        yield
    finally:
        for logger, old in zip(loggers, before):
            logger.setLevel(old)
