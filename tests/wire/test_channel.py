"""The gang's dial-back channel on loopback: a rank dials in, in clear or over TLS, and a
stranger that trickles bytes is cut off at the handshake's deadline, not after it."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import make_certificate
from orch.wire.channel import admit, dial, server_context

KEY = b"0123456789abcdef" * 4


def serve_one(server: socket.socket, seconds: float, tls: object = None) -> list[object]:
    got: list[object] = []

    def run() -> None:
        sock, _ = server.accept()
        got.append(admit(sock, KEY, tls, seconds))  # type: ignore[arg-type]

    t = threading.Thread(target=run, daemon=True)
    t.start()
    got.append(t)
    return got


@pytest.mark.parametrize("with_tls", [False, True])
def test_a_rank_dials_in_and_the_calls_cross(tmp_path: Path, with_tls: bool) -> None:
    cert, key = make_certificate(tmp_path, "gang")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    got = serve_one(server, 5.0, server_context(cert, key) if with_tls else None)
    conn = dial("127.0.0.1", port, KEY, 3, tls_ca=str(cert) if with_tls else None, server_name="localhost")
    got[0].join(10)  # type: ignore[attr-defined]
    rank, kernel_side = got[1]  # type: ignore[misc]
    assert rank == 3
    kernel_side.send_bytes(b"a call's spec" * 1000)
    assert conn.recv_bytes() == b"a call's spec" * 1000
    conn.send_bytes(b"0")
    assert kernel_side.poll(5) and kernel_side.recv_bytes() == b"0"
    conn.close()
    kernel_side.close()
    server.close()


def test_a_wrong_token_is_refused(tmp_path: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    got = serve_one(server, 5.0)
    with pytest.raises(Exception):  # noqa: B017 (multiprocessing's AuthenticationError, or the close)
        dial("127.0.0.1", server.getsockname()[1], b"not the gang's token", 0)
    got[0].join(10)  # type: ignore[attr-defined]
    assert got[1] is None
    server.close()


def test_a_trickling_stranger_is_cut_off_at_the_deadline() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    got = serve_one(server, 1.0)
    stranger = socket.create_connection(server.getsockname())
    began = time.monotonic()
    stranger.sendall(b"\x00\x00\x01\x00")  # a 256-byte frame announced...
    while got[0].is_alive() and time.monotonic() - began < 30:  # type: ignore[attr-defined]
        try:
            stranger.sendall(b"x")  # ...and sent a byte at a time, each well within any read's timeout
        except OSError:
            break
        time.sleep(0.2)
    got[0].join(10)  # type: ignore[attr-defined]
    took = time.monotonic() - began
    assert got[1] is None
    assert took < 10, took  # the handshake's deadline (1 s), not a read's timeout after every byte
    stranger.close()
    server.close()
