"""A Slurm gang's dial-back against strangers, and its secrecy with TLS, on the real two-node
cluster (tests/slurmcluster.py).

The ranks of ``orch.gang(cluster=orch.Slurm(...))`` dial the kernel back on a port anyone on
the cluster's network can reach. Strangers that connect first and say nothing, or trickle a
byte at a time, must cost the ranks nothing (each connection has its own handshake deadline),
and ``startup_timeout`` holds whatever they do. With ``tls_cert``/``tls_key`` the channel is TLS:
a capture on the cluster's bridge holds neither the gang's token nor a call's, where the same
gang without TLS shows a call's token in clear.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

import jobs
import orch
from conftest import TESTS, make_certificate, until
from orch.wire.states import RunState
from slurmcluster import SlurmCluster
from slurmcluster import slurm_cluster as slurm_cluster  # the fixture, for pytest to find here

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def on_cluster(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SlurmCluster:
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.chdir(tmp_path)
    return slurm_cluster


def dial_back_port(root: Path) -> int:
    """The port in the gang job's batch script (``--connect HOST:PORT``), once it is written."""
    for script in root.rglob("*"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if script.is_file() and "--connect" in (text := script.read_text()):
                return int(text.split("--connect ", 1)[1].split()[0].rsplit(":", 1)[1])
    return 0


class Strangers:
    """Connections to the dial-back that never pass its handshake: ``silent`` ones that say
    nothing, and one that announces a 256-byte answer and sends a byte a second."""

    def __init__(self, host: str, root: Path, silent: int = 8) -> None:
        self.host, self.root, self.silent = host, root, silent
        self.socks: list[socket.socket] = []
        self.opened_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Strangers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            s.close()

    def _run(self) -> None:
        port = 0
        while not port and not self._stop.is_set():
            port = dial_back_port(self.root)
            time.sleep(0.05)
        if not port:
            return
        for _ in range(self.silent + 1):
            self.socks.append(socket.create_connection((self.host, port), timeout=5))
        self.opened_at = time.monotonic()
        trickler = self.socks[-1]
        with contextlib.suppress(OSError):
            trickler.sendall(b"\x00\x00\x01\x00")  # a frame of 256 bytes is coming...
            while not self._stop.wait(1.0):
                trickler.sendall(b"x")  # ...one byte a second


def slow_start(seconds: int) -> orch.Slurm:
    """Two nodes, one rank each, whose tasks start ``seconds`` after the job (the strangers are in first)."""
    return orch.Slurm(nodes=2, tasks_per_node=1, setup=(f"sleep {seconds}",))


def test_strangers_at_the_dial_back_cost_the_ranks_nothing(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = on_cluster
    began = time.monotonic()
    with orch.gang(world_size=2, cluster=slow_start(3), run_root=str(tmp_path / "alone")) as gang:
        alone = time.monotonic() - began
        assert gang.run(jobs.gang_where).wait(timeout=120).state is RunState.SUCCEEDED
    with Strangers(c.controller_ip, tmp_path / "crowded") as strangers:
        began = time.monotonic()
        with orch.gang(
            world_size=2, cluster=slow_start(3), run_root=str(tmp_path / "crowded"), startup_timeout=60
        ) as gang:
            crowded = time.monotonic() - began
            assert strangers.opened_at and strangers.opened_at < began + 3  # in before the ranks dialled
            assert len(strangers.socks) == 9
            assert gang.run(jobs.gang_where).wait(timeout=120).state is RunState.SUCCEEDED
    print(f"\ngang start on Slurm: {alone:.1f}s alone, {crowded:.1f}s with 8 silent and 1 trickling stranger")
    # One silent stranger admitted in turn cost 10 s before; nine, held together, now cost none.
    assert crowded - alone < 5.0, (alone, crowded)


def test_startup_timeout_holds_when_the_ranks_never_dial(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = on_cluster
    with Strangers(c.controller_ip, tmp_path):
        began = time.monotonic()
        with pytest.raises(
            orch.OrchError, match=r"0 of the gang's 2 ranks joined within 8s \(startup_timeout\)"
        ):
            orch.gang(world_size=2, cluster=slow_start(600), run_root=str(tmp_path), startup_timeout=8)
        took = time.monotonic() - began
    assert took < 8 + 10, took  # the deadline, and a look at the job: not a stranger's handshake
    until(lambda: not c.squeue(states="PENDING,RUNNING,COMPLETING,CONFIGURING"), 30)


@contextlib.contextmanager
def capture(interface: str) -> Iterator[list[bytes]]:
    """Every frame on ``interface`` while the block runs (a raw packet socket: root)."""
    seen: list[bytes] = []
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    sock.bind((interface, 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                seen.append(sock.recv(65535))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        stop.set()
        reader.join(5)
        sock.close()


def tcp_payload(frame: bytes, port: int) -> bytes:
    """The TCP payload of an Ethernet frame to or from ``port`` (IPv4), else b""."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
        return b""
    ip = frame[14:]
    tcp = ip[(ip[0] & 0x0F) * 4 :]
    if port not in (int.from_bytes(tcp[0:2], "big"), int.from_bytes(tcp[2:4], "big")):
        return b""
    return tcp[(tcp[12] >> 4) * 4 :]


def tokens_seen(c: SlurmCluster, tmp_path: Path, **tls: str) -> tuple[bool, bool]:
    """Run a gang and one call on the cluster with a capture on its bridge: whether the gang's
    token and the call's token crossed the dial-back connections in clear. (The gang's token
    reaches the nodes in the job's environment, through Slurm's own protocol: not looked at.)"""
    with capture(f"osl-{c.suffix}") as seen:
        with orch.gang(
            world_size=2, cluster=orch.Slurm(nodes=2, tasks_per_node=1), run_root=str(tmp_path), **tls
        ) as gang:
            assert gang.job is not None
            gang_token, port = gang.job.door.token, dial_back_port(tmp_path)
            call = gang.run(jobs.gang_where)
            assert call.wait(timeout=120).state is RunState.SUCCEEDED
            call_token = call.token
        time.sleep(0.5)
    wire = b"".join(tcp_payload(frame, port) for frame in seen)
    assert len(wire) > 1000, f"the capture saw {len(wire)} bytes of the dial-back"
    return gang_token.encode() in wire, call_token.encode() in wire


def test_a_gang_with_tls_keeps_its_tokens_off_the_wire(on_cluster: SlurmCluster, tmp_path: Path) -> None:
    c = on_cluster
    alt = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(c.controller_ip))]
    cert, key = make_certificate(tmp_path, "orch-gang", alt)
    # The same gang in clear first: the capture sees the channel (a call's spec holds its token).
    assert tokens_seen(c, tmp_path / "clear") == (False, True)
    assert tokens_seen(c, tmp_path / "tls", tls_cert=str(cert), tls_key=str(key)) == (False, False)
