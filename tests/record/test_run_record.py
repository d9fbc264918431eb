"""The record on disk is what happened: result.json is written last, with the final state."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import orch
from orch.views.waiting import wait_for
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(240)


def _result(run_dir: Path) -> dict[str, object]:
    value = json.loads((run_dir / "result.json").read_text())
    assert isinstance(value, dict)
    return value


def test_close_on_a_live_run_records_how_it_ended(tmp_path: Path) -> None:
    run = orch.launch("jobs:long_barriers", world_size=2, run_root=str(tmp_path))
    try:
        assert wait_for(lambda: all(r.step > 2 for r in run.state().ranks) and run.state().ranks, 120)
    finally:
        run.close()
    said = run.state()
    assert said.state is RunState.FAILED and "closed while it was running" in said.failure
    record = _result(run.run_dir)
    assert record["state"] == "FAILED" and "closed while it was running" in str(record["failure"])
    loaded = orch.load_run(run.run_dir).state()
    assert loaded.state is said.state and loaded.failure == said.failure
    assert [r.state for r in loaded.ranks] == [r.state for r in said.ranks]


def test_close_after_stop_records_stopped(tmp_path: Path) -> None:
    run = orch.launch("jobs:long_barriers", world_size=2, run_root=str(tmp_path), config={"sleep": 0.5})
    try:
        assert wait_for(lambda: run.state().state is RunState.RUNNING, 120)
        run.stop()
    finally:
        run.close()  # before the ranks had time to finish their step
    assert run.state().state is RunState.STOPPED
    assert _result(run.run_dir)["state"] == "STOPPED"
    assert orch.load_run(run.run_dir).state().state is RunState.STOPPED


def test_a_launch_that_fails_on_a_taken_port_leaves_a_failed_record(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(orch.PortInUseError, match=str(port)):
            orch.launch("jobs:long_barriers", world_size=2, run_root=str(tmp_path), rdzv_port=port)
        # launch() names its own argument, not a flag of orch run or orch master.
        with pytest.raises(orch.PortInUseError, match="pass master_port=<another port>"):
            orch.launch("jobs:long_barriers", world_size=2, run_root=str(tmp_path / "m"), master_port=port)
    (run_dir,) = [d for d in tmp_path.iterdir() if d.name != "m"]
    record = _result(run_dir)
    assert record["state"] == "FAILED"
    assert "launch failed" in str(record["failure"]) and str(port) in str(record["failure"])
    assert orch.load_run(run_dir).state().state is RunState.FAILED


def test_a_finished_run_and_its_record_agree(tmp_path: Path) -> None:
    with orch.launch("jobs:allreduce_steps", world_size=2, run_root=str(tmp_path), steps=5) as run:
        result = run.wait(timeout=120)
    assert result.state is RunState.SUCCEEDED
    assert _result(run.run_dir)["state"] == "SUCCEEDED"
    loaded = orch.load_run(run.run_dir).state()
    assert loaded.state is RunState.SUCCEEDED
    assert [r.step for r in loaded.ranks] == result.steps == [5, 5]


def test_attach_polls_only_what_changed(tmp_path: Path) -> None:
    with orch.launch(
        "jobs:allreduce_steps", world_size=2, run_root=str(tmp_path), steps=40, config={"sleep": 0.02}
    ) as run:
        attached = orch.attach(run.address, token=run.token)
        try:
            first = attached.state()
            assert wait_for(lambda: sum(len(b) for b in attached.state().series.values()) > 20, 120)
            total = sum(len(b) for b in attached.state().series.values())
            assert attached._mirror.last_points < total  # the last poll carried only new points
            result = attached.wait(timeout=120)
            last = attached.state()
        finally:
            attached.close()
        assert first is last  # one mirror, brought up to date in place
        assert result.state is RunState.SUCCEEDED and result.run_id == last.run_id
        assert last.history() == run.history()


def test_a_stop_while_the_group_restarts_ends_the_run_stopped(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:checkpointed_slow_teardown",
        world_size=2,
        run_root=str(tmp_path),
        max_restarts=2,
        config={"steps": 1_000, "die_at": 15},
    )
    try:
        # The survivor ignores SIGTERM, so the tear-down lasts the launcher's grace (1.5 s).
        assert wait_for(lambda: run.coordinator.state is RunState.RESTARTING, 120, interval=0.005)
        run.stop()
        result = run.wait(timeout=60)
    finally:
        run.close()
    assert result.state is RunState.STOPPED
    assert run.coordinator.attempt == 1  # no next attempt was started
    assert any("stopped while restarting" in e[3] for e in run.state().events)
    assert _result(run.run_dir)["state"] == "STOPPED"
