"""A worker: register with the master, pass the start barrier, train, report back.

Run as ``orch worker --master HOST:PORT`` (or ``python -m orch.worker --master HOST:PORT``,
as torchrun and srun start it) or spawned by the launcher through :func:`spawn_main`. The
training function is either a callable carried from the launcher to its own children
(cloudpickled, never over the network) or an import path ``package.module:function``.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import faulthandler
import json
import logging
import os
import re
import signal
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from ._launcher_env import LaunchedAs
from ._net import (
    DEFAULT_RENDEZVOUS_PORT,
    address_towards,
    interface_for,
    is_local_address,
    split_address,
)
from ._owner import Owner, exit_when_gone
from ._proto import orchestrator_pb2 as pb
from ._proto import orchestrator_pb2_grpc as pb_grpc
from ._rpc import UNREACHABLE, rpc_error
from ._sender import HeartbeatSender
from ._source import SourceMap, install, label_cells
from ._target import EXAMPLE, TrainFn, resolve_fn
from .auth import open_channel, token_from_env
from .errors import ConfigError, PortInUseError, StopTraining, WorkerError
from .states import EXIT_ABORTED, describe_exit
from .store import private_dir, write_json_atomic

if TYPE_CHECKING:
    from .agent import HostAgent

log = logging.getLogger(__name__)

# `python -m orch.worker` imports the package first, whose launcher imports this module, so
# runpy warns that it runs a module already imported. Harmless here: run as __main__ this
# file only hands its arguments to orch.cli (see main below), which uses the first import.
warnings.filterwarnings(
    "ignore", message=r"'orch\.worker' found in sys\.modules", category=RuntimeWarning, module="runpy"
)

EXIT_FAILED = 1


@dataclass
class WorkerSpec:
    """How one worker process joins a run."""

    master: str
    worker_id: str = ""
    fn: TrainFn | str | None = None  # None: the function the master names (see trust_master)
    config: dict[str, Any] | None = None  # None: the master's config
    local_rank: int = 0
    local_world_size: int = 1
    advertise_addr: str | None = None
    threads: int | None = None
    register_timeout: float = 60.0
    barrier_timeout: float = 300.0
    heartbeat_interval: float = 0.25
    master_timeout: float | None = None  # None: the master's heartbeat timeout
    collective_timeout: float = 1800.0
    run_root: str = "runs"  # checkpoints and error files go to run_root/<run-id>/
    owner: Owner | None = None  # end when this process (the launcher) is gone
    token: str | None = None  # None: $ORCH_TOKEN
    tls_ca: str | None = None  # verify the master's TLS certificate against this CA
    tls_server_name: str | None = None  # ... for this name (default: the master's address)
    # Without ``fn``, run the function the master names even over a channel not verified
    # with ``tls_ca`` (the built-in example runs either way).
    trust_master: bool = False
    log_file: str | None = None
    log_dir: str | None = None  # without log_file: write to log_dir/<worker id>.log
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None  # the folder to run in and to find ``fn`` from (default: this one)
    sources: SourceMap = field(default_factory=SourceMap)  # where ``fn``'s code came from
    # Started by torchrun or srun: the rank (and world size) its launcher gave, which this
    # worker asks the master for. None: the master's next free rank.
    launched: LaunchedAs | None = None

    def __post_init__(self) -> None:
        split_address(self.master)
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{self.local_rank}"
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ConfigError(
                f"local_rank {self.local_rank} does not fit local_world_size {self.local_world_size}"
            )


def _set_threads(spec: WorkerSpec) -> None:
    import torch

    # As torchrun does: N processes on one host share its cores instead of each taking all.
    # The CPUs this process may run on (a Slurm step or taskset gives fewer than the host has).
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = spec.threads or max(1, cpus // spec.local_world_size)
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # only settable before the first parallel op
        torch.set_num_interop_threads(max(1, min(n, 2)))


def _abort(reason: str) -> None:
    """What the heartbeat thread does when the run must end now: say why, and exit."""
    sys.stderr.write(f"orch worker: {reason}; exiting\n")
    sys.stderr.flush()
    os._exit(EXIT_ABORTED)


def _advertised_address(spec: WorkerSpec) -> str:
    host, port = split_address(spec.master)
    return spec.advertise_addr or address_towards(host, port)


def _pin_interface(address: str, backend: str) -> None:
    """Point gloo/nccl at the interface of the advertised address, unless the user chose one."""
    variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    if variable in os.environ:
        return
    name = interface_for(address)
    if name is not None:
        os.environ[variable] = name
        log.info("%s=%s (the interface of %s)", variable, name, address)


# What a run id may be: it names a folder of run_root, so a plain name, never a path.
_SAFE_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _check_run_id(run_id: str, master: str) -> str:
    """``run_id`` if it is a safe folder name, else a WorkerError: it comes from the master."""
    if not _SAFE_RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise WorkerError(
            f"the master at {master} sent an unsafe run id {run_id[:200]!r}: a run id must be "
            "1-128 letters, digits, '.', '_' or '-' (no '..', no '/'); is it an orch master you started?"
        )
    return run_id


def _master_named_fn(spec: WorkerSpec, named: str) -> str:
    """The function the master names, if this worker may run it: importing a module runs code."""
    name = named or EXAMPLE
    if name == EXAMPLE or spec.tls_ca is not None or spec.trust_master:
        return name
    raise WorkerError(
        f"the master at {spec.master} names the training function {name[:200]!r}, but this worker "
        "runs a function named by its master only over TLS it verifies or when told to trust it: "
        "pass --fn package.module:function (the function to run), --tls-ca CA.pem (for a master "
        "serving TLS), or --trust-master (WorkerSpec fn=, tls_ca= or trust_master=True)"
    )


def _register(stub: pb_grpc.OrchestratorStub, spec: WorkerSpec) -> pb.RegisterResponse:
    address = _advertised_address(spec)
    req = pb.RegisterRequest(
        worker_id=spec.worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        address=address,
        local_rank=spec.local_rank,
        backend="nccl" if _cuda_available() else "gloo",
    )
    if spec.launched is not None:
        req.rank, req.world_size = spec.launched.rank, spec.launched.world_size
    deadline = time.monotonic() + spec.register_timeout
    while True:
        left = deadline - time.monotonic()
        try:
            reply: pb.RegisterResponse = stub.Register(
                req, timeout=max(0.5, min(left, 5.0)), wait_for_ready=True
            )
            return reply
        except grpc.RpcError as e:
            # A master not up yet is waited for, until the timeout; any other answer is final.
            if e.code() in UNREACHABLE and time.monotonic() < deadline:
                continue
            error = rpc_error("Register", spec.master, e, tls=spec.tls_ca is not None, error=WorkerError)
            if e.code() in UNREACHABLE:
                error = WorkerError(f"waited {spec.register_timeout:g}s for the master: {error}")
            elif spec.launched is not None and e.code() in _REFUSED_RANK:
                error = WorkerError(
                    f"{error} (this worker's rank is {spec.launched.describe()}; orch worker "
                    "--launcher none lets the master number the ranks instead)"
                )
            raise error from e


# How a master refuses the rank or world size a worker's launcher gave it.
_REFUSED_RANK = (
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
)


def _check_launched(spec: WorkerSpec, reg: pb.RegisterResponse) -> None:
    """A master that ignored the requested rank (one older than this worker) is an error:
    the launcher's rank and orch's would name different processes."""
    launched = spec.launched
    if launched is not None and (reg.rank, reg.world_size) != (launched.rank, launched.world_size):
        raise WorkerError(
            f"the master at {spec.master} gave rank {reg.rank} of {reg.world_size}, not the one "
            f"this worker's launcher gave ({launched.describe()}): the master does not take "
            "requested ranks (is it older than this worker?); upgrade it, or pass --launcher none"
        )


def _listen(address: str, port: int) -> socket.socket:
    """A socket listening on ``address:port`` only (not the wildcard address)."""
    host = address.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As torch's own store does: a port held only by TIME_WAIT connections is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def _serve_rendezvous(
    stub: pb_grpc.OrchestratorStub, spec: WorkerSpec, reg: pb.RegisterResponse, timeout: float
) -> Any:
    """On rank 0: bind the rendezvous store, then tell the master which port it got.

    Binding first and reporting after leaves no window in which another process could take
    the port: 29500 when it is free, else any free one, unless the master fixed the port.
    torch's store is unauthenticated, so it listens only on the address this rank advertises
    (the one the other ranks dial: 127.0.0.1 in a local run): the socket is bound here and
    handed to torch as ``master_listen_fd``, since torch itself would bind every address.

    Under torchrun this store is orch's own, beside torchrun's: the process group gets it
    as ``store=``, so MASTER_ADDR / MASTER_PORT (torchrun's store) are never read; where
    torchrun's store listens on this host (bound by its agent before it started the ranks),
    binding first finds that port taken and moves to a free one, as for any taken port.
    """
    from torch._C._distributed_c10d import TCPStore

    address = _advertised_address(spec).strip("[]")
    fixed = reg.rendezvous_port
    try:
        try:
            sock = _listen(address, fixed or DEFAULT_RENDEZVOUS_PORT)
        except OSError as e:
            if fixed and e.errno == errno.EADDRINUSE:
                raise PortInUseError(fixed, "torch.distributed rendezvous", "rdzv_port") from e
            if fixed or e.errno != errno.EADDRINUSE:
                raise
            sock = _listen(address, 0)
    except OSError as e:
        raise WorkerError(
            f"cannot listen for the torch.distributed rendezvous on {address} ({e.strerror}): "
            "the advertised address must be an address of this host (pass --advertise-addr)"
        ) from e
    port = sock.getsockname()[1]
    # torch takes the socket over (it closes it with the store, or when it fails to start).
    store = TCPStore(
        address,
        port,
        reg.world_size,
        True,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )
    again = pb.RegisterRequest(worker_id=spec.worker_id, run_id=reg.run_id, rendezvous_port=store.port)
    stub.Register(again, timeout=10.0)
    return store


def _barrier(stub: pb_grpc.OrchestratorStub, spec: WorkerSpec, run_id: str) -> pb.CanStartTrainingResponse:
    deadline = time.monotonic() + spec.barrier_timeout
    delay = 0.02
    req = pb.CanStartTrainingRequest(run_id=run_id, worker_id=spec.worker_id)
    while True:
        reply: pb.CanStartTrainingResponse = stub.CanStartTraining(req, timeout=5.0)
        if reply.ready:
            return reply
        if time.monotonic() >= deadline:
            raise WorkerError(
                f"the start barrier did not open within {spec.barrier_timeout:g}s: "
                f"{reply.registered} of {reply.world_size} ranks registered"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _format_exc(spec: WorkerSpec) -> str:
    """The exception being handled, with notebook cells' frames as IPython shows them."""
    return label_cells(traceback.format_exc(), spec.sources)


def _write_error(path: Path, spec: WorkerSpec, rank: int, code: int, error: str) -> None:
    """The failure, on stderr (the rank's log) and in an error file the launcher reads."""
    sys.stderr.write(error)
    sys.stderr.flush()
    record = {
        "worker_id": spec.worker_id,
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "exit_code": code,
        "time": time.time(),
        "traceback": error,
    }
    with contextlib.suppress(OSError):
        private_dir(path.parent.parent)  # the run dir: 0700, as the launcher makes it
        private_dir(path.parent)
        write_json_atomic(path, record)


def _report(
    stub: pb_grpc.OrchestratorStub,
    run_id: str,
    worker_id: str,
    outcome: int,
    error: str,
    checksum: str,
    step: int,
) -> bool:
    try:
        stub.ReportCompletion(
            pb.CompletionRequest(
                run_id=run_id,
                worker_id=worker_id,
                outcome=outcome,  # type: ignore[arg-type]
                error=error,
                param_checksum=checksum,
                step=step,
            ),
            timeout=5.0,
        )
    except grpc.RpcError as e:
        log.warning("could not report %s to the master: %s", pb.RankState.Name(outcome), e.code().name)
        return False
    return True


def run_worker(spec: WorkerSpec) -> int:
    """Join the run at ``spec.master`` and train; returns the process exit code."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import TCPStore

    from .context import Context

    # A segfault or an abort in native code still leaves a Python stack in the rank's log.
    faulthandler.enable()

    if spec.owner is not None:
        exit_when_gone(spec.owner, EXIT_ABORTED)
    _set_threads(spec)
    channel = open_channel(
        spec.master,
        token=token_from_env(spec.token),
        tls_ca=spec.tls_ca,
        tls_server_name=spec.tls_server_name,
    )
    stub = pb_grpc.OrchestratorStub(channel)
    reg = _register(stub, spec)
    run_id, rank, world = reg.run_id, reg.rank, reg.world_size
    try:
        # The run id becomes a folder and the master's function name becomes code: both are
        # checked before any use, so a spoofed master can neither write outside run_root
        # nor make this worker import what it likes.
        _check_run_id(run_id, spec.master)
        _check_launched(spec, reg)
        fn_name = spec.fn if spec.fn is not None else _master_named_fn(spec, reg.fn)
    except WorkerError as e:
        with contextlib.suppress(grpc.RpcError):  # tell the master why (it may be a real one)
            stub.ReportCompletion(
                pb.CompletionRequest(
                    run_id=run_id, worker_id=spec.worker_id, outcome=pb.RANK_FAILED, error=str(e)
                ),
                timeout=5.0,
            )
        channel.close()
        raise
    log.info("worker %s registered as rank %d of %d in run %s", spec.worker_id, rank, world, run_id)
    outcome, error, checksum, step, code = pb.RANK_SUCCEEDED, "", "", 0, 0
    reported = False
    sender: HeartbeatSender | None = None
    error_file = Path(spec.run_root) / run_id / "errors" / f"{spec.worker_id}.json"
    try:
        fn = resolve_fn(fn_name, spec.workdir)
        install(fn, spec.sources)
        config = spec.config if spec.config is not None else json.loads(reg.config_json or "{}")
        store = _serve_rendezvous(stub, spec, reg, spec.collective_timeout) if rank == 0 else None
        go = _barrier(stub, spec, run_id)
        backend = go.backend or "gloo"
        _pin_interface(_advertised_address(spec), backend)
        if backend == "nccl":
            torch.cuda.set_device(spec.local_rank)
            device = torch.device("cuda", spec.local_rank)
        else:
            device = torch.device("cpu")
        if store is None:
            store = TCPStore(
                go.master_addr,
                go.master_port,
                world,
                False,
                timeout=datetime.timedelta(seconds=spec.collective_timeout),
            )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=spec.collective_timeout),
        )
        control = dist.new_group(backend="gloo") if world > 1 else None
        log.info(
            "rank %d: process group up (%s, rendezvous %s:%d); training on %s",
            rank,
            backend,
            go.master_addr,
            go.master_port,
            device,
        )
        ctx: Context
        sender = HeartbeatSender(
            stub,
            run_id=run_id,
            worker_id=spec.worker_id,
            interval=spec.heartbeat_interval,
            master_timeout=spec.master_timeout or reg.heartbeat_timeout or 30.0,
            on_stop=lambda at_step: ctx.request_stop(at_step),
            on_abort=_abort,
            local_master=is_local_address(split_address(spec.master)[0]),
        )
        ctx = Context(
            rank=rank,
            world_size=world,
            local_rank=spec.local_rank,
            device=device,
            config=dict(config),
            run_id=run_id,
            sender=sender,
            control_group=control,
            checkpoint_dir=Path(spec.run_root) / run_id / "checkpoints",
            attempt=reg.attempt or 1,
        )
        sender.total_steps = reg.total_steps
        sender.start()
        fn(ctx)
        checksum = ctx.param_checksum()
        if ctx.stopped:
            outcome = pb.RANK_STOPPED
    except StopTraining:  # a loop without ctx.steps, stopped at the step every rank stops at
        checksum = ctx.param_checksum()
        outcome = pb.RANK_STOPPED
    except SystemExit as e:  # sys.exit(n) in the function: n is this process's exit code
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_FAILED)
        if code != 0:
            outcome = pb.RANK_FAILED
            error = f"the training function called sys.exit({e.code!r})\n" + _format_exc(spec)
            _write_error(error_file, spec, rank, code, error)
    except BaseException:  # the rank's failure, whatever it is, goes to the master
        outcome, code = pb.RANK_FAILED, EXIT_FAILED
        error = _format_exc(spec)
        _write_error(error_file, spec, rank, code, error)
    if sender is not None:
        step = max(step, sender.progress)
    if outcome == pb.RANK_FAILED:
        # Report at once, before the peers' broken collectives do; then deliver the points
        # logged before the failure without obeying the ABORT the report brings.
        reported = _report(stub, run_id, spec.worker_id, outcome, error, checksum, step)
        if sender is not None:
            sender.ignore_commands()
    if sender is not None:
        sender.close()
        step = max(step, sender.progress)
    log.info("rank %d: %s at step %d", rank, pb.RankState.Name(outcome), step)
    if outcome != pb.RANK_FAILED or not reported:
        _report(stub, run_id, spec.worker_id, outcome, error, checksum, step)
    if outcome != pb.RANK_FAILED and dist.is_initialized():
        dist.destroy_process_group()
    channel.close()
    return code


def run_local_group(specs: list[WorkerSpec], poll_interval: float = 0.1) -> int:
    """Run several workers of one host as spawned processes (``orch worker --nproc-per-node K``).

    The ranks reach the master through a host agent in this process (:mod:`orch.agent`),
    which sends their heartbeats in one call per interval and reports a rank whose process
    died without reporting. Returns the first non-zero exit code (0 when all succeeded).
    When one process fails the others are ended too (the master aborts them anyway); Ctrl-C
    or SIGTERM ends them all.
    """
    from ._host_attempts import run_attempts
    from .agent import HostAgent

    first = specs[0]
    agent = HostAgent(
        first.master,
        ranks=len(specs),
        window=first.heartbeat_interval,
        token=token_from_env(first.token),
        tls_ca=first.tls_ca,
        tls_server_name=first.tls_server_name,
    )
    agent.start()
    try:
        return run_attempts(specs, agent, poll_interval, _run_group)
    except HostInterrupted as e:
        return e.code
    finally:
        agent.stop()
        log.info("host agent: %d heartbeats in %d calls to the master", agent.beats, agent.batches)


REPORT_TIMEOUT = 10.0  # seconds to tell the master of ranks that died without a word


KILL_GRACE = 5.0  # seconds ranks told to end (SIGTERM) get before SIGKILL


class HostInterrupted(Exception):
    """SIGTERM or Ctrl-C ended this host's ranks: the host agent exits, whatever the master says."""

    def __init__(self, code: int) -> None:
        super().__init__(f"interrupted (exit {code})")
        self.code = code


def _run_group(
    specs: list[WorkerSpec],
    agent: HostAgent,
    poll_interval: float,
    should_end: Callable[[], bool] | None = None,
) -> int:
    """Spawn one attempt's ranks and watch them until all have exited; returns the first
    non-zero exit code as a shell shows it (0: all succeeded). Raises HostInterrupted on
    SIGTERM or Ctrl-C, once the ranks are gone."""
    import multiprocessing as mp

    import cloudpickle

    ctx = mp.get_context("spawn")
    owner = Owner()
    procs = []
    for spec in specs:
        spec.owner = owner
        # The ranks dial the host agent, on this host: it verified the master (TLS) for them.
        spec.trust_master = spec.trust_master or spec.tls_ca is not None
        # The address the other hosts' ranks reach this one on: the route to the master, found
        # before the ranks are pointed at the agent on 127.0.0.1 (which would give loopback).
        spec.advertise_addr = _advertised_address(spec)
        spec.master, spec.tls_ca, spec.tls_server_name = agent.address, None, None
        p = ctx.Process(target=spawn_main, args=(cloudpickle.dumps(spec),), name=f"orch-{spec.worker_id}")
        p.start()
        procs.append(p)
    ended_at: float | None = None  # when this process ended the ranks: their deaths are its doing
    interrupted = 0

    def end_all() -> None:
        nonlocal ended_at
        if ended_at is None:
            ended_at = time.monotonic()
        for p in procs:
            if p.exitcode is None:
                p.terminate()

    def on_sigterm(*_: object) -> None:
        nonlocal interrupted
        interrupted = interrupted or 143
        end_all()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    code = 0
    try:
        while True:
            try:
                # Exits are read before the loop may end: a killed rank and the peer its death
                # broke can both be gone within one poll, and the killed one must be reported.
                running = any(p.exitcode is None for p in procs)
                failed = [(spec, p.exitcode) for spec, p in zip(specs, procs, strict=True) if p.exitcode]
                if failed and code == 0:
                    code = _shell_status(failed[0][1])
                    if ended_at is None:
                        _report_deaths(agent, failed)
                    end_all()
                if not running:
                    break
                if should_end is not None and ended_at is None and should_end():
                    log.warning("the master has moved past this attempt: ending this host's ranks")
                    end_all()
                if ended_at is not None and time.monotonic() - ended_at > KILL_GRACE:
                    for p in procs:  # a rank stopped, or deaf to SIGTERM: it must not hold up the run
                        if p.exitcode is None and p.pid is not None:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(p.pid, signal.SIGCONT)
                            p.kill()
                time.sleep(poll_interval)
            except KeyboardInterrupt:
                interrupted = interrupted or 130
                end_all()
    finally:
        for p in procs:
            p.join(KILL_GRACE)
            if p.exitcode is None:
                p.kill()
                p.join()
        signal.signal(signal.SIGTERM, previous)
    code = code or next((_shell_status(p.exitcode) for p in procs if p.exitcode), 0)
    if interrupted:
        raise HostInterrupted(code or interrupted)
    return code


def _report_deaths(agent: HostAgent, failed: list[tuple[WorkerSpec, int]]) -> None:
    """Tell the master of ranks that died without a word; one deadline for them all (a master
    that cannot be reached costs it once). A rank that never registered is left for the
    agent's next SyncHost to report (``agent.unreported``)."""
    deadline = time.monotonic() + REPORT_TIMEOUT
    for spec, exitcode in failed:  # a rank that reported itself keeps its own report
        if exitcode == EXIT_ABORTED:
            continue  # it ended itself: its master aborted it or went silent
        if not agent.report_exit(spec.worker_id, exitcode, max(0.5, deadline - time.monotonic())):
            if agent.registered(spec.worker_id):
                continue  # the master could not be reached: its heartbeat timeout will tell
            agent.unreported.append(
                f"the process of worker {spec.worker_id} on {socket.gethostname()} exited with "
                f"{describe_exit(exitcode)} before it registered"
            )


def _shell_status(exitcode: int) -> int:
    """multiprocessing's exit code (negative: killed by that signal) as a shell reports it."""
    return exitcode if exitcode >= 0 else 128 - exitcode


def spawn_main(payload: bytes) -> None:
    """Entry point of a worker process started by the launcher (forkserver or spawn)."""
    import cloudpickle

    spec: WorkerSpec = cloudpickle.loads(payload)
    # Ctrl-C in a terminal and a notebook's "Interrupt Kernel" signal the launcher's whole
    # process group: they are meant for the launcher, which stops the run as asked (or not
    # at all). A worker ends through its launcher (SIGTERM) or its master, never on SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.log_dir and not spec.log_file:
        spec.log_file = str(Path(spec.log_dir) / f"{spec.worker_id}.log")
    if spec.log_file:
        fd = os.open(spec.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    if spec.env:
        # The launcher's environment as it was at this launch (a forkserver's is older).
        os.environ.clear()
        os.environ.update(spec.env)
    if spec.workdir:
        os.chdir(spec.workdir)  # the launcher's folder at this launch, as torchrun's workers
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {spec.worker_id} %(levelname)s %(message)s")
    try:
        code = run_worker(spec)
    except Exception:
        traceback.print_exc()
        code = EXIT_FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter shutdown: it can hang on a process group a failed peer left behind.
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """``python -m orch.worker ARGS`` is ``orch worker ARGS``.

    Under torchrun, ``torchrun ... -m orch.worker -- --master HOST:PORT`` (or ORCH_MASTER in
    the environment): without the ``--`` torchrun's own parser takes ``--master`` for an
    abbreviation of its ``--master-addr`` and refuses it. Some Pythons pass the ``--`` on.
    """
    from .cli import main as cli_main

    args = sys.argv[1:] if argv is None else argv
    return cli_main(["worker", *(args[1:] if args[:1] == ["--"] else args)])


if __name__ == "__main__":
    sys.exit(main())
