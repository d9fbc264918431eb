"""A gang on a Slurm cluster: one batch job that keeps its allocation across cells.

The job runs one task per rank (``srun``), each ``python -m orch.runtime.gang --connect
HOST:PORT``: it dials the launching process (the notebook kernel) back on a port of its own,
proves it holds the gang's token and is proven to in turn (the challenge of
:mod:`multiprocessing.connection`, both ways), says its ``SLURM_PROCID`` (its rank) and then
takes calls as a local gang's rank takes them from its pipe (:func:`orch.runtime.gang.gang_main`).
The calls' specs travel only from the kernel to ranks that passed the challenge; the kernel
reads nothing from them but a rank number and exit codes. With ``tls_cert``/``tls_key`` (the
calls' masters' own) the connection is TLS; without, like the master's gRPC without TLS, it is
authenticated, not secret (:mod:`orch.wire.channel`). Strangers that dial the port are
admitted or refused each on its own, within a deadline, and never hold up the ranks.

Each call is a run with its own master in the kernel, bound where the nodes reach it, as a
Slurm launch's is. The ranks meet through a file store in the gang's folder under the run
root, which the nodes share (as a Slurm launch's run dir). ``gang.close()`` cancels the job;
the kernel's death does too (the job's watcher, :class:`~orch.launchers.slurm.job.SlurmJob`),
and a rank whose kernel connection closes exits.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shlex
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from orch.errors import OrchError
from orch.launchers.slurm.job import JobStatus, SlurmJob, sbatch_options, wait_gone
from orch.launchers.slurm.options import Slurm, cluster_master_host
from orch.runtime.launcher_env import LaunchedAs
from orch.runtime.spec import WorkerSpec
from orch.wire.auth import TOKEN_ENV, certificate_name
from orch.wire.channel import admit, server_context

SayFn = Callable[[str], None]  # a line for the cell's output
MAX_PENDING = 32  # connections in their handshake at once; more are closed at once (ranks dial again)
END_SECONDS = 10.0  # how long close() waits for Slurm to say the job is gone


def gang_script(
    cluster: Slurm, *, name: str, address: str, folder: Path, workdir: str, tls: list[str] | None = None
) -> str:
    """The batch script: Slurm's options, the user's set-up lines, then one gang rank per task."""
    python = cluster.python or sys.executable
    options = sbatch_options(
        cluster,
        name=name,
        tasks_per_node=cluster.tasks_per_node,
        cpus_per_task=cluster.cpus_per_rank,
        output=folder,
        workdir=workdir,
    )
    rank = [python, "-m", "orch.runtime.gang", "--connect", address, *(tls or [])]
    lines = ["#!/bin/bash", f"# {name}: one orch gang rank per task, each dialling the kernel back"]
    lines += [f"#SBATCH {o}" for o in options]
    lines += [*cluster.setup]
    lines += ["exec srun --kill-on-bad-exit=0 " + " ".join(shlex.quote(a) for a in rank)]
    return "\n".join(lines) + "\n"


class GangJob:
    """The Slurm job of a gang's ranks, and their connections, in rank order."""

    def __init__(
        self,
        cluster: Slurm,
        gang_id: str,
        start: int,
        *,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.host = cluster_master_host(cluster)
        self.token = os.urandom(32).hex()
        # With a certificate the dial-back is TLS, as the calls' masters are; the ranks verify it
        # against tls_ca (default: the certificate itself) for the name the certificate carries.
        self.tls: ssl.SSLContext | None = None
        self.tls_args: list[str] = []
        if tls_cert and tls_key:
            self.tls = server_context(tls_cert, tls_key)
            ca = str(Path(tls_ca or tls_cert).resolve())
            self.tls_args = ["--tls-ca", ca, "--tls-name", certificate_name(tls_cert) or self.host]
        self.job = SlurmJob(cluster, {**os.environ, TOKEN_ENV: self.token}, f"gang-{gang_id}-{start}")
        self.conns: list[Connection] = []

    @property
    def name(self) -> str:
        return self.job.name

    def start(self, world_size: int, folder: Path, timeout: float, say: SayFn) -> list[Connection]:
        """Submit the job and wait (up to ``timeout`` s, the launch's ``startup_timeout``) for
        every rank to dial back; a job that ends first, or a refusal, is an :class:`OrchError`
        naming the job and its output."""
        server = socket.create_server((self.host, 0))
        server.settimeout(0.2)
        try:
            port = server.getsockname()[1]
            host = f"[{self.host}]" if ":" in self.host else self.host
            script = gang_script(
                self.cluster,
                name=self.name,
                address=f"{host}:{port}",
                folder=folder.resolve(),
                workdir=os.getcwd(),
                tls=self.tls_args,
            )
            self.job.submit(script, folder)
            say(f"Slurm job {self.job.job_id} submitted ({self.cluster.describe()})")
            self.conns = self._accept(server, world_size, timeout, say)
        except BaseException:
            self.end()
            raise
        finally:
            server.close()
        return self.conns

    def _accept(self, server: socket.socket, world_size: int, timeout: float, say: SayFn) -> list[Connection]:
        """Admit the ranks as they dial: each connection on a thread of its own, against one
        deadline for its whole handshake (:func:`orch.wire.channel.admit`), at most
        :data:`MAX_PENDING` at once (more are closed at once). ``timeout`` counts from now
        whatever strangers do: none of them holds the door for a rank, or the gang's start."""
        job, key = self.job, self.token.encode()
        joined: dict[int, Connection] = {}
        admitted: queue.Queue[tuple[int, Connection]] = queue.Queue()
        pending: set[socket.socket] = set()
        lock = threading.Lock()
        deadline = time.monotonic() + timeout
        said, next_look = "", 0.0
        status = JobStatus("PENDING")

        def handshake(sock: socket.socket) -> None:
            try:
                taken = admit(sock, key, self.tls)
                if taken is not None:
                    admitted.put(taken)
            finally:
                with lock:
                    pending.discard(sock)

        try:
            while len(joined) < world_size:
                while not admitted.empty():
                    rank, conn = admitted.get()
                    if not 0 <= rank < world_size or rank in joined:
                        conn.close()  # not a rank of this gang
                    else:
                        joined[rank] = conn
                if len(joined) == world_size:
                    break
                now = time.monotonic()
                if now >= next_look:
                    next_look = now + max(0.5, self.cluster.poll_interval)
                    status = job.status()
                    if status.ended:
                        raise OrchError(
                            f"Slurm job {job.job_id} ended {status.state} before the gang's ranks joined "
                            f"({len(joined)} of {world_size}); its output ({job.output}):\n"
                            + job.output_tail(20)
                        )
                    news = " ".join(p for p in (status.state, status.reason) if p and p != "None")
                    if news != said and status.state != "UNKNOWN":
                        say(f"Slurm job {job.job_id}: {news}")
                        said = news
                if now > deadline:
                    raise OrchError(
                        f"{len(joined)} of the gang's {world_size} ranks joined within {timeout:g}s "
                        f"(startup_timeout); Slurm job {job.job_id} is {status.state}: its output is "
                        f"{job.output}"
                    )
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                with lock:
                    if len(pending) >= MAX_PENDING:
                        sock.close()  # a flood: refused at once; a rank refused dials again
                        continue
                    pending.add(sock)
                threading.Thread(target=handshake, args=(sock,), name="orch-gang-admit", daemon=True).start()
        except BaseException:
            for conn in joined.values():
                conn.close()
            raise
        finally:
            with lock:
                for sock in pending:  # their handshakes end at once, and close them
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
        return [joined[r] for r in range(world_size)]

    def end(self) -> None:
        """Close the ranks' connections (a rank between calls exits) and cancel the job."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.conns = []
        if self.job.job_id:
            self.job.cancel()
            wait_gone(self.job, END_SECONDS)


def on_node(spec: WorkerSpec, cluster: Slurm, token: str) -> None:
    """A call's spec for a rank on a Slurm node: the node's own environment (its SLURM_*, PATH)
    with the call's token in the spec, its own address, and its place on its node."""
    per_node = cluster.tasks_per_node
    rank = spec.local_rank
    spec.env, spec.token, spec.advertise_addr = {}, token, None
    if spec.log_file:  # opened before the rank goes to the call's folder: the path the nodes share
        spec.log_file = str(Path(spec.log_file).resolve())
    spec.threads = cluster.cpus_per_rank
    spec.local_rank, spec.local_world_size = rank % per_node, per_node
    spec.launched = LaunchedAs(
        "orch",
        rank=rank,
        local_rank=rank % per_node,
        world_size=cluster.world_size,
        local_world_size=per_node,
    )
