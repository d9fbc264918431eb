"""Start a run on this machine: the master in this process, N workers beside it.

:class:`Run` is what ``orch.launch`` returns and what ``orch run`` drives: it owns the master
and the run dir, and answers for the run (``wait``, ``state``, ``history``, ``stop``,
``close``). Its workers are a :class:`~orch.launchers.group.WorkerGroup`, forked from a forkserver
(see :func:`orch.launchers.group.worker_context`) that never held this process's gRPC threads or CUDA
state; the training function travels to them cloudpickled. A
:class:`~orch.launchers.group.LocalAgent` on a monitor thread collects their exit codes every
``poll_interval`` seconds, beside the master's heartbeat expiry, so a dead rank fails the
run at once instead of leaving the others blocked in a collective; it tears the group down
and restarts it as the coordinator's restart rule says.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import math
import multiprocessing as mp
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orch.errors import ConfigError, RunFailed
from orch.launchers.contract import RunHandle, RunResult, still_running
from orch.launchers.group import LocalAgent, WorkerGroup
from orch.launchers.loaded import load_run
from orch.launchers.slurm import (
    JobStatus,
    Slurm,
    SlurmJob,
    check_commands,
    cluster_master_host,
    follow_job,
    job_script,
    write_function,
)
from orch.master.coordinator import Coordinator
from orch.master.server import MasterServer
from orch.record.rundir import write_result
from orch.record.store import RunStore, private_dir
from orch.runtime._owner import Owner
from orch.runtime._source import SourceMap, capture
from orch.runtime._target import TrainFn, resolve_fn
from orch.runtime.spec import WorkerSpec
from orch.wire._net import DEFAULT_RENDEZVOUS_PORT, choose_port
from orch.wire.auth import TOKEN_ENV, certificate_name, new_token, token_from_env
from orch.wire.client import MasterClient, StateMirror
from orch.wire.states import RunState

log = logging.getLogger(__name__)


@dataclass
class LaunchSpec:
    """What to run and how; validated before anything starts."""

    fn: TrainFn | str | None = None
    world_size: int = 4
    config: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    master_host: str = "127.0.0.1"
    master_port: int | None = None
    rdzv_port: int | None = None
    run_root: str = "runs"
    heartbeat_timeout: float = 30.0
    heartbeat_interval: float = 0.25
    threads: int | None = None
    poll_interval: float = 0.1
    grace: float = 1.5
    max_restarts: int = 0
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None  # default: tls_cert itself (a self-signed certificate)
    token: str | None = None  # default: $ORCH_TOKEN, else a new random one
    name: str | None = None  # what the run is called in ``orch.runs()``
    sweep: str | None = None  # the sweep it belongs to, and its config's key there
    config_key: str | None = None
    cluster: Slurm | None = None  # run on a Slurm cluster rather than on this machine
    min_world_size: int | None = None  # elastic restarts on a cluster: go on without lost nodes

    workdir: str = field(default_factory=os.getcwd)  # where workers run and find ``fn``

    def __post_init__(self) -> None:
        _check_fn(self.fn, self.workdir)
        _check_int("world_size", self.world_size, 1)
        if self.cluster is None:
            _check_fits(self.world_size)
        else:
            _check_cluster(self.cluster, self.world_size)
        if not isinstance(self.config, dict):
            raise ConfigError(
                f"config must be a dict (it reaches the function as ctx.config), got "
                f"{type(self.config).__name__} {self.config!r:.60}"
            )
        self.config = dict(self.config)  # the caller's dict stays as it was
        if self.steps is not None:
            _check_int("steps", self.steps, 1)
            self.config["steps"] = self.steps
        try:
            json.dumps(self.config, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"config must be JSON-serialisable (numbers, strings, lists, dicts): {e}"
            ) from e
        for option in ("master_port", "rdzv_port"):
            port = getattr(self, option)
            if port is not None:
                _check_int(option, port, 0, 65535, hint="0 for any free port; leave it out for the default")
        if self.threads is not None:
            _check_int("threads", self.threads, 1)
        _check_int("max_restarts", self.max_restarts, 0)
        if self.min_world_size is not None:
            _check_int("min_world_size", self.min_world_size, 1, self.world_size)
            if self.cluster is None or self.max_restarts < 1:
                raise ConfigError(
                    "min_world_size makes restarts across nodes elastic: it needs cluster=orch.Slurm(...) "
                    "and max_restarts >= 1"
                )
        _check_seconds("heartbeat_timeout", self.heartbeat_timeout)
        _check_seconds("heartbeat_interval", self.heartbeat_interval)
        if self.heartbeat_timeout <= self.heartbeat_interval * 2:
            raise ConfigError(
                f"heartbeat_timeout={self.heartbeat_timeout:g}s must be well above the heartbeat "
                f"interval ({self.heartbeat_interval:g}s): pass a few seconds at least"
            )
        if not isinstance(self.run_root, (str, os.PathLike)):
            raise ConfigError(f"run_root must be a folder path, got {type(self.run_root).__name__}")

    @property
    def fn_name(self) -> str:
        if self.fn is None:
            return "orch.example:train"
        if isinstance(self.fn, str):
            return self.fn
        return f"{getattr(self.fn, '__module__', '?')}:{getattr(self.fn, '__qualname__', '?')}"


MAX_WORKERS_PER_CORE = 8


def _check_cluster(cluster: Any, world_size: int) -> None:
    if not isinstance(cluster, Slurm):
        raise ConfigError(f"cluster must be an orch.Slurm(...), got {type(cluster).__name__}")
    if cluster.world_size != world_size:
        raise ConfigError(
            f"world_size={world_size} but the cluster runs {cluster.describe()}, {cluster.world_size} "
            f"ranks: pass world_size={cluster.world_size} or change nodes / tasks_per_node"
        )
    check_commands()


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None, *, hint: str = "") -> None:
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(
            f"{name} must be an integer {bounds}{f' ({hint})' if hint else ''}, "
            f"got {type(value).__name__} {value!r}"
        )


def _check_seconds(name: str, value: Any) -> None:
    real = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not real or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive, finite number of seconds, got {value!r}")


def _check_fits(world_size: int) -> None:
    cores = os.cpu_count() or 1
    if world_size > MAX_WORKERS_PER_CORE * cores:
        raise ConfigError(
            f"world_size={world_size} does not fit this machine ({cores} CPU cores; at most "
            f"{MAX_WORKERS_PER_CORE * cores} local workers): pass a smaller world_size, or start "
            "`orch master` and `orch worker` on more machines"
        )


def _check_fn(fn: Any, workdir: str) -> None:
    """The training function exists and can travel to the workers, before anything starts."""
    if fn is None:
        return
    if isinstance(fn, str):
        resolve_fn(fn, workdir)
        return
    if not callable(fn):
        raise ConfigError(f"train must be a function, an import path or None, got {type(fn).__name__}")
    import cloudpickle

    try:
        cloudpickle.dumps(fn)
    except Exception as e:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ConfigError(
            f"the training function {name} cannot be sent to the worker processes: {e}. "
            "It must be picklable by cloudpickle: move what it closes over that cannot be pickled "
            "(an open file, a lock, a live model on a GPU) inside the function, and create it there."
        ) from e


class Run(RunHandle):
    """A run started on this machine. Use :func:`orch.launch` to make one."""

    def __init__(self, spec: LaunchSpec, *, sources: SourceMap | None = None) -> None:
        self.spec = spec
        self.coordinator = Coordinator(
            spec.world_size,
            fn=spec.fn_name,
            config_json=json.dumps(spec.config),
            total_steps=int(spec.config.get("steps", 0) or 0),
            heartbeat_timeout=spec.heartbeat_timeout,
            max_attempts=spec.max_restarts + 1,
            # On a cluster each node's host agent starts its ranks again for a restart.
            restart_through_hosts=spec.cluster is not None,
            min_world_size=spec.min_world_size,
        )
        self._run_id = self.coordinator.run_id
        self._run_dir = Path(spec.run_root) / self.run_id
        self.server: MasterServer | None = None
        self.group = WorkerGroup(self.coordinator, self.run_dir, spec.grace)
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
        self.job: SlurmJob | None = None  # the batch job of a run on a Slurm cluster
        self._meta: dict[str, Any] = {}

    @property
    def run_dir(self) -> Path:
        return self._run_dir

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
        meta = {
            "run_id": self.run_id,
            "fn": spec.fn_name,
            "world_size": spec.world_size,
            "config": spec.config,
            "max_restarts": spec.max_restarts,
            "started": time.time(),
            # Which process answers for the run while it goes: ``orch.runs()`` tells a run
            # still going from one whose launching process died before writing its result.
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        for key in ("name", "sweep", "config_key"):
            if getattr(spec, key) is not None:
                meta[key] = getattr(spec, key)
        self.store.write_meta(meta)
        self.coordinator.store = self.store
        self.server = MasterServer(
            self.coordinator,
            host=spec.master_host if spec.cluster is None else cluster_master_host(spec.cluster),
            port=spec.master_port,
            token=self.token,
            tls_cert=spec.tls_cert,
            tls_key=spec.tls_key,
        ).start()
        self._meta = {**meta, "master": self.server.address}
        self.store.write_meta(self._meta)
        if spec.rdzv_port:  # a port the user named must be free; otherwise rank 0 binds one
            self.coordinator.rendezvous_port = choose_port(
                spec.rdzv_port,
                DEFAULT_RENDEZVOUS_PORT,
                what="torch.distributed rendezvous",
                option="rdzv_port",
            )
        if spec.cluster is not None:
            self._submit(spec.cluster)
        # Workers start from the monitor thread: launch() returns at once, even while the
        # forkserver of the first launch is still importing torch.
        self._monitor = threading.Thread(target=self._supervise, name="orch-monitor", daemon=True)
        self._monitor.start()
        log.info("run %s: master on %s, %d workers", self.run_id, self.address, spec.world_size)

    def _worker_specs(self, attempt: int) -> list[WorkerSpec]:
        """The workers of one attempt: each dials this run's master, with its token."""
        spec = self.spec
        assert self.server is not None
        prefix = f"{self.run_id}-w" if attempt == 1 else f"{self.run_id}-a{attempt}-w"
        private_dir(self.run_dir)
        private_dir(self.run_dir / "logs")
        threads = spec.threads or max(1, (os.cpu_count() or 1) // spec.world_size)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            TOKEN_ENV: self.token,
        }
        owner = Owner()
        return [
            WorkerSpec(
                master=self.server.address,
                worker_id=f"{prefix}{i}",
                fn=spec.fn,
                config=spec.config,
                local_rank=i,
                local_world_size=spec.world_size,
                advertise_addr="127.0.0.1",
                threads=threads,
                heartbeat_interval=spec.heartbeat_interval,
                master_timeout=spec.heartbeat_timeout,
                owner=owner,
                env=env,
                log_file=str(self.run_dir / "logs" / f"{prefix}{i}.log"),
                run_root=spec.run_root,
                tls_ca=self.tls_ca,
                tls_server_name=self.tls_server_name,
                workdir=spec.workdir,
                sources=self._sources,
            )
            for i in range(spec.world_size)
        ]

    # -- what the worker group knows, by the names callers use -------------------------------
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
        return MasterClient(
            self.address, token=self.token, tls_ca=self.tls_ca, tls_server_name=self.tls_server_name
        )

    def _supervise(self) -> None:
        if self.job is not None:
            try:
                follow_job(self.job, self.coordinator, self._closing, grace=self.spec.grace)
            except Exception as e:  # the run must still end, with its record, whatever broke here
                log.exception("run %s: following Slurm job %s failed", self.run_id, self.job.job_id)
                self.coordinator.fail(f"orch lost track of Slurm job {self.job.job_id}: {e}")
            if not self._closing.is_set():
                self._finish()
            return
        agent = LocalAgent(
            self.coordinator,
            self.group,
            self._worker_specs,
            poll_interval=self.spec.poll_interval,
            closing=self._closing,
        )
        agent.run()
        if not self._closing.is_set():  # close() ends the run itself, then writes the record
            self._finish()

    def _submit(self, cluster: Slurm) -> None:
        """Submit the run's Slurm job; a refusal (no such partition, say) fails the launch."""
        spec = self.spec
        job = self.job = SlurmJob(cluster, {**os.environ, TOKEN_ENV: self.token}, self.run_id)
        private_dir(self.run_dir / "logs")  # the ranks' logs, written on the nodes
        if callable(spec.fn):
            # The function reaches the nodes through the run dir, signed with the token.
            fn_arg = [
                "--fn-file",
                str(write_function(self.run_dir.resolve(), spec.fn, self._sources, self.token)),
            ]
        else:
            fn_arg = ["--fn", spec.fn_name]
        assert self.server is not None and self.store is not None
        script = job_script(
            cluster,
            run_id=self.run_id,
            run_dir=self.run_dir.resolve(),
            master=self.server.address,
            run_root=str(Path(spec.run_root).resolve()),
            workdir=spec.workdir,
            fn_arg=fn_arg,
            tls_ca=str(Path(self.tls_ca).resolve()) if self.tls_ca else None,
            heartbeat_timeout=spec.heartbeat_timeout,
            elastic=spec.min_world_size is not None,
        )
        job.submit(script, self.run_dir)
        self.coordinator.set_job(job.as_pb(JobStatus("PENDING")))
        self._meta["slurm_job"] = job.job_id
        self.store.write_meta(self._meta)
        log.info("run %s: Slurm job %s submitted (%s)", self.run_id, job.job_id, cluster.describe())

    def _finish(self) -> None:
        with self._finish_lock:
            if self._done.is_set():
                return
            try:
                write_result(self.coordinator, self.run_dir)
            except OSError as e:
                log.warning("run %s: could not write %s/result.json: %s", self.run_id, self.run_dir, e)
            self._done.set()

    def wait(self, timeout: float | None = None, interval: float = 0.5) -> RunResult:
        """Block until the run ends; raise :class:`orch.RunFailed` if it failed.

        In JupyterLab the panel's Stop button works while a cell waits here. Interrupting
        the kernel returns control and leaves the run going (the message says how to stop it).
        """
        try:
            finished = self._done.wait(timeout)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(still_running(self.run_id, self.coordinator.state.value)) from None
        if not finished:
            raise TimeoutError(f"run {self.run_id} still {self.coordinator.state.value} after {timeout}s")
        if self._panel is not None:
            self._panel.refresh()  # the final state is drawn before the waiting cell goes on
        return self.result()

    def result(self) -> RunResult:
        coord = self.coordinator
        if coord.state is RunState.FAILED:
            cause = coord.root_cause
            raise RunFailed(
                f"run {self.run_id} failed: {coord.failure}",
                rank=cause.rank if cause else None,
                exit_code=cause.exit_code if cause else None,
                traceback=cause.error if cause else "",
                state=self.state(),
            )
        return RunResult.of(self.state(), self.run_dir)

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

    def stop(self, reason: str = "stopped by the user") -> RunState:
        """Ask every rank to finish its current step and end; returns at once."""
        return self.coordinator.request_stop(reason)

    def close(self) -> None:
        """Tear everything down: workers (SIGTERM, grace, SIGKILL), then the master.

        A run still going is ended first (STOPPED if a stop was asked for, else FAILED), so
        ``result.json``, written last, holds the state the run really ended in.
        """
        self._closing.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(60.0)  # it may be starting the workers' forkserver
        # Exits the monitor had no time to see name the root cause before the tear-down does.
        self.group.collect_exits()
        if self.coordinator.state is RunState.RESTARTING:
            self.coordinator.give_up("the run was closed")
        elif not self.coordinator.state.done:
            self.coordinator.close_run(
                "the run was closed while it was running (run.close(), the end of a `with` "
                "block, or the process exiting): its ranks were terminated"
            )
        self.group.terminate()
        if self.job is not None:
            self.job.cancel()  # the monitor cancels it too; a launch that failed early has none
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

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the notebook panel -------------------------------------------------------------
    def log_files(self) -> dict[str, Path]:
        if self.job is not None:  # each rank writes its own, in the shared run dir
            return {r.worker_id: self.run_dir / "logs" / f"{r.worker_id}.log" for r in self.coordinator.ranks}
        return {wid: self.run_dir / "logs" / f"{wid}.log" for wid in self.worker_ids}

    def final_state(self) -> StateMirror | None:
        return self.state() if self.server is None or self.done else None

    def __repr__(self) -> str:
        return f"<orch.Run {self.run_id} {self.coordinator.state.value} world_size={self.spec.world_size}>"


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
        atexit.register(close_all_runs)
        _atexit_registered = True


def live_runs() -> list[Run]:
    return [r for r in list(_LIVE) if not r.done]


def close_all_runs() -> None:
    for run in list(_LIVE):
        with contextlib.suppress(Exception):
            run.close()
