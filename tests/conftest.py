"""Shared fixtures: a master on a free port, and the check that no process outlives a test."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import comm
import psutil
import pytest
from comm.base_comm import BaseComm
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.master.server import MasterServer

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
ORCH = str(Path(sys.executable).parent / "orch")


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes started under this test (they inherit ORCH_TEST_TAG)."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.environ().get("ORCH_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(autouse=True, scope="session")
def _resource_tracker() -> None:
    # multiprocessing's resource tracker and the workers' forkserver live as long as this
    # pytest process, by design; start them before any test so that they carry no test's tag.
    from multiprocessing import forkserver, resource_tracker

    from orch.launchers.local.group import worker_context

    resource_tracker.ensure_running()
    worker_context()  # sets the preload; the forkserver, too, lives as long as pytest
    forkserver.ensure_running()


@pytest.fixture(autouse=True)
def no_leftover_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every process a test starts must be gone when it ends."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv("ORCH_TEST_TAG", tag)
    yield tag
    deadline = time.monotonic() + 5.0
    left = tagged_processes(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = tagged_processes(tag)
    if left:
        desc = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left]
        for p in left:
            p.kill()
        pytest.fail(f"processes outlived the test: {desc}")


@pytest.fixture
def sticky_root() -> Iterator[Path]:
    """A sticky run root anyone can write, as /tmp is (under /tmp itself: pytest's own folders
    are closed to other users)."""
    top = Path(tempfile.mkdtemp(prefix="orch-shared-"))
    top.chmod(0o755)
    root = top / "runs"
    root.mkdir()
    root.chmod(0o1777)
    try:
        yield root
    finally:
        shutil.rmtree(top)


@pytest.fixture
def coordinator() -> Coordinator:
    return Coordinator(RunPlan(world_size=2, heartbeat_timeout=5.0), run_id="run-a")


@pytest.fixture
def master(coordinator: Coordinator) -> Iterator[MasterServer]:
    """A real gRPC master on a free loopback port, serving ``coordinator``."""
    server = MasterServer(coordinator, port=0).start()
    try:
        yield server
    finally:
        server.stop(grace=0.2)


TOKEN = "s3cret-token"  # the token of the `guarded` master


@pytest.fixture
def guarded() -> Iterator[tuple[MasterServer, Coordinator]]:
    """A real gRPC master on a free loopback port that takes only calls carrying TOKEN."""
    coord = Coordinator(RunPlan(2), run_id="r")
    with guarded_master(coord) as server:
        yield server, coord


def until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> float:
    """Seconds until ``predicate()`` held; fails the test after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
    return time.monotonic() - start


def until_value(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """The first truthy value of ``predicate()``; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@contextlib.contextmanager
def guarded_master(coord: Coordinator) -> Iterator[MasterServer]:
    """``coord`` served by a real gRPC master on a free loopback port, with TOKEN."""
    server = MasterServer(coord, port=0, token=TOKEN).start()
    try:
        yield server
    finally:
        server.stop(grace=0.1)


@pytest.fixture
def subprocess_env(tmp_path: Path) -> dict[str, str]:
    """Environment for `orch` subprocesses: test jobs importable, runs under tmp_path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env["ORCH_TOKEN"] = uuid.uuid4().hex  # `orch master` and `orch worker` both read it
    return env


def orch_cli(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 200
) -> subprocess.CompletedProcess[str]:
    """Run the ``orch`` command to completion; its output is captured as text."""
    return subprocess.run([ORCH, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


@contextlib.contextmanager
def notebook_kernel(cwd: Path, env: dict[str, str] | None = None) -> Iterator[tuple[Any, Any]]:
    """A real IPython kernel started by jupyter_client, and a client connected to it.

    Yields ``(manager, client)``; the kernel is shut down afterwards (killed if it still runs).
    ``env``: the kernel's whole environment (default: this process's).
    """
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(cwd), **({"env": env} if env is not None else {}))
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def make_certificate(
    tmp_path: Path, name: str, alt: list[x509.GeneralName] | None = None
) -> tuple[Path, Path]:
    """A self-signed CA certificate and its key, for ``name`` and the names in ``alt``
    (default: localhost and 127.0.0.1)."""
    if alt is None:
        alt = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


class RecordingComm(BaseComm):
    """A comm that keeps every message a widget would send to the browser."""

    sent: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def publish_msg(
        self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any
    ) -> None:
        with self.lock:
            self.sent.append((self.comm_id, {"type": msg_type, "data": data or {}, "buffers": buffers}))


@pytest.fixture
def widget_messages(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every message the widgets made in the test would send to the browser."""
    RecordingComm.sent = []
    monkeypatch.setattr(comm, "create_comm", lambda *a, **kw: RecordingComm(*a, **kw))
    yield RecordingComm.sent


def images_sent(sent: list[tuple[str, dict[str, Any]]], widget: Any) -> int:
    """How many new images an ``Image`` widget sent to the browser (they travel as buffers)."""
    return sum(1 for cid, m in list(sent) if cid == widget.comm.comm_id and m["buffers"])


# Under pytest-xdist (scripts/test.sh runs the suite on several workers), the tests that share
# one expensive set-up run on one worker, so it is made once: the Slurm cluster (a session
# fixture). Each group still runs in parallel with the rest.
_GROUPS = {"test_slurm.py": "slurm", "test_slurm_cluster.py": "slurm"}

# Tests whose verdict rests on timing (the straggler judgement, a restart's replay across
# hosts, how fast orphaned workers end): scripts/test.sh runs them after the parallel part,
# alone on the machine, where a process is slow only because the test made it so.
_SERIAL = {
    "test_stragglers.py",
    "test_multihost.py",
    "test_host_restarts.py",
    "test_owner_death.py",
    "test_close_timing.py",
    # Not a timing, but a Ray cluster's daemons take a share of the 2 cores for as long as it is
    # up: its tests run alone, so it loads no other test.
    "test_ray.py",
    "test_ray_cli.py",
}

# Unit tests, with no real process and no network namespace: `scripts/test.sh --quick`.
_UNIT = {
    "test_coordinator.py",
    "test_coordinator_budgets.py",
    "test_fatal.py",
    "test_layers.py",
    "test_master_rpc.py",
    "test_memory_reader.py",
    "test_proto.py",
    "test_text.py",
    "test_pollers.py",
    "test_readable.py",
    "test_stop_vote_schedule.py",
    "test_torchrun_pieces.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = item.path.name
        if name in _GROUPS:
            item.add_marker(pytest.mark.xdist_group(_GROUPS[name]))
        if name in _SERIAL:
            item.add_marker(pytest.mark.serial)
        if name in _UNIT or item.path.parent.name == "control":
            item.add_marker(pytest.mark.unit)


# A second user on this machine, for tests of what another user can do: nobody's uid, taken
# with setpriv (which needs root; CI runs as root).
NOBODY = 65534


def can_switch_uid() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "id", "-u"],
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0 and probe.stdout.strip() == str(NOBODY)


needs_second_uid = pytest.mark.skipif(
    not can_switch_uid(), reason="needs root and setpriv to act as a second user"
)
