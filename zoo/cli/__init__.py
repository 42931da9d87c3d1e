"""The `zoo` command line. Every command mirrors a function of the Python API; the commands live in four modules
(catalog_cmds, measure_cmds, build_cmds, store_cmds) on the application in app."""

from __future__ import annotations

import json
import sys

# Imported for their commands, in the order `zoo --help` lists them.
from zoo.cli import catalog_cmds, measure_cmds, build_cmds, store_cmds  # noqa: F401, I001
from zoo.cli.app import app, err, say
from zoo.errors import ZooError
from zoo.processes import StoppedError, stop_on_sigterm


class _Watched:
    """stdout, remembering whether a command wrote to it (a JSON report already printed is the answer)."""

    def __init__(self, stream):
        self.stream, self.used = stream, False

    def write(self, text: str) -> int:
        self.used = self.used or bool(text)
        return self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def main() -> None:
    sys.stdout = watched = _Watched(sys.stdout)
    stop_on_sigterm()  # `kill`: the with-blocks remove what they made, as after Ctrl-C
    try:
        app(standalone_mode=True)
    except (ZooError, StoppedError) as exc:
        if "--json" in sys.argv[1:] and not watched.used:  # a caller reading JSON gets JSON, failures included
            print(json.dumps({"error": str(exc), "kind": type(exc).__name__}))
        if err.is_terminal:  # a person reads it: wrapped at word boundaries, never inside a command
            say(str(exc), label="error: ", console=err)
        else:  # a log or a script: one line, whole
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(exc.exit_code) from None
