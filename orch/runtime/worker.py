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
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

import grpc

from orch.errors import OrchError, PortInUseError, StopTraining, WorkerError
from orch.record.store import private_dir, write_json_atomic
from orch.record.writes import OwnDir, own_dir
from orch.runtime import _nested, _scalars, current
from orch.runtime._children import become_subreaper, end_descendants
from orch.runtime._memory import ProcessReader
from orch.runtime._owner import exit_when_gone
from orch.runtime._script import Script
from orch.runtime._sender import HeartbeatSender
from orch.runtime._source import install, label_cells
from orch.runtime._stack import capture as capture_stack
from orch.runtime._target import EXAMPLE, resolve_fn
from orch.runtime._torchrun import GroupAdopter, environment, real_init_process_group
from orch.runtime._world import watcher as world_watcher
from orch.runtime.spec import WorkerSpec
from orch.wire._net import (
    DEFAULT_RENDEZVOUS_PORT,
    address_towards,
    interface_for,
    is_local_address,
    is_unix,
    split_address,
)
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire._rpc import UNREACHABLE, rpc_error
from orch.wire.auth import open_channel, token_from_env
from orch.wire.limits import clip
from orch.wire.states import EXIT_ABORTED

log = logging.getLogger(__name__)

EXIT_FAILED = 1


