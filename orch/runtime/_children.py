"""The processes a rank starts, ended with it.

Training code starts processes of its own: DataLoader workers, a library re-executing the
program, ``torch.multiprocessing.spawn``, a tool in a subprocess. They must not outlive the
run. A rank makes itself a *subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): a process it
started whose parent dies is re-parented to the rank, not to init, so every process the
rank's code started stays in the rank's tree while the rank lives. The rank ends that tree
on every way out: when it returns, when the master aborts it or its launcher is gone
(``os._exit`` through :func:`exit_now`), and on SIGTERM (:func:`end_with_sigterm`, after its
last words: the points it logged, see :func:`say_last_words`). A rank
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
import threading
import time
from collections.abc import Callable
from typing import NoReturn

PR_SET_CHILD_SUBREAPER = 36
SIG_DFL = 0  # the C library's "default action" disposition
# What this process says before SIGTERM ends it (a rank's last points, bounded; see say_last_words).
_last_words: Callable[[], object] | None = None
_ending = threading.Lock()  # taken by whichever thread ends the process on SIGTERM first
_owner = 0  # the process that said how it ends on SIGTERM (a forked child is not it)
_unplugged = -1  # the wakeup fd set aside while a fork is under way


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


def say_last_words(words: Callable[[], object] | None, *, unless: Callable[[], object] | None = None) -> None:
    """What this process does on SIGTERM before it ends (a rank sends the points it logged,
    within a bound shorter than its launcher's grace); None: nothing. ``unless``: only while
    those are the words it says (a sender that closes forgets only its own)."""
    global _last_words
    if unless is None or _last_words == unless:
        _last_words = words


def end_with_sigterm() -> None:
    """On SIGTERM (a launcher's tear-down): the process's last words (:func:`say_last_words`),
    its descendants ended, then it dies of the signal as before: the exit code the launcher
    reads stays -SIGTERM. Call it from the main thread.

    Python runs a signal's handler in the main thread, between two bytecodes: a training thread
    blocked in a collective (a peer gone, a peer hung) would run it only once the collective
    returns, maybe after the launcher's SIGKILL, and the rank's last points would be lost. So
    the interpreter's own C handler wakes a thread at once (``signal.set_wakeup_fd``: it writes
    the signal's number to a pipe), which ends the process from there; the Python handler does
    the same when it runs first (code that set a wakeup fd of its own took the pipe's place).
    A child forked from this process (a DataLoader's worker) is born without the pipe (it is
    unset around each fork) and its SIGTERM ends it alone, without last words.
    """
    global _owner
    _owner = os.getpid()
    signal.signal(signal.SIGTERM, _on_sigterm)
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: the Python handler alone
        os.close(read)
        os.close(write)
        return
    threading.Thread(target=_watch_signals, args=(read,), name="orch-sigterm", daemon=True).start()
    os.register_at_fork(before=_unplug, after_in_parent=_replug, after_in_child=_forget_in_child)


def _on_sigterm(signum: int, frame: object) -> None:
    if os.getpid() != _owner:  # a forked child's: its own end, as it was
        end_descendants()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _end_by_sigterm(main_thread=True)


def _watch_signals(fd: int) -> None:
    """The thread the wakeup fd wakes: each byte is a signal Python caught; SIGTERM ends us."""
    while True:
        try:
            got = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not got:
            return
        if signal.SIGTERM in got:
            _end_by_sigterm(main_thread=False)


def _unplug() -> None:
    """Before a fork: no wakeup fd, so that the child never writes to this process's pipe."""
    global _unplugged
    with contextlib.suppress(ValueError):  # a fork from another thread than the main one
        _unplugged = signal.set_wakeup_fd(-1)


def _replug() -> None:
    global _unplugged
    if _unplugged >= 0:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(_unplugged, warn_on_full_buffer=False)
    _unplugged = -1


def _forget_in_child() -> None:
    global _last_words, _unplugged
    _last_words, _unplugged = None, -1
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)


def _end_by_sigterm(*, main_thread: bool) -> None:
    """Last words, descendants, death by SIGTERM: once, from the first thread to get here (the
    other waits for the end; a bounded wait, then it ends the process itself)."""
    _ending.acquire(timeout=10.0)  # should the first one be stuck, the other goes on after 10 s
    words = _last_words
    if words is not None:
        with contextlib.suppress(Exception):
            words()
    with contextlib.suppress(Exception):
        end_descendants()
    _die_of_sigterm(main_thread)


def _die_of_sigterm(main_thread: bool) -> NoReturn:
    """Die of SIGTERM (the default action), from any thread; os._exit(128 + SIGTERM) where that fails."""
    with contextlib.suppress(Exception):
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        else:  # only the main thread may call signal.signal: the C library's own, then
            ctypes.CDLL(None).signal(signal.SIGTERM, SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # the signal is delivered to a thread that does not block it
    os._exit(128 + signal.SIGTERM)


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
