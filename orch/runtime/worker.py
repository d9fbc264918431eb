"""A worker: register with the master, pass the start barrier, train, report back.

Run as ``orch worker --master HOST:PORT`` (or ``python -m orch.worker --master HOST:PORT``,
as torchrun and srun start it) or spawned by the launcher through :func:`spawn_main`. The
training function is either a callable carried from the launcher to its own children
(cloudpickled, never over the network) or an import path ``package.module:function``.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

import grpc

from orch._tracebacks import format_from_user_code, format_stack_from_user_code
from orch.errors import OrchError, StopTraining, WorkerError
from orch.record.writes import own_dir, private_dir, write_json
from orch.runtime import _mend, _scalars, current, nested
from orch.runtime._children import become_subreaper, end_descendants, end_with_sigterm, exit_now
from orch.runtime._seeding import reseed
from orch.runtime._sender import BUSY_MASTER_WAIT, HeartbeatSender
from orch.runtime._stack import capture as capture_stack
from orch.runtime._torchrun import GroupAdopter, environment, real_init_process_group
from orch.runtime._world import watcher as world_watcher
from orch.runtime.gang_session import Session
from orch.runtime.joining import (
    advertised_address,
    barrier,
    check_launched,
    check_run_id,
    file_store,
    master_named_fn,
    pin_interface,
    register,
    serve_rendezvous,
)
from orch.runtime.memory import ProcessReader
from orch.runtime.owner import exit_when_gone
from orch.runtime.script import Script
from orch.runtime.source import install, label_cells
from orch.runtime.spec import WorkerSpec
from orch.runtime.target import resolve_fn
from orch.runtime.values import keep_value
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.auth import open_channel, token_from_env
from orch.wire.codec import encode
from orch.wire.limits import clip
from orch.wire.model import Completion
from orch.wire.net import (
    DEFAULT_RENDEZVOUS_PORT,
    is_local_address,
    is_unix,
    split_address,
)
from orch.wire.states import EXIT_ABORTED, RankState

log = logging.getLogger(__name__)

EXIT_FAILED = 1
# Seconds a gang's rank, told its call must end, gives the call to end by itself (a collective's
# failure) before it interrupts the code (see _abort_call).
INTERRUPT_AFTER = 0.5


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
    exit_now(EXIT_ABORTED)  # what the rank started ends with it


def _user_call(fn: Any, ctx: Any, session: Session | None) -> Any:
    """``fn(ctx)``; in a gang's rank, marked as the user's code running, which an abort may
    interrupt (:func:`_abort_call`)."""
    if session is None:
        return fn(ctx)
    session.in_user_code = True
    try:
        return fn(ctx)
    finally:
        session.in_user_code = False


def _abort_call(session: Session, reason: str) -> None:
    """What the heartbeat thread of a gang's rank does when its call must end now (a peer
    failed): the rank stays up with its state. Its group's connections are shut down, so a
    collective it waits in fails at once (and its peers' too); code that waits elsewhere (a
    sleep, a loop of its own) is interrupted :data:`INTERRUPT_AFTER` seconds later by
    :class:`~orch.errors.CallAborted`, raised in it by SIGUSR2 (see :func:`orch.runtime.gang.gang_main`)."""
    sys.stderr.write(f"orch gang rank: {reason}; this rank ends its part of the call and stays up\n")
    sys.stderr.flush()
    session.freed = True
    _mend.free(session.sockets)
    _mend.abort_nccl()

    def interrupt() -> None:
        if session.in_user_code:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR2)

    timer = threading.Timer(INTERRUPT_AFTER, interrupt)
    timer.daemon = True
    timer.start()


def _format_exc(spec: WorkerSpec, whole: bool = False) -> str:
    """The exception being handled, from the first frame of the user's code (the frames of
    orch's worker and wrappers, and of runpy for a script, that led there are left out; each
    exception it was chained to likewise), with notebook cells' frames as IPython shows them,
    cut to MAX_ERROR_LEN (its head and tail): a message holding the repr of a big tensor stays
    small in the rank's log, its error file and the run's record. ``whole``: every frame, for
    the rank's log (orch's own debugging)."""
    error = sys.exc_info()[1]
    text = traceback.format_exc() if whole or error is None else format_from_user_code(error)
    return clip(label_cells(clip(text), spec.sources))


def _write_error(path: Path, spec: WorkerSpec, rank: int, code: int, error: str, logged: str = "") -> None:
    """The failure, on stderr (the rank's log: ``logged``, the whole traceback, when given) and
    in an error file the launcher reads."""
    sys.stderr.write(logged or error)
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
        write_json(path, record)


def _report(
    stub: pb_grpc.OrchestratorStub,
    run_id: str,
    worker_id: str,
    outcome: RankState,
    error: str,
    checksum: str,
    step: int,
    patience: float = 0.0,
) -> bool:
    """Tell the master how this rank ended; ``patience``: seconds to try again while the master
    does not answer (a busy master whose process lives, see HeartbeatSender.owner_watched)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            done = Completion(run_id, worker_id, outcome, error, param_checksum=checksum, step=step)
            stub.ReportCompletion(encode(done), timeout=5.0)
            return True
        except grpc.RpcError as e:
            busy = e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
            if not busy or time.monotonic() > deadline:
                said = "RANK_" + outcome.value
                log.warning("could not report %s to the master: %s", said, e.code().name)
                return False


def run_worker(spec: WorkerSpec, session: Session | None = None) -> int:
    """Join the run at ``spec.master`` and train; returns the process exit code.

    ``session``: this process is a rank of a gang (:mod:`orch.runtime.gang`), which keeps its
    process group, orch's control group and its namespace (``ctx.state``) from one call (one
    run) to the next: the group is made at its first call and never destroyed here."""
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
    reg = register(stub, spec)
    run_id, rank, world = reg.run_id, reg.rank, reg.world_size
    try:
        # The run id becomes a folder and the master's function name becomes code: both are
        # checked before any use, so a spoofed master can neither write outside run_root
        # nor make this worker import what it likes.
        check_run_id(run_id, spec.master)
        check_launched(spec, reg)
        fn_name = spec.fn if spec.fn is not None else master_named_fn(spec, reg.fn)
    except WorkerError as e:
        with contextlib.suppress(grpc.RpcError):  # tell the master why (it may be a real one)
            failed = Completion(run_id, spec.worker_id, RankState.FAILED, error=str(e))
            stub.ReportCompletion(encode(failed), timeout=5.0)
        channel.close()
        raise
    log.info("worker %s registered as rank %d of %d in run %s", spec.worker_id, rank, world, run_id)
    outcome, error, checksum, step, code = RankState.SUCCEEDED, "", "", 0, 0
    reported = False
    sender: HeartbeatSender | None = None
    error_file = Path(spec.run_root) / run_id / "errors" / f"{spec.worker_id}.json"
    adopter: GroupAdopter | None = None
    try:
        if session is None or not session.seeded:
            # A forked rank's generators are copies of the forkserver's: its own now, before any
            # of the user's code (an import of the function's module included) draws from them.
            mine = reseed(rank, reg.seed if reg.HasField("seed") else None)
            if mine is not None:
                log.info("rank %d: torch, numpy and random seeded with %d (seed= + rank)", rank, mine)
            if session is not None:
                session.seeded = True
        _set_interop_threads(spec, fn_name)
        fn = resolve_fn(fn_name, spec.workdir)
        install(fn, spec.sources)
        config = spec.config if spec.config is not None else json.loads(reg.config_json or "{}")
        # A gang's next call runs in its ranks' group; a new rendezvous file means the gang's
        # launcher asks for the group to be made again (a call broke it: orch.runtime._mend).
        kept = session is not None and session.group_up and session.rendezvous == spec.rendezvous_file
        remade_at = 0.0
        if session is not None and session.group_up and not kept:
            remade_at = time.monotonic()
            _mend.free(session.sockets)  # whatever still waits on the old group fails now
            if dist.is_initialized():  # (an aborted NCCL group may have left already)
                dist.destroy_process_group()  # every group of the old one: the default, orch's, the code's
            session.group_up, session.control, session.sockets = False, None, {}
        store = None
        if kept:
            pass
        elif spec.rendezvous_file:
            store = file_store(spec.rendezvous_file, reg, world, spec.collective_timeout)
        elif rank == 0:
            store = serve_rendezvous(stub, spec, reg, spec.collective_timeout)
        go = barrier(stub, spec, run_id)
        backend = go.backend or "gloo"
        pin_interface(advertised_address(spec), backend)
        if backend == "nccl":
            torch.cuda.set_device(spec.local_rank)
            device = torch.device("cuda", spec.local_rank)
        else:
            device = torch.device("cpu")
        if store is None and not kept:
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
            # None (a script's init_process_group() with no backend): torch's own default for the
            # devices present (cpu:gloo, cuda:nccl), as under torchrun.
            real_init_process_group(
                asked,
                store=store,
                rank=rank,
                world_size=world,
                timeout=timeout or datetime.timedelta(seconds=spec.collective_timeout),
                device_id=device_id,
            )

        control = None
        if kept:
            assert session is not None
            control = session.control
        elif not isinstance(fn, Script):
            # A function of ctx gets its group (and orch's own, for ctx.steps) before it runs; a
            # script makes the group itself, with its backend and timeout, when it asks for it.
            before = _mend.sockets() if session is not None else {}
            make_group(backend, None, None)
            control = dist.new_group(backend="gloo") if world > 1 else None
            if session is not None:
                session.sockets = _mend.made_since(before)
                session.rendezvous = spec.rendezvous_file or ""
                if remade_at:
                    n = session.wrapped.rewrap()
                    log.info(
                        "rank %d: the gang's process group made again in %.3fs (%d DDP model%s rewrapped)",
                        rank,
                        time.monotonic() - remade_at,
                        n,
                        "" if n == 1 else "s",
                    )
            log.info(
                "rank %d: process group up (%s, rendezvous %s:%d); training on %s",
                rank,
                backend,
                go.master_addr,
                go.master_port,
                device,
            )
        if session is not None:
            session.group_up, session.control = True, control
        else:
            adopter = GroupAdopter(rank=rank, world_size=world, make=make_group, store=store).install()
        nested.guard()
        _scalars.install()
        ctx: Context
        sender = HeartbeatSender(
            stub,
            run_id=run_id,
            worker_id=spec.worker_id,
            interval=spec.heartbeat_interval,
            master_timeout=spec.master_timeout or reg.heartbeat_timeout or 30.0,
            on_stop=lambda at_step: ctx.request_stop(at_step),
            on_abort=_abort if session is None else lambda why: _abort_call(session, why),
            local_master=is_unix(spec.master) or is_local_address(split_address(spec.master)[0]),
            # The launching process, which serves the master, is watched: this rank ends with it
            owner_watched=(spec.owner is not None and spec.master_in_owner)
            or (session is not None and session.watched),
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
            state=session.state if session is not None else None,
            kept=session,
        )
        ctx.interrupt_on_stop = session is not None
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
            # What it returns goes to the run dir, before the end is reported (run.wait() reads it)
            keep_value(
                Path(spec.run_root) / run_id, rank, ctx.attempt, _user_call(fn, ctx, session), spec.value_cap
            )
        checksum = ctx.param_checksum()
        if ctx.stopped:
            outcome = RankState.STOPPED
    except StopTraining:  # a loop without ctx.steps, stopped at the step every rank stops at
        checksum = ctx.param_checksum()
        outcome = RankState.STOPPED
    except SystemExit as e:  # sys.exit(n) in the function: n is this process's exit code
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_FAILED)
        if code != 0:
            outcome = RankState.FAILED
            who = "the script" if isinstance(fn_name, Script) else "the training function"
            said = f"{who} called sys.exit({e.code!r})\n"
            error = said + _format_exc(spec)
            _write_error(error_file, spec, rank, code, error, said + _format_exc(spec, whole=True))
    except BaseException as e:  # the rank's failure, whatever it is, goes to the master
        outcome, code = RankState.FAILED, EXIT_FAILED
        if session is not None:
            session.collective_error = _mend.from_collective(e)
        error = _format_exc(spec)
        _write_error(error_file, spec, rank, code, error, _format_exc(spec, whole=True))
    if sender is not None:
        step = max(step, sender.progress)
    if outcome == RankState.FAILED:
        # Report at once, before the peers' broken collectives do; then deliver the points
        # logged before the failure without obeying the ABORT the report brings.
        reported = _report(stub, run_id, spec.worker_id, outcome, error, checksum, step)
        if sender is not None:
            sender.ignore_commands()
    if sender is not None:
        sender.close()
        step = max(step, sender.progress)
    log.info("rank %d: %s at step %d", rank, "RANK_" + outcome.value, step)
    if outcome != RankState.FAILED or not reported:
        patience = BUSY_MASTER_WAIT if sender is not None and sender.owner_watched else 0.0
        _report(stub, run_id, spec.worker_id, outcome, error, checksum, step, patience)
    current.set_context(None)
    if session is not None:
        if "ctx" in locals():
            session.keep_models(ctx._models, ctx._ddp_models)
    elif outcome != RankState.FAILED:
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
        outcome, error, total = RankState.SUCCEEDED, "", ""
        try:
            with contextlib.suppress(Exception):
                total = checksum()
            if status != 0:
                outcome = RankState.FAILED
                where = format_stack_from_user_code(sys._getframe(1), limit=8)
                error = f"the script called os._exit({status})\n{where}"
            sender.close()
            log.info("rank %d: %s at step %d (os._exit)", rank, "RANK_" + outcome.value, sender.progress)
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


def enter(spec: WorkerSpec) -> None:
    """Point this process at ``spec``'s run: its output to the rank's log, the launcher's
    environment and folder, log lines named by the worker (a gang's rank, at each call)."""
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


def spawn_main(payload: bytes) -> None:
    """Entry point of a worker process started by the launcher (forkserver or spawn)."""
    import cloudpickle

    spec: WorkerSpec = cloudpickle.loads(payload)
    # Ctrl-C in a terminal and a notebook's "Interrupt Kernel" signal the launcher's whole
    # process group: they are meant for the launcher, which stops the run as asked (or not
    # at all). A worker ends through its launcher (SIGTERM) or its master, never on SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    enter(spec)
    # What the training code starts stays in this process's tree, and ends with it.
    become_subreaper()
    end_with_sigterm()
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
