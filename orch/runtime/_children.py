"""The processes a rank starts, ended with it.

Training code starts processes of its own: DataLoader workers, a library re-executing the
program, ``torch.multiprocessing.spawn``, a tool in a subprocess. They must not outlive the
run. A rank makes itself a *subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): a process it
started whose parent dies is re-parented to the rank, not to init, so every process the
rank's code started stays in the rank's tree while the rank lives. The rank ends that tree
when it leaves (:func:`end_descendants`), and the launcher, which may have to kill a rank,
reads the tree before it does (:func:`descendants`) and ends what is left of it after.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    return False


def _parents() -> dict[int, int]:
    """Every process's parent, read from /proc (empty without /proc)."""
    out: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2 :].split()  # the name may hold spaces and ')'
            out[int(name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (children first), as /proc shows them now."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def kill(pids: list[int]) -> None:
    """SIGKILL each of ``pids``; one that is gone already is not an error."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def end_descendants() -> int:
    """SIGKILL every process under this one (a rank on its way out); returns how many."""
    found = descendants(os.getpid())
    kill(found)
    for p in found:  # reap the ones that are our children (the rest are their parents')
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(p, os.WNOHANG)
    return len(found)
