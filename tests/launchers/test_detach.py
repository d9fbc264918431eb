"""Runs that outlive their kernel by choice: ``orch.launch(..., detach=True)`` and ``orch.attach``.

The launching process is a small script run here as a subprocess, so that it can be killed
(its whole process group, as a kernel restart does) while its detached run goes on; pytest
itself then attaches, as a fresh kernel would, by run dir and by run id.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import comm
import psutil
import pytest
from comm.base_comm import BaseComm

import orch
from conftest import TESTS, notebook_kernel, tagged_processes, until
from orch.launchers.attach_file import ATTACH_FILE
from orch.launchers.detached.run import DetachedRun
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(300)
sys.path.insert(0, str(TESTS))

LAUNCHER = """
import json, sys, time
sys.path.insert(0, {tests!r})
import orch

def train(ctx):  # defined in the launching script: it travels by value, as a notebook cell's does
    import time
    import torch.distributed as dist
    for step in ctx.steps(1_000_000):
        dist.barrier()
        ctx.log(step, loss=1.0 / (step + 1))
        time.sleep(0.05)

run = orch.launch(train, world_size=2, run_root={root!r}, heartbeat_timeout=120.0, detach={detach})
print(json.dumps({{"run_dir": str(run.run_dir), "run_id": run.run_id}}), flush=True)
time.sleep(3600)
"""


class RecordingComm(BaseComm):
    """A comm that keeps what a widget would send to the browser (as in test_panel)."""

    sent: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def publish_msg(
        self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any
    ) -> None:
        with self.lock:
            self.sent.append((self.comm_id, {"type": msg_type, "data": data or {}}))


@pytest.fixture
def widgets_comm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    RecordingComm.sent = []
    monkeypatch.setattr(comm, "create_comm", lambda *a, **kw: RecordingComm(*a, **kw))
    yield


def _start_launcher(tmp_path: Path, *, detach: bool) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """The launching script, in a process group of its own; what it printed of its run."""
    script = tmp_path / "launch_it.py"
    script.write_text(LAUNCHER.format(tests=str(TESTS), root=str(tmp_path / "runs"), detach=detach))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the launching script printed nothing (exit code {proc.poll()})")
    return proc, json.loads(line)


def _steps(run: DetachedRun) -> list[int]:
    return [r.step for r in run.state().ranks]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_detached_run_outlives_its_launcher_and_is_attached_by_dir_and_id(
    tmp_path: Path, no_leftover_processes: str, widgets_comm: None
) -> None:
    launcher, info = _start_launcher(tmp_path, detach=True)
    run_dir = Path(info["run_dir"])
    supervisor = None
    try:
        run = orch.attach(info["run_dir"])  # a fresh process: address and token from attach.json
        assert isinstance(run, DetachedRun)
        supervisor = run.supervisor_pid
        assert supervisor is not None
        assert os.getsid(supervisor) != os.getsid(launcher.pid)  # a session of its own
        until(lambda: len(_steps(run)) == 2 and min(_steps(run)) >= 3, 120)
        assert (run_dir / ATTACH_FILE).stat().st_mode & 0o777 == 0o600

        os.killpg(launcher.pid, signal.SIGKILL)  # the kernel and its whole process group
        launcher.wait()
        at_kill = max(_steps(run))
        until(lambda: min(_steps(run)) > at_kill + 10, 120)  # training goes on
        assert _running(supervisor)

        by_id = orch.attach(info["run_id"], run_root=tmp_path / "runs")
        assert isinstance(by_id, DetachedRun) and by_id.run_id == info["run_id"]
        panel = by_id.panel(interval=0.1)
        until(lambda: panel.polls > 0, 30)
        for rank, series in by_id.history()["loss"].items():
            # every step from the first, also those logged before this process attached
            assert series["step"] == list(range(len(series["step"]))), rank
            assert len(series["step"]) > at_kill + 10
        assert set(panel.mirror.history()["loss"]) == {0, 1}
        assert panel.mirror.history()["loss"][0]["step"][0] == 0

        assert by_id.stop("stopped from a fresh kernel") in (RunState.STOPPING, RunState.STOPPED)
        result = by_id.wait(timeout=120)
        assert result.state is RunState.STOPPED
        assert panel.wait_done(30)
        assert 'data-state="STOPPED"' in panel.header.value
        assert json.loads((run_dir / "result.json").read_text())["state"] == "STOPPED"
        assert not (run_dir / ATTACH_FILE).exists()
        assert not _running(supervisor)
        # the supervisor, its forkserver and its workers: nothing of the run is left
        until(lambda: not tagged_processes(no_leftover_processes), 10)

        # Its master is gone: the first handle, and a new one, read the end from the run dir.
        assert run.wait(timeout=10).state is RunState.STOPPED
        ended = orch.attach(run_dir)
        assert isinstance(ended, DetachedRun) and ended.done
        assert ended.state().state is RunState.STOPPED
        assert ended.wait(timeout=5).state is RunState.STOPPED
        steps = ended.history()["loss"][1]["step"]
        assert steps == list(range(len(steps))) and len(steps) > at_kill + 10
        for handle in (run, by_id, ended):
            handle.disconnect()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()
        if supervisor is not None and _running(supervisor):
            os.kill(supervisor, signal.SIGKILL)  # its workers follow it


def test_a_run_not_detached_still_ends_with_its_launcher(tmp_path: Path) -> None:
    launcher, info = _start_launcher(tmp_path, detach=False)
    try:
        me = psutil.Process(launcher.pid)
        metrics = Path(info["run_dir"]) / "metrics.pb"
        until(lambda: metrics.exists() and metrics.stat().st_size > 0, 120)  # its workers train
        started = me.children(recursive=True)
        assert len(started) >= 3  # the forkserver and two workers
        os.kill(launcher.pid, signal.SIGKILL)  # it alone, as the OOM killer does
        launcher.wait()
        until(lambda: not any(p.is_running() and _running(p.pid) for p in started), 10)
        # Its attach.json, which it had no time to remove, names a dead process: attaching reads
        # the run dir instead of dialling a master that is gone.
        again = orch.attach(info["run_dir"])
        assert isinstance(again, DetachedRun) and again.done and again.address == ""
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()


def test_close_ends_a_detached_run_and_disconnect_leaves_it_going(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:long_barriers", world_size=2, run_root=str(tmp_path), detach=True, heartbeat_timeout=120.0
    )
    supervisor = run.supervisor_pid
    assert supervisor is not None
    try:
        until(lambda: len(_steps(run)) == 2 and min(_steps(run)) >= 3, 120)
        run.disconnect()  # lets go only
        again = orch.attach(run.run_id, run_root=tmp_path)
        assert isinstance(again, DetachedRun)
        before = min(_steps(again))
        until(lambda: min(_steps(again)) > before + 5, 60)
        again.close()  # ends it, through its supervisor, as Run.close() ends a launched run
        assert not _running(supervisor)
        with pytest.raises(orch.RunFailed, match="closed while it was running"):
            again.wait(timeout=10)
        with pytest.raises(orch.RunFailed):
            run.wait(timeout=10)
        assert json.loads((run.run_dir / "result.json").read_text())["state"] == "FAILED"
        assert not (run.run_dir / ATTACH_FILE).exists()
    finally:
        if _running(supervisor):
            os.kill(supervisor, signal.SIGKILL)


def test_a_start_up_error_in_the_supervisor_is_raised_by_launch(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(orch.ConfigError, match=f"port {port}"):
            orch.launch(world_size=1, master_port=port, run_root=str(tmp_path), detach=True)


def _fake_run_dir(tmp_path: Path, *, pid: int, mode: int = 0o600) -> Path:
    run_dir = tmp_path / "runs" / "abc123"
    run_dir.mkdir(parents=True, mode=0o700)
    (run_dir / "run.json").write_text(json.dumps({"run_id": "abc123", "world_size": 1}))
    attach = run_dir / ATTACH_FILE
    attach.write_text(
        json.dumps(
            {
                "run_id": "abc123",
                "address": "127.0.0.1:1",
                "token": "t",
                "tls_ca": None,
                "tls_server_name": None,
                "pid": pid,
                "start_time": None,
                "host": socket.gethostname(),
            }
        )
    )
    attach.chmod(mode)
    return run_dir


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_attach_refuses_an_attach_file_others_can_read(tmp_path: Path, mode: int) -> None:
    run_dir = _fake_run_dir(tmp_path, pid=_dead_pid(), mode=mode)
    with pytest.raises(orch.ConfigError, match=f"can be read by other users \\(mode {mode:04o}\\)"):
        orch.attach(str(run_dir))
    with pytest.raises(orch.ConfigError, match="can be read by other users"):
        orch.attach("abc123", run_root=tmp_path / "runs")


def test_attach_refuses_an_attach_file_that_is_a_link(tmp_path: Path) -> None:
    run_dir = _fake_run_dir(tmp_path, pid=_dead_pid())
    (run_dir / ATTACH_FILE).rename(tmp_path / "elsewhere.json")
    (run_dir / ATTACH_FILE).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(orch.ConfigError, match="symbolic link"):
        orch.attach(str(run_dir))


def test_attach_to_a_run_whose_supervisor_died_shows_how_it_ended(tmp_path: Path) -> None:
    run_dir = _fake_run_dir(tmp_path, pid=_dead_pid())
    run = orch.attach(str(run_dir))
    assert isinstance(run, DetachedRun) and run.done and run.address == ""
    assert run.state().state is RunState.FAILED
    with pytest.raises(orch.RunFailed, match="did not finish"):
        run.wait(timeout=5)


def test_attach_tells_a_run_dir_from_a_run_id_from_an_address(tmp_path: Path) -> None:
    empty = "no run 'no-such-run': not a run dir, nor a master's HOST:PORT, and .* holds no runs"
    with pytest.raises(orch.ConfigError, match=empty):
        orch.attach("no-such-run", run_root=tmp_path)
    with pytest.raises(orch.ConfigError, match="is not an orch run dir"):
        orch.attach(str(tmp_path))  # a folder, but no run's
    run_dir = _fake_run_dir(tmp_path, pid=_dead_pid())
    assert orch.attach("abc", run_root=tmp_path / "runs").run_dir == run_dir  # the start of its id
    (run_dir / ATTACH_FILE).unlink()
    with pytest.raises(orch.ConfigError, match=r"no attach\.json"):
        orch.attach(str(run_dir))  # a run dir, but no detached run's
    run_dir = _fake_run_dir(tmp_path / "again", pid=_dead_pid())
    with pytest.raises(orch.ConfigError, match="leave token= and tls_ca= out"):
        orch.attach(str(run_dir), token="x")
    with pytest.raises(orch.MasterUnavailable):
        orch.attach("127.0.0.1:1", token="x", timeout=0.5)  # an address: dialled, nobody there


CELL = """\
import json, orch

