"""Imports made with a part of a library the zoo never uses unavailable: `with unavailable(name): import ...`.

Some libraries import heavy optional parts of themselves or of others when imported (onnxruntime-training's ORTModule
check imports torch, DeepSpeed and MLflow; DeepSpeed's autotuner imports MLflow) and go on without them when that
import fails. For the length of the block the part cannot be imported; nothing else in the process changes, and it
imports as usual afterwards."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def unavailable(name: str):
    """`import name` raises ImportError inside the block, at once and without importing its parents (a module already
    imported is left as it is); afterwards it imports as usual."""
    blocked = name not in sys.modules
    if blocked:
        sys.modules[name] = None
    try:
        yield
    finally:
        if blocked and sys.modules.get(name, False) is None:
            del sys.modules[name]
