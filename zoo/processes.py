"""The processes of a run: the long child processes a command waits on (a build's torchrun), which a SIGTERM sent to
zoo reaches, and a rank's own scheduling priority (`keep_background_priority`).

Python's default SIGTERM ends zoo at once: a `zoo build` stopped by `kill` would leave its training ranks running
and its temporary run folder behind, a `zoo validate` its scratch folder (hundreds of MB). The command line
(`stop_on_sigterm`) makes a SIGTERM raise `StoppedError`, so the with-blocks above what it interrupts clean up as
Ctrl-C's KeyboardInterrupt makes them; waiting through `run_stoppable`, the signal is first passed on to the child
(torchrun stops its ranks on it), and zoo raises `StoppedError` once the child has exited.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


FORWARDED = (signal.SIGTERM,)


class StoppedError(BaseException):
    """zoo was asked to stop (SIGTERM); a child it waited on was stopped the same way. Not a ZooError, nor an
    Exception: like KeyboardInterrupt, no handler that turns a failure into a report row or a fallback (`zoo
    validate`'s failed rebuild, say) holds it up. The command line prints it as it prints a ZooError."""

    exit_code = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


# Set once zoo is stopping: a second SIGTERM (`timeout` passes its own on, a service manager signals every process of
# the group) must not interrupt the clean-up the first one started.
_STOPPING = threading.Event()


def stop_on_sigterm() -> None:
    """From now on a SIGTERM raises StoppedError in this process's main thread (the command line's), wherever it
    is, once; `run_stoppable` passes it on to a child first."""
    def stop(signum, _frame) -> None:
        if not _STOPPING.is_set():
            _STOPPING.set()
            raise StoppedError(f"stopped: zoo received {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, stop)


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
        _STOPPING.set()
        raise StoppedError(f"{what} stopped: zoo received {signal.Signals(received[0]).name} and passed it on to "
                           f"`{command[0].rsplit('/', 1)[-1]}`, which exited {returncode}")
    return subprocess.CompletedProcess(command, returncode)


# The lowest niceness: what a rank at idle priority (SCHED_IDLE) gives its session's scheduling group.
LOWEST_NICENESS = 19


def background_niceness() -> int:
    """This process's niceness, LOWEST_NICENESS at idle priority (SCHED_IDLE); 0 or less: not in the background."""
    if os.sched_getscheduler(0) == os.SCHED_IDLE:
        return LOWEST_NICENESS
    return os.getpriority(os.PRIO_PROCESS, 0)


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # field 4, after the name
    except (OSError, IndexError, ValueError):
        return None


def own_session() -> bool:
    """Whether this process's session was made for it by a launcher: torchrun starts each rank as the leader of a
    session of its own; horovodrun starts a session, then the rank through `sh -c` (HOROVOD_RANK set; the session's
    leader is its parent or, where the shell stays, its grandparent). A session that a user's shell or a test runner
    leads is never the rank's own: its other processes are none of the run's."""
    session = os.getsid(0)
    if session == os.getpid():
        return True
    # session 0: its leader is outside this PID namespace (a container's runtime), never a launcher's
    return "HOROVOD_RANK" in os.environ and session > 0 and session in (os.getppid(), _parent_of(os.getppid()))


def keep_background_priority() -> None:
    """A rank started at a background priority (`nice -n 19 torchrun ...`, `chrt --idle 0 zoo build ...`) keeps it.

    Linux's autogroups (CONFIG_SCHED_AUTOGROUP, on in most distributions' kernels) schedule each session as one group
    and give every group an equal share of the CPUs, whatever its processes' niceness: the ranks that torchrun and
    horovodrun start, each in a session of its own, would compete with the foreground as equals. Such a rank gives
    its own session's group its niceness (/proc/self/autogroup); a session it does not own is left alone, and so is a
    system without autogroups."""
    if not sys.platform.startswith("linux"):
        return
    niceness = background_niceness()
    if niceness <= 0 or not own_session():
        return
    for _ in range(20):  # without CAP_SYS_ADMIN the kernel takes one such change per 0.1 s, machine-wide (EAGAIN)
        try:
            with open("/proc/self/autogroup", "w") as autogroup:
                autogroup.write(str(niceness))
            return
        except BlockingIOError:
            time.sleep(0.05 + random.random() * 0.1)
        except OSError:  # no autogroups (the file is absent), or not allowed: the rank runs as before
            return
