"""A worker's way into its run: register with the master (checking what it sends back), open
the rendezvous store (rank 0's TCP store, or a file store in the run dir for ranks on one
host), and pass the start barrier."""

from __future__ import annotations

import datetime
import errno
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import grpc

from orch.errors import PortInUseError, WorkerError
from orch.record.writes import OwnDir, own_dir
from orch.runtime.spec import WorkerSpec
from orch.runtime.target import EXAMPLE
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire._proto import orchestrator_pb2_grpc as pb_grpc
from orch.wire.net import (
    DEFAULT_RENDEZVOUS_PORT,
    address_towards,
    interface_for,
    is_unix,
    split_address,
)
from orch.wire.rpc import UNREACHABLE, rpc_error
from orch.wire.states import BARRIER_CLOSED

log = logging.getLogger(__name__)


def advertised_address(spec: WorkerSpec) -> str:
    if spec.advertise_addr:
        return spec.advertise_addr
    if is_unix(spec.master):  # the master's private listener: it is on this machine
        return "127.0.0.1"
    return address_towards(*split_address(spec.master))


def pin_interface(address: str, backend: str) -> None:
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


def check_run_id(run_id: str, master: str) -> str:
    """``run_id`` if it is a safe folder name, else a WorkerError: it comes from the master."""
    if not _SAFE_RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise WorkerError(
            f"the master at {master} sent an unsafe run id {run_id[:200]!r}: a run id must be "
            "1-128 letters, digits, '.', '_' or '-' (no '..', no '/'); is it an orch master you started?"
        )
    return run_id


def master_named_fn(spec: WorkerSpec, named: str) -> str:
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


def register(stub: pb_grpc.OrchestratorStub, spec: WorkerSpec) -> pb.RegisterResponse:
    address = advertised_address(spec)
    req = pb.RegisterRequest(
        worker_id=spec.worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        address=address,
        local_rank=spec.local_rank,
        backend="nccl" if cuda_available() else "gloo",
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


def check_launched(spec: WorkerSpec, reg: pb.RegisterResponse) -> None:
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


def serve_rendezvous(
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


_HELD: list[OwnDir] = []  # folders a file store reaches its file through (see file_store)


def file_store(prefix: str, reg: pb.RegisterResponse, world: int, timeout: float) -> Any:
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


def barrier(stub: pb_grpc.OrchestratorStub, spec: WorkerSpec, run_id: str) -> pb.CanStartTrainingResponse:
    deadline = time.monotonic() + spec.barrier_timeout
    delay = 0.02
    req = pb.CanStartTrainingRequest(run_id=run_id, worker_id=spec.worker_id)
    while True:
        try:
            reply: pb.CanStartTrainingResponse = stub.CanStartTraining(req, timeout=5.0)
        except grpc.RpcError as e:
            if e.code() is grpc.StatusCode.FAILED_PRECONDITION:
                raise WorkerError(e.details() or BARRIER_CLOSED) from None
            raise
        if reply.ready:
            return reply
        if time.monotonic() >= deadline:
            raise WorkerError(
                f"the start barrier did not open within {spec.barrier_timeout:g}s: "
                f"{reply.registered} of {reply.world_size} ranks registered"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())
