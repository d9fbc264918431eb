"""Another user on the machine opens connections by the hundred to a run's master and to a host
agent's relay. The run's own ranks and panel reach the master through a unix socket in a 0700
folder, which a stranger cannot open; the TCP listener caps its connections below the
process's open-file limit, so the master keeps its files and keeps serving."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import grpc
import psutil
import pytest

from orch.errors import ConfigError
from orch.master.control.plan import RunPlan
from orch.master.coordinator import Coordinator
from orch.master.server import MasterServer
from orch.runtime.agent import HostAgent
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.auth import bearer
from orch.wire.client import MasterClient
from orch.wire.net import socket_parent, sweep_stale_sockets
from orch.wire.states import SERVICE_NAME
from tests.conftest import NOBODY, needs_second_uid

TESTS = Path(__file__).resolve().parents[1]

# The launching process, with a small open-file limit (hard and soft, so the master cannot
# raise it): its TCP listener then takes 1400 - 1024 = 376 connections at once.
LAUNCHER = textwrap.dedent(
    """
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (1400, 1400))
    import orch
    from orch.wire._proto import orchestrator_pb2 as orch_pb
    run = orch.launch("jobs:allreduce_steps", world_size=2, run_root=sys.argv[1],
                      config={"steps": 60, "sleep": 0.1})
    print(json.dumps({"tcp": run.address, "local": run.server.local_address}), flush=True)
    sys.stdin.readline()  # the flood holds its connections now
    client = run.connect()
    seen = client.get_state(skip_series=True)
    result = run.wait(timeout=120)
    history = run.history()["loss"]
    print(json.dumps({
        "state_during_flood": orch_pb.RunState.Name(seen.state),
        "result": result.state.name,
        "steps": {str(r): len(h["step"]) for r, h in history.items()},
        "open_files": len(__import__("os").listdir("/proc/self/fd")),
    }), flush=True)
    run.close()
    """
)

# A stranger: opens connections to HOST:PORT, sends the HTTP/2 preface and an empty SETTINGS
# frame on each (a connection the server has accepted and must keep), and holds them.
FLOOD = textwrap.dedent(
    """
    import socket, sys, time
    host, port = sys.argv[1].rsplit(":", 1)
    held = []
    for _ in range(int(sys.argv[2])):
        try:
            s = socket.create_connection((host, int(port)), timeout=2)
            s.sendall(b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            held.append(s)
        except OSError:
            pass
    print(len(held), flush=True)
    time.sleep(float(sys.argv[3]))
    """
)


def as_stranger(*args: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *args]


def state_over_tcp(address: str) -> grpc.StatusCode:
    """What a newcomer on the TCP port gets: OK, or why not."""
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        call = ch.unary_unary(
            f"/{SERVICE_NAME}/GetState",
            request_serializer=pb.GetStateRequest.SerializeToString,
            response_deserializer=pb.GetStateResponse.FromString,
        )
        try:
            call(pb.GetStateRequest(), timeout=3, metadata=(bearer("a stranger's guess"),))
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@needs_second_uid
def test_a_stranger_filling_the_masters_port_reaches_neither_its_ranks_nor_its_panel(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=TESTS,
    )
    flood: subprocess.Popen[str] | None = None
    try:
        assert launcher.stdout is not None and launcher.stdin is not None
        addresses = json.loads(launcher.stdout.readline())
        local = addresses["local"]
        assert local.startswith("unix:/")
        folder = Path(local[len("unix:") :]).parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
        # The stranger: 600 connections against a cap of 376, held for 60 s.
        flood = subprocess.Popen(
            as_stranger(sys.executable, "-c", FLOOD, addresses["tcp"], "600", "60"),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert flood.stdout is not None
        opened = int(flood.stdout.readline())
        assert opened > 0
        # The cap is reached: a newcomer on TCP is turned away (the master closes its
        # connection at once) rather than the master running out of open files.
        assert state_over_tcp(addresses["tcp"]) is grpc.StatusCode.UNAVAILABLE
        # ... and the stranger cannot open the private listener at all.
        probe = subprocess.run(
            as_stranger(
                sys.executable,
                "-c",
                f"import socket; socket.socket(socket.AF_UNIX).connect({str(folder / 'master')!r})",
            ),
            capture_output=True,
            text=True,
        )
        assert probe.returncode != 0 and "Permission denied" in probe.stderr
        launcher.stdin.write("go\n")
        launcher.stdin.flush()
        report = json.loads(launcher.stdout.readline())
        # The flood still held its connections when the run ended: the ranks trained through
        # it, not after the master's idle limit (30 s) cleared them.
        port = int(addresses["tcp"].rsplit(":", 1)[1])
        held = [
            c
            for c in psutil.Process(launcher.pid).net_connections("tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
        ]
        assert len(held) > 300, len(held)
        launcher.wait(60)  # run.close(), then the launching process exits
    finally:
        for process in (flood, launcher):
            if process is not None:
                if process.poll() is None:
                    process.kill()
                process.wait(30)
                for pipe in (process.stdin, process.stdout):
                    if pipe is not None:
                        pipe.close()
    # The panel's client (the private listener) read the state during the flood, and the
    # ranks, which beat through it, trained every step.
    assert report["state_during_flood"] in ("PENDING", "RUNNING", "SUCCEEDED")
    assert report["result"] == "SUCCEEDED"
    assert report["steps"] == {"0": 60, "1": 60}
    assert report["open_files"] < 1400
    assert not folder.exists()  # the private folder goes with the master


@needs_second_uid
def test_a_host_agents_relay_is_a_private_socket_no_stranger_can_open() -> None:
    agent = HostAgent("127.0.0.1:1", ranks=2, window=0.05, token="t")
    agent.start()
    try:
        assert agent.address.startswith("unix:/")
        path = agent.address[len("unix:") :]
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        probe = subprocess.run(
            as_stranger(
                sys.executable, "-c", f"import socket; socket.socket(socket.AF_UNIX).connect({path!r})"
            ),
            capture_output=True,
            text=True,
        )
        assert probe.returncode != 0 and "Permission denied" in probe.stderr
    finally:
        agent.stop()
    deadline = time.monotonic() + 5
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(os.path.dirname(path))


@pytest.mark.unit
def test_a_killed_servers_socket_folder_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    def folder_with_socket(name: str, *, listen: bool) -> tuple[Path, socket.socket]:
        folder = tmp_path / f"orch-{name}"
        folder.mkdir(mode=0o700)
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(folder / "master"))
        if listen:
            s.listen()
        return folder, s

    dead, dead_socket = folder_with_socket("dead", listen=False)  # bound, no listener: refused
    dead_socket.close()
    old = time.time() - 120
    os.utime(dead / "master", (old, old))  # bound two minutes ago, and never listened since
    live, live_socket = folder_with_socket("live", listen=True)
    starting = tmp_path / "orch-starting"  # a server between mkdtemp and its bind
    starting.mkdir()
    binding, binding_socket = folder_with_socket("binding", listen=False)  # bound just now, not yet listening
    other = tmp_path / "orch-other"  # not the shape of one of ours
    other.mkdir()
    (other / "notes.txt").write_text("x")
    try:
        assert sweep_stale_sockets(tmp_path) == [dead]
        assert (
            live.exists() and starting.exists() and other.exists() and binding.exists() and not dead.exists()
        )
    finally:
        live_socket.close()
        binding_socket.close()
    os.utime(live / "master", (old, old))
    assert sweep_stale_sockets(tmp_path) == [live]  # its server went away (a while ago)


def test_a_temp_dir_too_long_for_a_socket_path_puts_the_private_listener_under_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TMPDIR deeper than a unix socket's 107 bytes (a cluster job's scratch folder) once made
    every local launch fail with "port ... is already in use": the master's private listener
    could not bind. It now goes under /tmp, and the master serves on it."""
    long_tmp = tmp_path / ("t" * 60) / ("m" * 60)
    long_tmp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(long_tmp))
    server = MasterServer(Coordinator(RunPlan(1)), port=0, local_socket=True).start()
    try:
        path = server.local_address[len("unix:") :]
        assert len(path.encode()) <= 107 and not path.startswith(str(long_tmp))
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        client = MasterClient(server.local_address)
        try:
            client.wait_ready()
            assert client.get_state().run_id == server.coordinator.run_id
        finally:
            client.close()
    finally:
        server.stop()
    assert not os.path.exists(os.path.dirname(path))


@pytest.mark.unit
def test_no_folder_for_a_private_socket_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", "/" + "d" * 120)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    with pytest.raises(ConfigError, match="set TMPDIR to a short folder"):
        socket_parent("master")


def test_a_master_that_cannot_start_leaves_no_socket_folder() -> None:
    import tempfile

    from orch.errors import PortInUseError
    from orch.master.coordinator import Coordinator
    from orch.master.server import MasterServer

    def folders() -> set[str]:
        return {p.name for p in Path(tempfile.gettempdir()).glob("orch-*") if p.is_dir()}

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        before = folders()
        with pytest.raises(PortInUseError):
            MasterServer(Coordinator(RunPlan(1)), port=taken.getsockname()[1], local_socket=True).start()
    assert not (folders() - before)
    with MasterServer(Coordinator(RunPlan(1)), port=0, local_socket=True) as server:
        assert Path(server.local_address[len("unix:") :]).exists()
    assert not Path(server.local_address[len("unix:") :]).parent.exists()
