"""A worker ends when the process that launched it dies, however it dies.

A worker's direct parent is a forkserver (``orch.launch``, ``orch run``) or ``orch worker
--nproc-per-node K``; the forkserver keeps running while any of its children holds its
"alive" pipe, so watching the parent is not enough: the OOM killer or ``kill -9`` ends the
launcher alone, and its workers would train on until the master's heartbeat timeout. So a
worker watches the launcher itself: a pidfd where Linux has one (it becomes readable the
moment that process exits, and cannot be fooled by a reused pid), else polling the pid
and its start time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import sys
import threading
import time

from orch.runtime._children import exit_now

POLL_INTERVAL = 0.2


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields follow its last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])  # field 22 of the whole line


def process_alive(pid: int, *, start_time: int | None = None, began_by: float | None = None) -> bool:
    """``pid`` runs (not a zombie) and is the process meant: the one that started at
    ``start_time`` (clock ticks since boot), or one that began by ``began_by`` (unix seconds;
    a process that began later holds a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may hold spaces and ')'
    if fields[0] in (b"Z", b"X"):
        return False
    ticks = int(fields[19])
    if start_time is not None and ticks != start_time:
        return False
    boot = _boot_time()
    if began_by is None or boot is None:
        return True
    return boot + ticks / os.sysconf("SC_CLK_TCK") <= began_by + 5.0  # btime is whole seconds


@functools.cache
def _boot_time() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime"):
                return float(line.split()[1])
    return None


class Owner:
    """Identifies one process across a fork: its pid and its start time."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.start_time = process_start_time(self.pid)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        # A recycled pid belongs to a process that started later.
        return self.start_time is None or process_start_time(self.pid) == self.start_time


def exit_when_gone(owner: Owner, code: int, what: str = "the process that launched this worker") -> None:
    """Start a daemon thread that ends this process (``os._exit(code)``) once ``owner`` is gone."""
    pidfd = -1
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(owner.pid)
    if not owner.alive():  # gone already, or its pid was reused before we could open it
        _exit(code, what, owner.pid)

    def watch() -> None:
        if pidfd >= 0:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while not poller.poll():
                pass
        else:
            while owner.alive():
                time.sleep(POLL_INTERVAL)
        _exit(code, what, owner.pid)

    threading.Thread(target=watch, name="orch-owner-watch", daemon=True).start()


def _exit(code: int, what: str, pid: int) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"orch worker: {what} (pid {pid}) is gone; exiting\n")
        sys.stderr.flush()
    exit_now(code)  # what the worker started ends with it
