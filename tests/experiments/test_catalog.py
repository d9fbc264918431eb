"""The run catalog: ``orch.experiments.runs()`` and ``orch runs / show / logs`` over real run dirs.

One run root is made once for the module with real runs (succeeded, failed, stopped) and run
dirs made from copies of them as a crash or a hand edit leaves them; the tests that need a
run still going launch it themselves.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import orch
import orch.record.metrics_log
import orch.record.rundir
import orch.record.store
from conftest import ORCH, orch_cli, until
from orch.experiments.catalog import close_all, live_notice
from orch.experiments.run_detail import worker_of
from orch.experiments.run_table import RunTable, runs
from orch.launchers.run import Run
from orch.launchers.spec import LaunchSpec
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(300)

CRASHED_ID = "c0ffee000001"
HALF_WRITTEN_ID = "da0000000001"  # result.json cut short
EDITED_RESULT_ID = "da0000000002"  # result.json: a state orch has no name for
EDITED_META_ID = "da0000000003"  # run.json: world_size "four"
EVIL_NAME = "\x1b]0;pwned\x07<b>x</b>\x1b[2J\u202egnp.exe"


class Root:
    """The module's run root and the ids of what it holds."""

    def __init__(self, path: Path, ok: Run, failed: Run, stopped: Run, dead_pid: int) -> None:
        self.path = path
        self.ok, self.failed, self.stopped = ok.run_id, failed.run_id, stopped.run_id
        self.ok_losses = ok.wait(timeout=5).final_loss
        self.dead_pid = dead_pid
        self.states = {
            self.ok: "SUCCEEDED",
            self.failed: "FAILED",
            self.stopped: "STOPPED",
            CRASHED_ID: "CRASHED",
            HALF_WRITTEN_ID: "DAMAGED",
            EDITED_RESULT_ID: "DAMAGED",
            EDITED_META_ID: "DAMAGED",
        }


