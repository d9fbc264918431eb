"""Start a run on this machine: the master in this process, N workers beside it.

:class:`Run` is what ``orch.launch`` returns and what ``orch run`` drives: it owns the master
and the run dir, and answers for the run (``wait``, ``state``, ``history``, ``stop``,
``close``). Its workers are a :class:`~orch.launchers.local.group.WorkerGroup`, forked from a forkserver
(see :func:`orch.launchers.local.group.worker_context`) that never held this process's gRPC threads or CUDA
state; the training function travels to them cloudpickled. A
:class:`~orch.launchers.local.group.LocalAgent` on a monitor thread collects their exit codes every
``poll_interval`` seconds, beside the master's heartbeat expiry, so a dead rank fails the
run at once instead of leaving the others blocked in a collective; it tears the group down
and restarts it as the coordinator's restart rule says.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import multiprocessing as mp
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orch.errors import OrchError
from orch.launchers.attach_file import ATTACH_FILE
from orch.launchers.clusters import kind_of
from orch.launchers.contract import RunHandle
from orch.launchers.exiting import begin_exit, launcher_exit_message, launcher_exiting
from orch.launchers.launcher import Launcher, RunParts
from orch.launchers.loaded import load_run
from orch.launchers.local.group import WorkerGroup
from orch.launchers.local.launcher import LocalLauncher
from orch.launchers.spec import LaunchSpec
from orch.master.coordinator import Coordinator
from orch.master.server import MasterServer
from orch.record.rundir import write_result
from orch.record.store import RunStore
from orch.record.writes import OwnDir
from orch.runtime.owner import process_start_time
from orch.runtime.source import SourceMap, capture
from orch.wire.auth import certificate_name, new_token, token_from_env
from orch.wire.client import MasterClient, StateMirror
from orch.wire.net import DEFAULT_RENDEZVOUS_PORT, choose_port
from orch.wire.states import RunState

log = logging.getLogger(__name__)
RENDEZVOUS_FILE = re.compile(r"rendezvous\.a[0-9]+")  # the ranks' file store, one an attempt


class Run(RunHandle):
    """A run started on this machine. Use :func:`orch.launch` to make one."""

    def __init__(
        self,
        spec: LaunchSpec,
        *,
        sources: SourceMap | None = None,
        launcher: Callable[[LaunchSpec, Coordinator, Path], Launcher] | None = None,
    ) -> None:
        """``launcher``: what gives the run its ranks (default: this machine's or Slurm's, by
        the spec); a gang's call passes its own."""
        self.spec = spec
        kind = launcher or launcher_for(spec)
        self.coordinator = spec.coordinator(
            restart_through_hosts=getattr(kind, "restarts_through_hosts", False)
        )
        self._run_id = self.coordinator.run_id
        self._run_dir = Path(spec.run_root) / self.run_id
        self.server: MasterServer | None = None
        self.launcher = kind(spec, self.coordinator, self.run_dir)
        self._parts: RunParts | None = None
        self.store: RunStore | None = None
        # The run's secret; its workers get it through their environment.
        self.token = token_from_env(spec.token) or new_token()
        self._done = threading.Event()
        self._closing = threading.Event()
        self._finish_lock = threading.Lock()
        self._monitor: threading.Thread | None = None
        # Where the function's code came from, for tracebacks that show it (notebook cells);
        # a detached run's supervisor gets them from the kernel that launched it.
        self._sources = sources if sources is not None else capture(spec.fn)
        self._meta: dict[str, Any] = {}
        self.transfer = False  # a gang's pull or push (orch.runs() leaves it out)
        self.supervised = False  # run by a detached run's supervisor, the process of its own

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    @property
    def origin(self) -> str:
        """Where its function came from: ``analysis.ipynb:train (Cell In[3])``, ``train.py:main``,
        or ``package.module:function`` (``run.json``'s ``origin``, else its ``fn``)."""
        return self._sources.origin or self.spec.fn_name

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> Run:
        try:
            self._start()
        except BaseException as e:
            # The record on disk says the launch failed, and why, not PENDING.
            self.coordinator.fail(f"the launch failed before any worker started: {e}")
            self.close()
            raise
        return self

    def _start(self) -> None:
        spec = self.spec
        _track(self)
        # The run dir first: a launch that fails below still leaves a record that says so.
        self.store = RunStore(self.run_dir)
        self.store.on_moved = self._swapped
        meta = run_meta(self.coordinator, config=spec.config, max_restarts=spec.max_restarts)
        for key in ("name", "sweep", "config_key"):
            if getattr(spec, key) is not None:
                meta[key] = getattr(spec, key)
        if self.transfer:
            meta["transfer"] = True
        if self.origin:
            meta["origin"] = self.origin
        self.server, self._meta = serve(
            self.coordinator,
            self.store,
            meta,
            host=self.launcher.master_host(spec),
            port=spec.master_port,
            token=self.token,
            tls_cert=spec.tls_cert,
            tls_key=spec.tls_key,
            port_option="master_port",
            local_socket=self.launcher.ranks_on_this_machine,
        )
        if spec.rdzv_port:  # a port the user named must be free; otherwise rank 0 binds one
            self.coordinator.rendezvous_port = choose_port(
                spec.rdzv_port,
                DEFAULT_RENDEZVOUS_PORT,
                what="torch.distributed rendezvous",
                option="rdzv_port",
            )
        self._parts = RunParts(
            spec=spec,
            run_id=self.run_id,
            run_dir=self.run_dir,
            coordinator=self.coordinator,
            store=self.store,
            meta=self._meta,
            master=self.server.local_address or self.server.address,
            token=self.token,
            tls_ca=self.tls_ca,
            tls_server_name=self.tls_server_name,
            sources=self._sources,
            closing=self._closing,
        )
        # Where its master serves, with its token, for another process of this user's:
        # `orch status RUN_ID`, orch.attach(RUN_ID) (removed when the master stops).
        self.store.folder.put_json(ATTACH_FILE, self.endpoint())
        self.launcher.submit(self._parts)
        # Workers start from the monitor thread: launch() returns at once, even while the
        # forkserver of the first launch is still importing torch.
        self._monitor = threading.Thread(target=self._supervise, name="orch-monitor", daemon=True)
        self._monitor.start()
        log.info("run %s: master on %s, %d workers", self.run_id, self.address, spec.world_size)

    # -- what the worker group knows, by the names callers use -------------------------------
    @property
    def group(self) -> WorkerGroup:
        """The ranks' processes of a run on this machine (a run on Slurm has none here)."""
        if isinstance(self.launcher, LocalLauncher):
            return self.launcher.group
        return WorkerGroup(self.coordinator, self.run_dir, self.spec.grace)

    @property
    def job(self) -> Any:
        """The cluster's job of a run on a cluster (a Slurm batch job), once submitted; else None."""
        return getattr(self.launcher, "job", None)

    @property
    def procs(self) -> list[mp.process.BaseProcess]:
        return self.group.procs

    @property
    def worker_ids(self) -> list[str]:
        return self.group.worker_ids

    @property
    def exit_codes(self) -> dict[str, int]:
        return self.group.exit_codes

    @property
    def all_exited_at(self) -> float | None:
        """Monotonic: when every worker of the run was gone."""
        return self.group.all_exited_at

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def address(self) -> str:
        """``host:port`` of this run's master."""
        return self.server.address if self.server is not None else ""

    @property
    def tls_ca(self) -> str | None:
        return self.spec.tls_ca or self.spec.tls_cert

    @functools.cached_property
    def tls_server_name(self) -> str | None:
        """The name this run's own clients verify the master's certificate for (they dial 127.0.0.1)."""
        return certificate_name(self.spec.tls_cert) if self.spec.tls_cert else None

    def connect(self) -> MasterClient | None:
        """A client of this run's master (with its token), or None once it is closed."""
        if self.server is None:
            return None
        # The private listener where there is one: strangers filling the TCP port never blind
        # the run's own panel.
        return MasterClient(
            self.server.local_address or self.address,
            token=self.token,
            tls_ca=self.tls_ca,
            tls_server_name=self.tls_server_name,
        )

    def _supervise(self) -> None:
        assert self._parts is not None
        self.launcher.supervise(self._parts)
        if not self._closing.is_set():  # close() ends the run itself, then writes the record
            self._finish()

    def _finish(self) -> None:
        with self._finish_lock:
            if self._done.is_set():
                return
            if self.store is not None:
                self._tidy(self.store.folder)
            try:
                write_result(self.coordinator, self.run_dir, self.store.folder if self.store else None)
            except (OSError, OrchError) as e:
                log.warning("run %s: could not write %s/result.json: %s", self.run_id, self.run_dir, e)
            self._done.set()

    def _tidy(self, folder: OwnDir) -> None:
        """The ranks are done: their rendezvous files go (they hold the store's keys), and a run
        whose dir was renamed and replaced behind its back fails, saying so."""
        for name in folder.names():
            if RENDEZVOUS_FILE.fullmatch(name):
                folder.remove(name)
        moved = folder.moved()
        if moved:
            self._swapped(moved)

    def _swapped(self, moved: str) -> None:
        log.error("run %s: %s", self.run_id, moved)
        self.coordinator.fail(
            f"the run dir was swapped while the run ran: {moved}; the run's record stays in the folder "
            "it was made as, wherever that is now"
        )

    def _ended(self) -> threading.Event:
        return self._done

    def _last_state(self) -> str:
        return self.coordinator.state.value

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def state(self) -> StateMirror:
        """A full snapshot of the run, read from the master in this process."""
        return StateMirror.of(self.coordinator)

    def history(self) -> dict[str, dict[int, dict[str, list[float]]]]:
        """``{metric: {rank: {"step": [...], "value": [...]}}}`` for every logged scalar."""
        if self.coordinator.trimmed and self.store is not None:
            # The oldest points left the master's memory; the run dir has them all.

            self.store.sync()
            return load_run(self.run_dir).history()
        return self.state().history()

    def stop(self, reason: str = "stopped by the user", *, prune: bool = False) -> RunState:
        """Ask every rank to finish its current step and end; returns at once. ``prune``: a
        sweep's pruner stops it, and it ends PRUNED rather than STOPPED."""
        return self.coordinator.request_stop(reason, prune=prune)

    def close(self) -> None:
        """Tear everything down: workers (SIGTERM, grace, SIGKILL), then the master.

        A run still going is ended first (STOPPED if a stop was asked for, else FAILED), so
        ``result.json``, written last, holds the state the run really ended in.
        """
        self._closing.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(60.0)  # it may be starting the workers' forkserver
        # Exits the monitor had no time to see name the root cause before the tear-down does.
        self.launcher.collect_exits()
        if self.coordinator.state is RunState.RESTARTING:
            self.coordinator.give_up("the run was closed")
        elif not self.coordinator.state.done:
            self.coordinator.close_run(
                launcher_exit_message()
                if launcher_exiting()
                else "the run was closed while it was running (run.close(), the end of a `with` "
                "block, or the process exiting): its ranks were terminated"
            )
        self.launcher.end()
        self._stop_server()
        self._finish()
        self._close_store()

    def _close_store(self) -> None:
        if self.store is not None:
            self.store.close()

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0.5)
            self.server = None
        if self.store is not None:
            with contextlib.suppress(OSError, OrchError):
                self.store.folder.remove(ATTACH_FILE)  # its address and token are good for nothing now

    def endpoint(self) -> dict[str, Any]:
        """What ``attach.json`` says of this run (:mod:`orch.launchers.attach_file`)."""
        return {
            "run_id": self.run_id,
            "address": self.address,
            "token": self.token,
            "tls_ca": os.path.abspath(self.tls_ca) if self.tls_ca else None,
            "tls_server_name": self.tls_server_name,
            "pid": os.getpid(),
            "start_time": process_start_time(os.getpid()),
            "host": socket.gethostname(),
            "kind": "supervisor" if self.supervised else "launcher",
        }

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the notebook panel -------------------------------------------------------------
    def log_files(self) -> dict[str, Path]:
        return self.launcher.log_files()

    def final_state(self) -> StateMirror | None:
        return self.state() if self.server is None or self.done else None

    def __repr__(self) -> str:
        return f"<orch.Run {self.run_id} {self.coordinator.state.value} world_size={self.spec.world_size}>"


