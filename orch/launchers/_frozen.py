"""The stack of a rank whose whole process froze, from py-spy where it is installed.

A rank frozen whole (SIGSTOP, native code holding the GIL) has no heartbeat thread left to
take its own stack when the master asks; its heartbeats stop and the master counts it LOST.
Before the launcher tears such a rank down, ``py-spy dump --nonblocking`` reads the Python
stack of every thread from outside the process (it works on a stopped one too). Without
py-spy the rank's record says how to get it next time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DUMP_TIMEOUT = 5.0  # seconds for one dump; a tear-down must not wait on it for long
MAX_DUMP = 64 * 1024  # characters of a dump kept


def py_spy() -> str | None:
    """The py-spy command: beside this interpreter (a virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def dump(pid: int) -> str:
    """Every thread's Python stack of process ``pid``, or why there is none."""
    command = py_spy()
    if command is None:
        return (
            "no stack: its whole process is frozen, so its heartbeat thread could not take it, and "
            "py-spy is not installed here (pip install py-spy lets orch read a frozen rank's stack)"
        )
    try:
        done = subprocess.run(
            [command, "dump", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=DUMP_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"no stack: py-spy dump --pid {pid} did not answer ({e})"
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        return f"no stack: py-spy dump --pid {pid} failed: {why[-1] if why else done.returncode}"
    return "its stack, read by py-spy (its process was frozen):\n" + done.stdout.strip()[:MAX_DUMP]