def _copy_run(root: Path, source: str, new_id: str, **meta_changes: Any) -> Path:
    """A copy of a real run dir under another id, as another run; ``None`` drops a field."""
    target = root / new_id
    shutil.copytree(root / source, target)
    meta = json.loads((target / "run.json").read_text())
    meta.update(run_id=new_id, **meta_changes)
    meta = {k: v for k, v in meta.items() if v is not None}
    (target / "run.json").write_text(json.dumps(meta))
    for log in (target / "logs").iterdir():  # workers are named after their run
        log.rename(log.with_name(log.name.replace(source, new_id)))
    events = target / "events.jsonl"
    events.write_text(events.read_text().replace(source, new_id))
    return target


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Root]:
    path = tmp_path_factory.mktemp("catalog") / "runs"
    ok = Run(
        LaunchSpec(
            fn="jobs:allreduce_steps",
            world_size=2,
            steps=6,
            config={"lr": 0.1},
            run_root=str(path),
            name="lr[0]",
            sweep="lr",
            config_key="k0",
        )
    )
    failed = Run(LaunchSpec(fn="jobs:raise_on_rank1", world_size=2, run_root=str(path)))
    stopped = Run(
        LaunchSpec(fn="jobs:long_barriers", world_size=2, config={"sleep": 0.05}, run_root=str(path))
    )
    try:
        for run in (ok, failed, stopped):
            run.start()
        until(lambda: any(r.step >= 2 for r in stopped.state().ranks), 180, 0.1)
        stopped.stop()
        ok.wait(180)
        with pytest.raises(orch.RunFailed):
            failed.wait(180)
        stopped.wait(180)
    finally:
        for run in (ok, failed, stopped):
            run.close()
    gone = subprocess.Popen(["true"])
    gone.wait()
    # What a kernel killed mid-run leaves: no result.json, and its pid no longer runs.
    crashed = _copy_run(
        path,
        ok.run_id,
        CRASHED_ID,
        pid=gone.pid,
        host=socket.gethostname(),
        name=EVIL_NAME,
        sweep=None,
        config_key=None,
    )
    (crashed / "result.json").unlink()
    half = _copy_run(path, failed.run_id, HALF_WRITTEN_ID)
    text = (half / "result.json").read_bytes()
    (half / "result.json").write_bytes(text[: len(text) // 2])
    edited = _copy_run(path, ok.run_id, EDITED_RESULT_ID, sweep=None, name=None, config_key=None)
    result = json.loads((edited / "result.json").read_text())
    (edited / "result.json").write_text(json.dumps({**result, "state": "DONE!"}))
    _copy_run(path, stopped.run_id, EDITED_META_ID, world_size="four")
    yield Root(path, ok, failed, stopped, gone.pid)


def _private_copy(root: Root, tmp_path: Path) -> Path:
    target = tmp_path / "runs"
    shutil.copytree(root.path, target)
    return target


def _live_run(run_root: Path, **options: Any) -> orch.Run:
    run = orch.launch("jobs:long_barriers", world_size=2, run_root=str(run_root), **options)
    try:
        until(lambda: len(run.state().ranks) == 2 and all(r.has_loss for r in run.state().ranks), 180, 0.1)
    except BaseException:
        run.close()
        raise
    return run


def test_the_table_has_every_run_in_its_state_without_reading_metrics(
    root: Root, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, subprocess_env: dict[str, str]
) -> None:
    run_root = _private_copy(root, tmp_path)
    live = _live_run(run_root, name="live-one", config={"sleep": 0.2})
    try:

        def no_metrics(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the table read metrics.pb")

        with monkeypatch.context() as m:
            m.setattr(orch.record.metrics_log, "read_metrics", no_metrics)
            m.setattr(orch.record.rundir, "read_metrics", no_metrics)
            table = runs(run_root)
        states = {row.run_id: row.state for row in table}
        assert states == {**root.states, live.run_id: "RUNNING"}
        assert table[0].run_id == live.run_id, "newest first"
        here = table[live.run_id]
        assert here.live_here and here.run is live and here.name == "live-one"
        assert [r.live_here for r in table].count(True) == 1
        assert table._repr_html_().count("live here</b>") == 1 and repr(table).count("(live here)") == 1
        assert here.final_loss is not None and 0 < here.final_loss <= 1.0
        assert here.final_loss == pytest.approx(sum(r.loss for r in here.ranks) / 2)

        ok = table[root.ok]
        assert (ok.name, ok.sweep, ok.config_key, ok.fn) == ("lr[0]", "lr", "k0", "jobs:allreduce_steps")
        assert (ok.config, ok.world_size, ok.attempts) == ({"lr": 0.1, "steps": 6}, 2, 1)
        assert ok.final_loss == pytest.approx(sum(root.ok_losses) / len(root.ok_losses))
        assert ok.duration is not None and ok.duration > 0 and ok.started is not None
        assert not ok.live_here and ok.run is None

        failed = table[root.failed]
        assert "boom on rank 1" in failed.note and failed.root_cause_rank == 1

        crashed = table[CRASHED_ID]
        launcher = f"launcher exited (pid {root.dead_pid}) without a record"
        assert crashed.note.startswith(launcher), crashed.note
        assert "result.json" in crashed.note
        assert crashed.attempts == 1 and crashed.duration is not None and crashed.final_loss is None
        assert "not valid JSON" in table[HALF_WRITTEN_ID].note
        assert "result.json" in table[EDITED_RESULT_ID].note and "'state'" in table[EDITED_RESULT_ID].note
        assert "run.json" in table[EDITED_META_ID].note and "'world_size'" in table[EDITED_META_ID].note

        # Another process sees the run going through its launching process: this one.
        out = orch_cli("runs", "--json", "--run-root", str(run_root), env=subprocess_env, timeout=120)
        assert out.returncode == 0, out.stderr
        listed = json.loads(out.stdout)
        assert {r["run_id"]: r["state"] for r in listed} == states
        seen = {r["run_id"]: r for r in listed}
        assert seen[live.run_id]["live_here"] is False and seen[live.run_id]["pid"] == os.getpid()
        assert seen[live.run_id]["final_loss"] is None, "not this process's run: its loss is not read"
        assert seen[root.ok]["sweep"] == "lr" and seen[root.ok]["config"] == {"lr": 0.1, "steps": 6}
        assert seen[root.ok]["final_loss"] == pytest.approx(ok.final_loss)
        text = orch_cli("runs", "--run-root", str(run_root), env=subprocess_env, timeout=120)
        assert text.returncode == 0 and root.ok in text.stdout and "CRASHED" in text.stdout
        assert "\x1b" not in text.stdout and "\x07" not in text.stdout
        failed_only = orch_cli(
            "runs", "--json", "--state", "failed", "--run-root", str(run_root), env=subprocess_env
        )
        assert [r["run_id"] for r in json.loads(failed_only.stdout)] == [root.failed]
        of_sweep = orch_cli(
            "runs", "--json", "--sweep", "lr", "--run-root", str(run_root), env=subprocess_env
        )
        assert [r["run_id"] for r in json.loads(of_sweep.stdout)] == [root.ok]

        notice = live_notice()
        assert notice is not None and "\n" not in notice
        assert live.run_id in notice and "RUNNING" in notice and "launched" in notice
        assert "orch.close_all()" in notice
        assert close_all() == 1
    finally:
        live.close()
    assert live.done and live_notice() is None and close_all() == 0
    after = runs(run_root)[live.run_id]
    assert after.state == "FAILED" and "closed while it was running" in after.note and not after.live_here


def test_filter_and_load(root: Root) -> None:
    table = runs(root.path)
    ids = lambda t: {r.run_id for r in t}  # noqa: E731
    assert ids(table.filter(state="FAILED")) == {root.failed}
    assert ids(table.filter(state=["FAILED", "CRASHED"])) == {root.failed, CRASHED_ID}
    assert ids(table.filter(state="DAMAGED")) == {HALF_WRITTEN_ID, EDITED_RESULT_ID, EDITED_META_ID}
    assert ids(table.filter(sweep="lr")) == {root.ok}
    assert ids(table.filter(lr=0.1)) == {root.ok, CRASHED_ID, EDITED_RESULT_ID}
    assert ids(table.filter(lr=0.1, state="SUCCEEDED")) == {root.ok}
    assert ids(table.filter(config={"steps": 6}, sweep="lr")) == {root.ok}
    assert len(table.filter(lr=0.2)) == 0
    assert len(table.filter(steps=True)) == 0, "True is not 1, nor 6"
    with pytest.raises(orch.ConfigError, match="FAILD"):
        table.filter(state="FAILD")

    loaded = table[root.ok].load()
    assert isinstance(loaded, orch.LoadedRun) and loaded.run_id == root.ok
    assert loaded.state().state is orch.RunState.SUCCEEDED
    assert set(loaded.history()["loss"]) == {0, 1}
    assert table[root.failed[:8]].load().state().root_cause_rank == 1
    with pytest.raises(orch.OrchError, match=r"result\.json"):
        table[HALF_WRITTEN_ID].load()
    with pytest.raises(KeyError):
        table["nope"]
    assert isinstance(table[1:3], RunTable) and len(table[1:3]) == 2


def test_html_and_text_show_what_was_edited_by_hand_harmlessly(root: Root) -> None:
    table = runs(root.path)
    page = table._repr_html_()
    assert page.startswith("<table") and page.count("<tr>") == len(table) + 1
    for run_id, state in root.states.items():
        assert run_id in page and state in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert "\x1b" not in page and "\x07" not in page and "\u202e" not in page and "\\u202egnp" in page
    text = repr(table)
    assert f"{len(table)} runs under" in text and "\x1b" not in text and "\x07" not in text
    assert "\u202e" not in text
    assert all(run_id in text for run_id in root.states)
    assert "DAMAGED" in repr(table.filter(state="DAMAGED"))
    assert repr(table.filter(lr=0.3)).startswith("no runs under")


def test_show_names_the_root_cause_with_its_traceback(root: Root, subprocess_env: dict[str, str]) -> None:
    out = orch_cli("show", root.failed[:6], "--run-root", str(root.path), env=subprocess_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"run {root.failed}  FAILED")
    assert "root cause (rank 1)" in out.stdout and "boom on rank 1" in out.stdout
    assert "Traceback (most recent call last)" in out.stdout and "RuntimeError: boom on rank 1" in out.stdout
    assert "jobs:raise_on_rank1" in out.stdout
    # Rank 1's row names its worker: ranks follow registration order, so which worker of the
    # run holds rank 1 depends on which process registered first.
    assert any(
        line.split()[:1] == ["1"] and line.split()[1] in (f"{root.failed}-w0", f"{root.failed}-w1")
        for line in out.stdout.splitlines()
        if len(line.split()) > 1
    )

    crashed = orch_cli("show", str(root.path / CRASHED_ID), env=subprocess_env, timeout=120)
    assert crashed.returncode == 0 and "CRASHED" in crashed.stdout and "\x1b" not in crashed.stdout

    unknown = orch_cli("show", "nosuchrun", "--run-root", str(root.path), env=subprocess_env, timeout=120)
    assert unknown.returncode == 2 and "no run 'nosuchrun'" in unknown.stderr
    newest = [r.run_id for r in runs(root.path)[:5]]
    assert all(run_id in unknown.stderr for run_id in newest)


def test_logs_of_one_rank(root: Root, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    run_dir = tmp_path / root.failed
    shutil.copytree(root.path / root.failed, run_dir)
    worker = worker_of(run_dir, 1)
    assert worker is not None
    with open(run_dir / "logs" / f"{worker}.log", "a") as f:
        f.write("hand-edited \x1b]0;pwned\x07\x1b[2Jline\n")
    out = orch_cli("logs", str(run_dir), "--rank", "1", env=subprocess_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"worker {worker} registered as rank 1" in out.stdout
    assert "RuntimeError: boom on rank 1" in out.stdout
    assert "hand-edited line" in out.stdout and "\x1b" not in out.stdout
    rank0 = orch_cli("logs", str(run_dir), env=subprocess_env, timeout=120)
    assert rank0.returncode == 0 and "registered as rank 0" in rank0.stdout
    missing = orch_cli("logs", str(run_dir), "--rank", "5", env=subprocess_env, timeout=120)
    # a rank the run does not have is a bad argument, as every other one
    assert missing.returncode == 2 and f"--rank 5: run {root.failed} has 2 ranks (0 to 1)" in missing.stderr


def test_logs_follow_ends_when_the_run_ends(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    run_root = tmp_path / "runs"
    live = _live_run(run_root, config={"sleep": 0.05})
    follow = subprocess.Popen(
        [ORCH, "logs", live.run_id, "--follow", "--rank", "0", "--run-root", str(run_root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env,
    )
    try:
        seen = b""
        assert follow.stdout is not None
        deadline = time.monotonic() + 120
        while b"registered as rank 0" not in seen and time.monotonic() < deadline:
            if select.select([follow.stdout], [], [], 1.0)[0]:
                seen += os.read(follow.stdout.fileno(), 65536)
        assert b"registered as rank 0" in seen
        time.sleep(1.0)
        assert follow.poll() is None, "it ended while the run still went"
        live.stop()
        live.wait(120)
        out, err = follow.communicate(timeout=60)
    finally:
        live.close()
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    # The rank's last words, written as the run ended, came before the command did.
    assert b"RANK_STOPPED" in seen + out


def test_a_launch_cell_run_twice_names_the_run_still_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"steps": 100000, "sleep": 0.02}
    first = orch.launch("jobs:allreduce_steps", world_size=2, config=config, run_root=str(tmp_path))
    try:
        assert capsys.readouterr().out == ""  # nothing was live before it
        second = orch.launch("jobs:allreduce_steps", world_size=2, config=config, run_root=str(tmp_path))
        try:
            out = capsys.readouterr().out
            assert f"orch: run {first.run_id} (" in out and "is still" in out and "orch.close_all()" in out
            table = orch.runs(str(tmp_path))
            assert {row.run_id for row in table if row.live_here} == {first.run_id, second.run_id}
            # `run` now names the second run: the notice's command reaches the first one.
            command = f"orch.attach({first.run_id!r}).stop()"
            assert command in out
            assert eval(command, {"orch": orch}) in (RunState.STOPPING, RunState.STOPPED)
            assert first.wait(timeout=120).state is RunState.STOPPED
            assert not second.state().state.done  # the new run goes on (it may still be starting)
        finally:
            assert orch.close_all() == 1
    finally:
        first.close()
    assert orch.close_all() == 0
    states = {row.run_id: row.state for row in orch.runs(str(tmp_path))}
    assert states == {first.run_id: "STOPPED", second.run_id: "FAILED"}  # the second closed while running


def test_close_all_ends_a_sweep_too(tmp_path: Path) -> None:
    configs = [{"lr": lr, "steps": 100000, "sleep": 0.02} for lr in (0.01, 0.02, 0.03)]
    sweep = orch.sweep("jobs:lr_job", configs, world_size=2, run_root=str(tmp_path))
    until(lambda: sweep.trials[0].state == "RUNNING", 60)
    assert orch.close_all() == 1
    assert sweep.wait(30)[0]["state"] == "FAILED"
    assert [t.state for t in sweep.trials[1:]] == ["CANCELLED", "CANCELLED"]
    assert len(list(tmp_path.glob("*/run.json"))) == 1  # no config started in the closed one's place