def run_meta(coordinator: Coordinator, *, config: dict[str, Any], max_restarts: int) -> dict[str, Any]:
    """What ``run.json`` says of a run from the start: what runs, and which process answers for it."""
    meta = {
        "run_id": coordinator.run_id,
        "fn": coordinator.plan.fn,
        "world_size": coordinator.world_size,
        "config": config,
        "max_restarts": max_restarts,
        "started": time.time(),
        # Which process answers for the run while it goes: ``orch.runs()`` tells a run still
        # going from one whose launching process died before writing its result.
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    if coordinator.plan.seed is not None:  # rank r seeded its generators with seed + r
        meta["seed"] = coordinator.plan.seed
    return meta


def serve(
    coordinator: Coordinator,
    store: RunStore,
    meta: dict[str, Any],
    *,
    host: str,
    port: int | None,
    token: str,
    tls_cert: str | None,
    tls_key: str | None,
    port_option: str = "--port",
    local_socket: bool = False,
) -> tuple[MasterServer, dict[str, Any]]:
    """A run's master, serving: ``run.json`` is written first (a master that cannot start still
    leaves a record), then again with the address it serves on. ``orch.launch``, ``orch run``
    and ``orch master`` all start theirs here."""
    store.write_meta(meta)
    coordinator.store = store
    server = MasterServer(
        coordinator,
        host=host,
        port=port,
        token=token,
        tls_cert=tls_cert,
        tls_key=tls_key,
        port_option=port_option,
        local_socket=local_socket,
    ).start()
    meta = {**meta, "master": server.address}
    store.write_meta(meta)
    return server, meta


def launcher_for(spec: LaunchSpec) -> type[Launcher]:
    """The launcher of a run: this machine's, or its cluster kind's."""
    if spec.cluster is None:
        return LocalLauncher
    launcher: type[Launcher] = kind_of(spec.cluster).launcher()
    return launcher


_LIVE: weakref.WeakSet[Run] = weakref.WeakSet()
_atexit_registered = False


def _track(run: Run) -> None:
    """Remember live runs so that they are torn down when the interpreter (kernel) exits."""
    _LIVE.add(run)
    register_exit_hook()


def register_exit_hook() -> None:
    """Tear down this process's live runs when it exits (once; hooks registered later run first)."""
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_close_at_exit)
        _atexit_registered = True


def live_runs() -> list[Run]:
    return [r for r in list(_LIVE) if not r.done]


def _close_at_exit() -> None:
    """The exit hook: the runs still live end because their launcher exits."""
    begin_exit()
    close_all_runs()


def close_all_runs() -> None:
    for run in list(_LIVE):
        with contextlib.suppress(Exception):
            run.close()
