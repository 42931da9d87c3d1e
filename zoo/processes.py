"""The long child processes a command waits on (a build's torchrun): a SIGTERM sent to zoo reaches them.

Python's default SIGTERM ends zoo at once: a `zoo build` stopped by `kill` would leave its training ranks running
and its temporary run folder behind. Waiting through `run_stoppable`, the signal is passed on to the child (torchrun
stops its ranks on it), and once the child has exited zoo raises `StoppedError`, so the with-blocks above it clean up
as Ctrl-C's KeyboardInterrupt makes them.
"""

from __future__ import annotations

import signal
import subprocess
import threading

from zoo.errors import ZooError

FORWARDED = (signal.SIGTERM,)


class StoppedError(ZooError):
    """zoo was asked to stop (SIGTERM) while a child ran; the child was stopped the same way."""

    exit_code = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


def run_stoppable(command: list[str], what: str, **popen) -> subprocess.CompletedProcess:
    """`subprocess.run(command, **popen)` whose child receives the SIGTERM zoo receives while it waits; `what` names
    the work in the error then raised (e.g. "building 'bert-mini'")."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set signal handlers
        return subprocess.run(command, **popen)
    received: list[int] = []
    with subprocess.Popen(command, **popen) as process:

        def forward(signum, _frame) -> None:
            received.append(signum)
            process.send_signal(signum)

        previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
        try:
            returncode = process.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    if received:
        raise StoppedError(f"{what} stopped: zoo received {signal.Signals(received[0]).name} and passed it on to "
                           f"`{command[0].rsplit('/', 1)[-1]}`, which exited {returncode}")
    return subprocess.CompletedProcess(command, returncode)
