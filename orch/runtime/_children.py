"""The processes a rank starts, ended with it.

Training code starts processes of its own: DataLoader workers, a library re-executing the
program, ``torch.multiprocessing.spawn``, a tool in a subprocess. They must not outlive the
run. A rank makes itself a *subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): a process it
started whose parent dies is re-parented to the rank, not to init, so every process the
rank's code started stays in the rank's tree while the rank lives. The rank ends that tree
on every way out: when it returns, when the master aborts it or its launcher is gone
(``os._exit`` through :func:`exit_now`), and on SIGTERM (:func:`end_with_sigterm`). A rank
killed outright (SIGKILL at the end of a grace, the OOM killer) cannot: its orphans go to
init. The launcher then ends them by the mark every process a rank starts inherits, its
run's id in ``$ORCH_RANK_OF`` (:func:`end_marked`), and a gang's by the tree it read before
it killed (:func:`descendants`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from typing import NoReturn

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    return False


def _parents() -> dict[int, tuple[int, int]]:
    """Every process's parent and start time (clock ticks since boot), read from /proc (empty
    without /proc)."""
    out: dict[int, tuple[int, int]] = {}
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
            out[int(name)] = int(fields[1]), int(fields[19])
    return out


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (children first), as /proc shows them now."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def tree(pid: int) -> dict[int, int]:
    """The processes under ``pid``, each with its start time: what :func:`kill_tree` ends
    later, sparing a pid the system gave to another process since."""
    started = _parents()
    return {p: started[p][1] for p in descendants(pid) if p in started}


def kill_tree(found: dict[int, int]) -> None:
    """SIGKILL the processes of a :func:`tree` that still run."""
    now = _parents()
    kill([p for p, began in found.items() if p in now and now[p][1] == began])


def kill(pids: list[int]) -> None:
    """SIGKILL each of ``pids``; one that is gone already is not an error."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def end_with_sigterm() -> None:
    """On SIGTERM (a launcher's tear-down), end this process's descendants, then die of the
    signal as before: the exit code the launcher reads stays -SIGTERM."""

    def on_sigterm(signum: int, frame: object) -> None:
        end_descendants()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


def exit_now(code: int) -> NoReturn:
    """``os._exit(code)``, with this process's descendants ended first."""
    with contextlib.suppress(Exception):
        end_descendants()
    os._exit(code)


def marked(run_id: str) -> list[int]:
    """This user's processes started by a rank of ``run_id``: their environment, inherited
    from the rank, holds ``ORCH_RANK_OF=<run_id>:<rank>`` (the ranks' own does not: a rank
    sets it after it started)."""
    prefix = f"ORCH_RANK_OF={run_id}:".encode()
    uid, me = os.getuid(), os.getpid()
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if any(v.startswith(prefix) for v in env.split(b"\0")):
                found.append(int(name))
    return found


def end_marked(run_id: str) -> int:
    """SIGKILL what a rank of ``run_id`` started and left behind (see :func:`marked`); returns
    how many."""
    found = marked(run_id)
    kill(found)
    return len(found)


def end_descendants() -> int:
    """SIGKILL every process under this one (a rank on its way out); returns how many."""
    found = descendants(os.getpid())
    kill(found)
    for p in found:  # reap the ones that are our children (the rest are their parents')
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(p, os.WNOHANG)
    return len(found)
