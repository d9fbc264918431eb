"""The worker processes of a run on this machine, and the agent that supervises them.

As torch elastic separates a worker spec, a worker group and an agent: :class:`LaunchSpec`
(:mod:`orch.launchers.run`) says what to run; a :class:`WorkerGroup` is the processes of one
attempt, started together, their exits reported to the master's coordinator and torn down
together; the :class:`LocalAgent` watches the group, tears it down when the run fails,
and starts the next attempt when the coordinator's restart rule allows one.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

from orch.errors import OrchError
from orch.launchers._frozen import dump
from orch.launchers.exiting import launcher_exit_message, launcher_exiting
from orch.master.coordinator import Coordinator
from orch.record.store import json_object, tail
from orch.runtime._children import end_marked
from orch.runtime.fatal import MAX_BYTES, explain
from orch.runtime.memory import OomCounter
from orch.runtime.source import SourceMap
from orch.runtime.spec import WorkerSpec
from orch.runtime.target import EXAMPLE
from orch.runtime.worker import spawn_main
from orch.wire.states import RunState

log = logging.getLogger(__name__)


# Modules a worker needs that take long to import: the forkserver imports them once.
# (DistributedDataParallel's first construction imports torch._dynamo: 800 modules, ~1-2 s.)
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "orch.runtime._forkserver",  # last: its atexit hook runs first
]
EXAMPLE_PRELOAD = "sklearn.datasets"  # the built-in example's data (0.5-1 s more): for it alone


def worker_context(example: bool = False) -> mp.context.ForkServerContext:
    """The multiprocessing context workers start from: a forkserver with torch imported.

    The forkserver is a fresh process (never a fork of this one, so it holds none of this
    process's gRPC or CUDA state) that imports torch once and then forks a worker in
    milliseconds for each launch; it exits with this process. Environment variables do not
    reach it after it started, so each worker gets its launcher's in its WorkerSpec.
    """
    global _preload_set
    ctx: mp.context.ForkServerContext = mp.get_context("forkserver")
    if not _preload_set:
        ctx.set_forkserver_preload([EXAMPLE_PRELOAD, *PRELOAD] if example else PRELOAD)
        _preload_set = True
    return ctx


_preload_set = False
_pool_started = False  # the forkserver has imported torch: a start forks in milliseconds


def starting_phase(workers: int) -> str:
    """What a start of ``workers`` workers is busy with, for the panel before they register."""
    what = f"starting {workers} worker{'s' if workers != 1 else ''}"
    return what if _pool_started else f"{what}: importing torch (the worker pool's first start)"


def pool_running() -> bool:
    """The workers' forkserver of this process is started (a launch forks from it at once)."""
    server = getattr(forkserver, "_forkserver", None)
    return getattr(server, "_forkserver_pid", None) is not None


@contextlib.contextmanager
def _main_not_inherited() -> Iterator[None]:
    """Start children without re-running this process's ``__main__`` in them.

    multiprocessing re-imports the parent's main module in each child; a notebook's,
    ``python -`` or a script with side effects cannot be, and workers never need it: the
    training function travels cloudpickled, by value. A bare stand-in hides it during start().
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class WorkerGroup:
    """The worker processes of one attempt (a new :meth:`start` replaces the last one's).

    ``exit_codes`` keeps every worker's exit code over all attempts; ``all_exited_at``
    (monotonic) is when the last one of the group was gone.
    """

    def __init__(self, coordinator: Coordinator, run_dir: Path, grace: float) -> None:
        self.coordinator = coordinator
        self.run_dir = run_dir
        self.grace = grace
        self.procs: list[mp.process.BaseProcess] = []
        self.worker_ids: list[str] = []
        self.exit_codes: dict[str, int] = {}
        self.all_exited_at: float | None = None
        self._exited: dict[int, int] = {}
        self._oom: list[OomCounter] = []  # each worker's cgroup's OOM kills, counted from its start
        self.sources = SourceMap()  # where the training function's code came from (cells)
        # Seconds its first start spent starting the workers' pool (the forkserver importing
        # torch): 0 when the pool was warm. A sweep shows it apart from the run's own time.
        self.pool_start_seconds = 0.0

    def start(self, specs: list[WorkerSpec]) -> None:
        import cloudpickle

        ctx = worker_context(example=any(s.fn in (None, EXAMPLE) for s in specs))  # None: the example
        self.worker_ids = [s.worker_id for s in specs]
        self.sources = specs[0].sources if specs else SourceMap()
        self.procs, self._exited, self.all_exited_at, self._oom = [], {}, None, []
        cold = not pool_running()
        for wspec in specs:
            p = ctx.Process(
                target=spawn_main, args=(cloudpickle.dumps(wspec),), name=f"orch-{wspec.worker_id}"
            )
            began = time.monotonic()
            with _main_not_inherited():
                p.start()  # the first start of a cold pool waits until the forkserver imported torch
            if cold:
                self.pool_start_seconds += time.monotonic() - began
                cold = False
            self.procs.append(p)
            self._oom.append(OomCounter(p.pid or 0))
        global _pool_started
        _pool_started = True

    @property
    def all_exited(self) -> bool:
        return len(self._exited) == len(self.procs)

    def collect_exits(self, expected: bool = False) -> None:
        """Tell the coordinator of every worker that exited since the last call."""
        for i, p in enumerate(self.procs):
            if i in self._exited or p.exitcode is None:
                continue
            wid = self.worker_ids[i]
            self._exited[i] = p.exitcode
            self.exit_codes[wid] = p.exitcode
            if launcher_exiting():
                # The launcher is going away and its workers with it: the run ends for that
                # reason, before any exit could name a rank (their codes may not even be
                # readable: a forkserver terminated with the kernel makes each read 255).
                self.coordinator.close_run(launcher_exit_message())
                ended = "it ended with its launcher"
                self.coordinator.rank_exited(wid, p.exitcode, detail=ended, expected=True)
                continue
            # After a tear-down, a SIGTERM or SIGKILL is ours; any other death is the worker's own.
            ours = expected and p.exitcode in (-signal.SIGTERM, -signal.SIGKILL)
            code, record = p.exitcode, self._error_record(wid) if p.exitcode else {}
            if ours and isinstance(record.get("exit_code"), int) and self.coordinator.rank_reported(wid):
                # A failed rank killed at the end of the grace while it delivered its last
                # points: the code of its own failure stands, not our SIGKILL.
                code = record["exit_code"]
            detail, cause = (str(record.get("traceback", "")), "") if record else self._log_tail(wid, code)
            oom = code == -signal.SIGKILL and not ours and self._oom[i].rose()
            self.coordinator.rank_exited(wid, code, detail=detail, expected=ours, cause=cause, oom_killed=oom)
        if self.all_exited and self.all_exited_at is None:
            self.all_exited_at = time.monotonic()
            # What a rank started and left behind: a rank killed outright (SIGKILL, the OOM
            # killer) could not end it, and its orphans went to init (orch.runtime._children).
            left = end_marked(self.coordinator.run_id)
            if left:
                log.warning(
                    "run %s: ended %d process(es) its ranks left behind", self.coordinator.run_id, left
                )

    def _error_record(self, worker_id: str) -> dict[str, Any]:
        """The error file a failed worker left (empty when it left none or it is unreadable)."""
        path = self.run_dir / "errors" / f"{worker_id}.json"
        with contextlib.suppress(OSError, OrchError):
            return json_object(path.read_bytes(), str(path), "")
        return {}

    def _log_tail(self, worker_id: str, code: int) -> tuple[str, str]:
        """What a dead worker that left no error file left in its log: (its failure, one line
        of it). A fatal error's dump is read as its training thread's stack and the native
        library's explanation; any other log gives its last lines, and no line."""
        if code == 0:
            return "", ""
        path = self.run_dir / "logs" / f"{worker_id}.log"
        explained = explain(tail(path, 10_000, MAX_BYTES), self.sources, f"logs/{worker_id}.log")
        return explained if explained is not None else (tail(path, 30), "")

    def _dump_frozen(self) -> None:
        """Before a tear-down: the stack of each rank the master lost while its process still
        lives (frozen whole), read from outside (see :mod:`orch.launchers._frozen`)."""
        frozen = set(self.coordinator.lost_workers())
        for i, p in enumerate(self.procs):
            wid = self.worker_ids[i]
            if wid in frozen and p.exitcode is None and p.pid is not None:
                self.coordinator.outside_stack(wid, dump(p.pid))

    def terminate(self) -> None:
        """SIGTERM, a bounded grace, SIGKILL, join — all against one deadline, then the exits
        are collected as the tear-down's own.

        A rank that already reported its end is leaving by itself (delivering its last
        points): it gets the grace without a SIGTERM, so its own exit code stays on record.
        """
        alive = [p for p in self.procs if p.exitcode is None]
        self._dump_frozen()
        for i, p in enumerate(self.procs):
            if p.exitcode is not None or self.coordinator.rank_reported(self.worker_ids[i]):
                continue
            with contextlib.suppress(ProcessLookupError, AttributeError, TypeError):
                p.terminate()
                # A stopped (SIGSTOP, hung) worker only acts on SIGTERM once continued.
                os.kill(p.pid, signal.SIGCONT)  # type: ignore[arg-type]
        deadline = time.monotonic() + self.grace
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in alive:
            if p.exitcode is None and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in alive:
            p.join(5.0)
        self.collect_exits(expected=True)


END_WAIT = 3.0  # seconds a run's processes get to exit by themselves once it ended


class LocalAgent:
    """Supervises a :class:`WorkerGroup` from its own thread: every ``poll_interval`` it
    collects exits; when the run fails it tears the group down, then starts the next attempt
    (``specs_for``) if the coordinator's restart rule allows one, else ends the run."""

    def __init__(
        self,
        coordinator: Coordinator,
        group: WorkerGroup,
        specs_for: Callable[[int], list[WorkerSpec]],
        *,
        poll_interval: float,
        closing: threading.Event,
    ) -> None:
        self.coordinator = coordinator
        self.group = group
        self.specs_for = specs_for  # the workers' specs of an attempt
        self.poll_interval = poll_interval
        self.closing = closing  # set by the run's close(): no restart, no record here

    def run(self) -> None:
        """Supervise until the run ends, or until close() takes over."""
        coord, group = self.coordinator, self.group
        done_since: float | None = None
        try:
            self.start_group()
        except Exception as e:
            log.exception("run %s: could not start its workers", coord.run_id)
            coord.fail(f"could not start the worker processes: {e}")
        while not self.closing.is_set():
            group.collect_exits()
            if coord.state.failing:
                group.terminate()
                if coord.state is RunState.RESTARTING and coord.stop_requested:
                    # Stop pressed while the group was being torn down for a restart: no
                    # next attempt; the run ends as the user asked.
                    coord.close_run("stopped while restarting: the next attempt was not started")
                    return
                reason = self.restart_refused()
                if reason is None and coord.state is RunState.RESTARTING:
                    coord.restart()
                    log.warning(
                        "run %s: restarting (attempt %d of %d)",
                        coord.run_id,
                        coord.attempt,
                        coord.max_attempts,
                    )
                    self.start_group()
                    continue
                coord.give_up(reason or "")
                return
            if group.all_exited:
                if not coord.state.done:
                    coord.fail("every worker exited before the run finished")
                return
            if coord.state.done:
                # Ended, but processes remain: ranks the master ended (a stop they never
                # reached) leave on its ABORT; what does not (a frozen process) is terminated.
                done_since = done_since if done_since is not None else time.monotonic()
                if time.monotonic() - done_since > END_WAIT:
                    group.terminate()
                    return
            time.sleep(self.poll_interval)

    def start_group(self) -> None:
        """Start this attempt's workers, telling the master what it waits for meanwhile."""
        specs = self.specs_for(self.coordinator.attempt)
        self.coordinator.starting(starting_phase(len(specs)))
        self.group.start(specs)
        self.coordinator.starting(f"{len(specs)} workers started: waiting for them to register")

    def restart_refused(self) -> str | None:
        """Why this failure must not restart the group (None: restart it): the coordinator's
        rule, and a run being closed."""
        refusal = self.coordinator.restart_refusal()
        if refusal is None and self.closing.is_set():
            return "the run was closed"
        return refusal
