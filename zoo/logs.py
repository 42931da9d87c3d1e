"""Libraries' log noise, held down in one place: around the zoo's calls into them (`quiet`), and for the few that
are noisy while they are imported, before anything imports them (`quiet_imports`, run by `import zoo`)."""

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


# Noisy while imported, wherever that happens (torchao is imported by the QAT code and by transformers): warnings about
# CUDA kernels a CPU build lacks and torch's own enum registrations, none of them actionable.
NOISY_IMPORTS = ("torchao", "torchao.kernel.intmm", "torch.utils._pytree")


def quiet_imports() -> None:
    """Raise NOISY_IMPORTS' loggers to ERROR for the process (their warnings come while they are imported, which no
    call of the zoo's surrounds)."""
    for name in NOISY_IMPORTS:
        logging.getLogger(name).setLevel(logging.ERROR)