def _set_threads(spec: WorkerSpec) -> None:
    import torch

    # As torchrun does: N processes on one host share its cores instead of each taking all.
    # The CPUs this process may run on (a Slurm step or taskset gives fewer than the host has).
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = spec.threads or max(1, cpus // spec.local_world_size)
    torch.set_num_threads(n)


def _set_interop_threads(spec: WorkerSpec, fn_name: object) -> None:
    """The inter-op pool of a function's rank, as _set_threads sizes the intra-op one. A
    script's is left alone: it may size the pool itself, which torch allows once per process."""
    if isinstance(fn_name, Script):
        return
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = spec.threads or max(1, cpus // spec.local_world_size)
    with contextlib.suppress(RuntimeError):  # only settable before the first parallel op
        torch.set_num_interop_threads(max(1, min(n, 2)))


def _abort(reason: str) -> None:
    """What the heartbeat thread does when the run must end now: say why, and exit."""
    sys.stderr.write(f"orch worker: {reason}; exiting\n")
    sys.stderr.flush()
    os._exit(EXIT_ABORTED)


def advertised_address(spec: WorkerSpec) -> str:
    if spec.advertise_addr:
        return spec.advertise_addr
    if is_unix(spec.master):  # the master's private listener: it is on this machine
        return "127.0.0.1"
    return address_towards(*split_address(spec.master))


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
        "runs a function named by its master only over TLS it verifies or when told to trust it, "
        "so it refuses, and its refusal fails the whole run: start the workers again with "
        "--fn package.module:function (the function to run), --tls-ca CA.pem (for a master "
        "serving TLS), or --trust-master (WorkerSpec fn=, tls_ca= or trust_master=True)"
    )


def _register(stub: pb_grpc.OrchestratorStub, spec: WorkerSpec) -> pb.RegisterResponse:
    address = advertised_address(spec)
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
    elif spec.group:
        req.group, req.local_world_size = spec.group, spec.local_world_size
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

    address = advertised_address(spec).strip("[]")
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


_HELD: list[OwnDir] = []  # folders a file store reaches its file through (see _file_store)


def _file_store(prefix: str, reg: pb.RegisterResponse, world: int, timeout: float) -> Any:
    """The rendezvous of ranks on one host: a file store in the run dir (0700), one file per
    attempt, which only this user can open; torch removes it once every rank let it go."""
    from torch._C._distributed_c10d import FileStore

    where = Path(prefix)
    name = f"{where.name}.a{reg.attempt or 1}"
    # The run dir, checked and held open for as long as the store lives: torch opens the file
    # by its path at each use, and that path goes through the folder's descriptor, so a run dir
    # renamed or replaced afterwards cannot hand the ranks another store.
    folder = own_dir(where.parent)
    _HELD.append(folder)
    # Created 0600 by whichever rank comes first (torch would create it 0644): every file of
    # the run dir is its user's alone.
    os.close(folder.append_fd(name))
    store = FileStore(folder.proc_path(name), world)
    store.set_timeout(datetime.timedelta(seconds=timeout))
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
    """The exception being handled, with notebook cells' frames as IPython shows them, cut to
    MAX_ERROR_LEN (its head and tail): a message holding the repr of a big tensor stays small
    in the rank's log, its error file and the run's record."""
    return clip(label_cells(clip(traceback.format_exc()), spec.sources))


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
    with contextlib.suppress(OSError, OrchError):  # a refused folder is in the log above
        private_dir(path.parent.parent)  # the run dir: 0700, as the launcher makes it
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

    from orch.runtime.context import Context  # torch, as above: only a rank pays for it

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
    adopter: GroupAdopter | None = None
    try:
        _set_interop_threads(spec, fn_name)
        fn = resolve_fn(fn_name, spec.workdir)
        install(fn, spec.sources)
        config = spec.config if spec.config is not None else json.loads(reg.config_json or "{}")
        store = None
        if spec.rendezvous_file:
            store = _file_store(spec.rendezvous_file, reg, world, spec.collective_timeout)
        elif rank == 0:
            store = _serve_rendezvous(stub, spec, reg, spec.collective_timeout)
        go = _barrier(stub, spec, run_id)
        backend = go.backend or "gloo"
        _pin_interface(advertised_address(spec), backend)
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
        # torchrun's contract: code written for it (and the libraries it uses) finds its place here.
        os.environ.update(
            environment(
                rank=rank,
                local_rank=spec.local_rank,
                world_size=world,
                local_world_size=spec.local_world_size,
                run_id=run_id,
                attempt=reg.attempt or 1,
                master_addr=go.master_addr or advertised_address(spec),
                master_port=go.master_port or int(os.environ.get("MASTER_PORT") or DEFAULT_RENDEZVOUS_PORT),
            )
        )
        os.environ[current.RANK_ENV] = f"{run_id}:{rank}"

        def make_group(asked: str | None, timeout: datetime.timedelta | None, device_id: Any) -> None:
            real_init_process_group(
                asked or backend,
                store=store,
                rank=rank,
                world_size=world,
                timeout=timeout or datetime.timedelta(seconds=spec.collective_timeout),
                device_id=device_id,
            )

        control = None
        if not isinstance(fn, Script):
            # A function of ctx gets its group (and orch's own, for ctx.steps) before it runs; a
            # script makes the group itself, with its backend and timeout, when it asks for it.
            make_group(None, None, None)
            control = dist.new_group(backend="gloo") if world > 1 else None
            log.info(
                "rank %d: process group up (%s, rendezvous %s:%d); training on %s",
                rank,
                backend,
                go.master_addr,
                go.master_port,
                device,
            )
        adopter = GroupAdopter(rank=rank, world_size=world, make=make_group).install()
        _nested.guard()
        _scalars.install()
        ctx: Context
        sender = HeartbeatSender(
            stub,
            run_id=run_id,
            worker_id=spec.worker_id,
            interval=spec.heartbeat_interval,
            master_timeout=spec.master_timeout or reg.heartbeat_timeout or 30.0,
            on_stop=lambda at_step: ctx.request_stop(at_step),
            on_abort=_abort,
            local_master=is_unix(spec.master) or is_local_address(split_address(spec.master)[0]),
        )
        sender.process = ProcessReader(device.index if device.type == "cuda" else None)
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
        training_thread = threading.get_ident()
        sender.stack_of = lambda: capture_stack(training_thread, spec.sources, sender.progress)
        sender.start()
        current.set_context(ctx)
        sender.watch = world_watcher(ctx)
        if isinstance(fn, Script):
            real_exit = _exit_reporting(stub, spec, rank, sender, lambda: ctx.param_checksum())
            try:
                fn(ctx)
            finally:
                os._exit = real_exit
        else:
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
            who = "the script" if isinstance(fn_name, Script) else "the training function"
            error = f"{who} called sys.exit({e.code!r})\n" + _format_exc(spec)
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
    current.set_context(None)
    if outcome != pb.RANK_FAILED:
        if adopter is not None:
            adopter.destroy_all()
        elif dist.is_initialized():
            dist.destroy_process_group()
    channel.close()
    return code


def _exit_reporting(
    stub: pb_grpc.OrchestratorStub,
    spec: WorkerSpec,
    rank: int,
    sender: HeartbeatSender,
    checksum: Any,
) -> Any:
    """Make ``os._exit`` in a script end the rank as its exit code says, as torchrun reads it.

    Scripts call ``os._exit(0)`` to skip an interpreter shutdown that gloo's threads can abort;
    torchrun counts that a success. Here the call first sends the rank's last points and its
    outcome (0: SUCCEEDED, else FAILED with the code and where it was called), then exits as
    asked, with no unwinding. Returns the real ``os._exit``, which the caller puts back."""
    real_exit = os._exit

    def exit_now(status: int) -> NoReturn:
        os._exit = real_exit
        outcome, error, total = pb.RANK_SUCCEEDED, "", ""
        try:
            with contextlib.suppress(Exception):
                total = checksum()
            if status != 0:
                outcome = pb.RANK_FAILED
                where = "".join(traceback.format_stack(sys._getframe(1), limit=8))
                error = f"the script called os._exit({status})\n{where}"
            sender.close()
            log.info("rank %d: %s at step %d (os._exit)", rank, pb.RankState.Name(outcome), sender.progress)
            _report(stub, sender.run_id, spec.worker_id, outcome, error, total, sender.progress)
            sys.stdout.flush()
            sys.stderr.flush()
            end_descendants()
        finally:
            real_exit(status)

    os._exit = exit_now
    return real_exit


def own_logging(worker_id: str) -> None:
    """orch's lines in the rank's log go through orch's own logger, never the root one: the
    user's ``logging.basicConfig`` works, and a library's lines are printed once."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {worker_id} %(levelname)s %(message)s"))
    logger = logging.getLogger("orch")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


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
        log_file = Path(spec.log_file)
        with own_dir(log_file.parent) as logs:
            fd = logs.append_fd(log_file.name)
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
    own_logging(spec.worker_id)
    # What the training code starts stays in this process's tree, and ends with it.
    become_subreaper()
    try:
        code = run_worker(spec)
    except Exception:
        traceback.print_exc()
        code = EXIT_FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    end_descendants()
    # Skip interpreter shutdown: it can hang on a process group a failed peer left behind.
    os._exit(code)
