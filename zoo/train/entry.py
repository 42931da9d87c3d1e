"""A launcher's main (launchers/*.py): the command line first (zoo.train.arguments), so `--help` and a wrong option
answer before torch loads, then the trainer under the launcher's strategy (zoo.train.launch)."""

from __future__ import annotations

import gc
import logging
import os
import sys
from pkgutil import resolve_name

from zoo.processes import keep_background_priority
from zoo.train.arguments import parse_args


def run_launcher(launcher: str, init: str | None = None) -> None:
    """`init` ("module:function", Horovod's) joins the job; its module is imported only then."""
    args = parse_args()
    keep_background_priority()  # before the imports: a background rank's are background work too
    from zoo.train.launch import launch  # lazy: torch and the trainer, once the arguments parse

    # What the imports made (torch's modules, functions and tables: ~200,000 objects, a full collection ~0.1 s) lives
    # as long as the rank: frozen, every later collection (automatic, or the QAT capture's) skips them.
    gc.freeze()
    launch(launcher, args, init=resolve_name(init) if init else None)
    leave()


def leave() -> None:
    """End a rank whose run finished (its files written atomically, its process group destroyed, its MLflow run
    closed) without the interpreter's finalization: torch's C++ objects are destroyed there in an order that can abort
    a finished rank ("terminate called without an active exception", exit -6: rank 1 of a two-cell DDP sweep in a
    CI run, after zoo.train.distributed `shutdown`'s barrier and `destroy_process_group`), failing a run that has done
    its work. A failed run (SystemExit) still
    ends the usual way."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
