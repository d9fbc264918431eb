"""A gang's dial-back channel: one connection per rank, from the rank on a cluster's node back to
the launching process (the notebook kernel), that carries the calls' specs out and exit codes back.

Both ends prove they hold the gang's token before anything else crosses (the challenge of
:mod:`multiprocessing.connection`, both ways). With a certificate and key (``orch.gang(...,
tls_cert=, tls_key=)``, the same as the calls' masters serve) the connection is TLS first, the
rank verifying the kernel's certificate against the CA it was given: the calls' specs, which
hold each call's master token, are then secret on the cluster's network, not only
authenticated. Without it they are authenticated, not secret, as the master's gRPC is
without TLS.

The kernel's side admits each connection on a thread of its own against one deadline for its
whole handshake (:func:`admit`), so a stranger that connects and says nothing, or trickles a
byte at a time, costs a rank at most that deadline, and never holds the door for others.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import ssl
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

HANDSHAKE_SECONDS = 10.0  # the whole of a connection's handshake: TLS, challenges, its rank


class TlsConnection(Connection):
    """A :class:`multiprocessing.connection.Connection` over a TLS socket: the same framing and
    calls (``send_bytes``, ``recv_bytes``, ``poll``), the bytes encrypted."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._tls = sock
        super().__init__(sock.fileno())

    def _close(self, _close: Any = None) -> None:
        with contextlib.suppress(OSError):
            self._tls.close()

    def _send(self, buf: Any, write: Any = None) -> None:
        self._tls.sendall(buf)

    def _recv(self, size: int, read: Any = None) -> io.BytesIO:
        out, left = io.BytesIO(), size
        while left > 0:
            chunk = self._tls.recv(left)
            if not chunk:
                if left == size:
                    raise EOFError
                raise OSError("got end of file during message")
            out.write(chunk)
            left -= len(chunk)
        return out

    def _poll(self, timeout: float) -> bool:
        # Bytes TLS already decrypted are not on the socket any more: select would miss them.
        return bool(self._tls.pending()) or super()._poll(timeout)  # type: ignore[misc]


def server_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """The kernel's side of a TLS dial-back: this certificate and key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def client_context(ca: str | Path) -> ssl.SSLContext:
    """A rank's side: the kernel's certificate verified against ``ca``."""
    context = ssl.create_default_context(cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def admit(
    sock: socket.socket,
    key: bytes,
    tls: ssl.SSLContext | None = None,
    seconds: float = HANDSHAKE_SECONDS,
) -> tuple[int, Connection] | None:
    """The kernel's side of one connection: TLS (with ``tls``), the challenge both ways, then
    the rank it says, all within ``seconds``; else None, the connection closed. A watchdog shuts
    the socket at the deadline, so a peer that trickles bytes is cut off as one that is silent."""
    live: list[socket.socket] = [sock]  # what the watchdog shuts: the TLS socket once wrapped
    cut = threading.Timer(seconds, lambda: _shut(live[0]))
    cut.daemon = True
    cut.start()
    conn: Connection | None = None
    try:
        sock.settimeout(seconds)
        if tls is not None:
            wrapped = tls.wrap_socket(sock, server_side=True)
            live[0] = wrapped
            wrapped.settimeout(None)
            conn = TlsConnection(wrapped)
        else:
            sock.settimeout(None)
            conn = Connection(os.dup(sock.fileno()))  # the watchdog shuts the socket under it
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
        rank = int(conn.recv_bytes(32).decode())
    except (OSError, EOFError, ValueError, AuthenticationError, ssl.SSLError):
        if conn is not None:
            conn.close()
        return None
    finally:
        cut.cancel()
        if tls is None:
            sock.close()  # its duplicate, the connection's, stays open
    return rank, conn


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def dial(
    host: str,
    port: int,
    key: bytes,
    rank: int,
    *,
    tls_ca: str | None = None,
    server_name: str | None = None,
    timeout: float = 60.0,
) -> Connection:
    """A rank's side: connect to the kernel (retrying until ``timeout``, while a node's network
    comes up), verify it against ``tls_ca`` when given, pass the challenge both ways and say
    ``rank``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=HANDSHAKE_SECONDS)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    conn: Connection
    if tls_ca is not None:
        wrapped = client_context(tls_ca).wrap_socket(sock, server_hostname=server_name or host)
        wrapped.settimeout(None)
        conn = TlsConnection(wrapped)
    else:
        sock.settimeout(None)
        conn = Connection(sock.detach())
    answer_challenge(conn, key)
    deliver_challenge(conn, key)
    conn.send_bytes(str(rank).encode())
    return conn
