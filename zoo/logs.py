"""Libraries' log noise, held down in one place: around the zoo's calls into them (`quiet`), including the import
statements of the few that are noisy while imported (`with quiet(*NOISY_IMPORTS): import ...`). Importing the zoo
changes no logger."""

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


# Noisy while imported (torchao, imported by the QAT code and by transformers in the importer): warnings about CUDA
# kernels a CPU build lacks and torch's own enum registrations, none of them actionable. The modules that import them
# do so under `quiet(*NOISY_IMPORTS)`, which restores the levels after.
NOISY_IMPORTS = ("torchao", "torchao.kernel.intmm", "torch.utils._pytree")