def bad_day(ctx):
    for step in ctx.steps(50):
        ctx.log(step, loss=1.0 / (step + 1))
        if ctx.rank == 1 and step == 3:
            raise ValueError("the data on rank 1 went bad")  # the raising line
"""

RUN_CELL = """\
run = orch.launch(bad_day, world_size=2, run_root={run_root!r}, detach=True)
try:
    run.wait(timeout=120)
except orch.RunFailed as e:
    print(json.dumps({{"traceback": e.traceback, "rank": e.rank}}))
"""


def test_a_cell_function_of_a_detached_run_shows_its_cell_in_tracebacks(tmp_path: Path) -> None:
    with notebook_kernel(tmp_path) as (_, kc):
        out: list[str] = []
        for code in (CELL, RUN_CELL.format(run_root=str(tmp_path))):
            reply = kc.execute_interactive(
                code, timeout=180, output_hook=lambda m: out.append(m["content"].get("text", ""))
            )
            assert reply["content"]["status"] == "ok", reply["content"]
    seen = json.loads("".join(out).strip().splitlines()[-1])
    assert seen["rank"] == 1
    # The supervisor never saw the kernel's cells: the launching kernel's source map reached the ranks.
    assert "Cell In[1], line 7, in bad_day" in seen["traceback"], seen["traceback"]
    assert 'raise ValueError("the data on rank 1 went bad")  # the raising line' in seen["traceback"]
