"""A gang whose ranks run on a cluster's nodes: the door they dial back through, and a call's
spec made right for a rank on a node. Any cluster kind that offers gangs uses these
(:mod:`orch.launchers.slurm.gang`, :mod:`orch.launchers.ray.gang`).

Each rank is ``python -m orch.runtime.gang --connect HOST:PORT``, started by the kind (a
Slurm task, a process of a Ray actor) with the gang's token in its environment and its rank in
``ORCH_GANG_RANK`` (or Slurm's ``SLURM_PROCID``). It dials :class:`DialBack`'s port, proves it
holds the token and is proven to in turn (the challenge of :mod:`multiprocessing.connection`,
both ways), says its rank, then takes calls as a local gang's rank takes them from its pipe.
The calls' specs travel only from the kernel to ranks that passed the challenge; the kernel
reads nothing from them but a rank number and exit codes. With ``tls_cert``/``tls_key`` (the
calls' masters' own) the connection is TLS; without, like the master's gRPC without TLS, it is
authenticated, not secret (:mod:`orch.wire.channel`). Strangers that dial the port are
admitted or refused each on its own, within a deadline, and never hold up the ranks.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from orch.errors import OrchError
from orch.runtime.launcher_env import LaunchedAs
from orch.runtime.spec import WorkerSpec
from orch.wire.auth import certificate_name
from orch.wire.channel import admit, server_context

SayFn = Callable[[str], None]  # a line for the cell's output
# How the gang's job stands while the ranks dial: called now and then with the ranks joined so
# far; returns a line for a timeout's message, or raises OrchError when the job ended first.
WatchFn = Callable[[int], str]
MAX_PENDING = 32  # connections in their handshake at once; more are closed at once (ranks dial again)


class DialBack:
    """The port a cluster gang's ranks dial back to, bound where the nodes reach the kernel."""

    def __init__(
        self, host: str, *, tls_cert: str | None = None, tls_key: str | None = None, tls_ca: str | None = None
    ) -> None:
        self.host = host
        self.token = os.urandom(32).hex()
        # With a certificate the dial-back is TLS, as the calls' masters are; the ranks verify it
        # against tls_ca (default: the certificate itself) for the name the certificate carries.
        self.tls: ssl.SSLContext | None = None
        self.tls_args: list[str] = []  # the rank's own arguments that say so
        if tls_cert and tls_key:
            self.tls = server_context(tls_cert, tls_key)
            ca = str(Path(tls_ca or tls_cert).resolve())
            self.tls_args = ["--tls-ca", ca, "--tls-name", certificate_name(tls_cert) or host]
        self._server: socket.socket | None = None

    def open(self) -> str:
        """Listen on a free port; the ``HOST:PORT`` the ranks dial."""
        self._server = socket.create_server((self.host, 0))
        self._server.settimeout(0.2)
        port = self._server.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def accept(self, world_size: int, timeout: float, watch: WatchFn, look_every: float) -> list[Connection]:
        """Admit the ranks as they dial, and return their connections in rank order: each
        connection on a thread of its own, against one deadline for its whole handshake
        (:func:`orch.wire.channel.admit`), at most :data:`MAX_PENDING` at once (more are closed
        at once). ``timeout`` (the gang's ``startup_timeout``) counts from now whatever
        strangers do; ``watch`` is asked how the job stands every ``look_every`` seconds (at
        least half a second) and ends the wait, raising, when the job ended first."""
        server = self._server
        assert server is not None, "open() first"
        key = self.token.encode()
        joined: dict[int, Connection] = {}
        admitted: queue.Queue[tuple[int, Connection]] = queue.Queue()
        pending: set[socket.socket] = set()
        lock = threading.Lock()
        deadline = time.monotonic() + timeout
        next_look, where = 0.0, ""

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
                    next_look = now + max(0.5, look_every)
                    where = watch(len(joined))
                if now > deadline:
                    raise OrchError(
                        f"{len(joined)} of the gang's {world_size} ranks joined within {timeout:g}s "
                        f"(startup_timeout); {where}"
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


def place_on_node(spec: WorkerSpec, token: str, *, world_size: int, per_node: int, threads: int) -> None:
    """A call's spec for a rank on a node: the node's own environment (what its kind gave the
    rank's process) with the call's token in the spec, its own address, and its place on its
    node (ranks fill the nodes in order, ``per_node`` each)."""
    rank = spec.local_rank
    spec.env, spec.token, spec.advertise_addr = {}, token, None
    if spec.log_file:  # opened before the rank goes to the call's folder: the path the nodes share
        spec.log_file = str(Path(spec.log_file).resolve())
    spec.threads = threads
    spec.local_rank, spec.local_world_size = rank % per_node, per_node
    spec.launched = LaunchedAs(
        "orch", rank=rank, local_rank=rank % per_node, world_size=world_size, local_world_size=per_node
    )
