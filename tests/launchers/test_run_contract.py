"""One run contract: the same calls on a run launched here, detached, attached by its run id,
attached by its master's address and loaded from disk give the same types and answers."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import orch
from orch.launchers.attached import open_run
from orch.launchers.contract import RunHandle, RunResult
from orch.wire.states import RunState

CONFIG = {"steps": 12}
KINDS = ("launched", "attached by address", "loaded", "detached", "attached by id", "detached, loaded")


def _calls(run: Any) -> dict[str, Any]:
    """What every run answers, the same way: the result of wait(), its state, its history."""
    assert isinstance(run, RunHandle)
    result = run.wait(timeout=120)
    again = run.wait(timeout=1)  # an ended run answers at once, the same
    assert isinstance(result, RunResult) and isinstance(again, RunResult)
    assert (again.run_id, again.state, again.steps) == (result.run_id, result.state, result.steps)
    state = run.state()
    assert run.stop() is state.state  # nothing to stop: the state it ended in
    return {
        "run_id": run.run_id,
        "result": (result.run_id, result.state, result.world_size, result.steps),
        "state": (state.run_id, state.state, [r.step for r in state.ranks]),
        "history": run.history(),
    }


def test_every_kind_of_run_answers_the_same_calls_the_same_way(tmp_path: Path) -> None:
    root = str(tmp_path)
    seen: dict[str, dict[str, Any]] = {}
    with orch.launch("jobs:allreduce_steps", world_size=2, config=CONFIG, run_root=root) as run:
        by_address = orch.attach(run.address, token=run.token)
        # One function turns a name into a run: the live run itself for its id or dir.
        assert open_run(run.run_id, root) is run and open_run(str(run.run_dir)) is run
        assert open_run(run) is run
        try:
            seen["launched"] = _calls(run)
            seen["attached by address"] = _calls(by_address)
        finally:
            by_address.close()
        assert by_address.run_dir is None and run.run_dir == tmp_path / run.run_id
    seen["loaded"] = _calls(orch.load_run(run.run_dir))
    assert isinstance(open_run(run.run_id, root), orch.LoadedRun)  # closed: its record

    detached = orch.launch("jobs:allreduce_steps", world_size=2, config=CONFIG, run_root=root, detach=True)
    try:
        by_id = orch.attach(detached.run_id, run_root=root)
        followed = open_run(detached.run_id, root)
        assert isinstance(followed, orch.DetachedRun) and followed.run_id == detached.run_id
        followed.disconnect()  # lets go of it only
        seen["detached"] = _calls(detached)
        seen["attached by id"] = _calls(by_id)
    finally:
        detached.close()
    seen["detached, loaded"] = _calls(orch.load_run(detached.run_dir))

    with pytest.raises(orch.ConfigError, match="nor a master's HOST:PORT"):
        open_run("no-such-run", root)
    assert sorted(seen) == sorted(KINDS)
    for kind in KINDS:
        what = seen[kind]
        assert what["result"][1] is RunState.SUCCEEDED and what["result"][3] == [12, 12], (kind, what)
        first = seen["launched" if kind in KINDS[:3] else "detached"]
        assert what["run_id"] == first["run_id"], kind
        assert what["result"] == first["result"] and what["state"] == first["state"], kind
        assert what["history"] == first["history"], kind
        assert what["history"]["loss"][1]["step"] == list(range(12)), kind
    assert seen["launched"]["run_id"] != seen["detached"]["run_id"]


def test_a_failed_run_raises_the_same_error_from_every_kind(tmp_path: Path) -> None:
    root = str(tmp_path)
    errors: dict[str, str] = {}
    with orch.launch("jobs:raise_on_rank1", world_size=2, run_root=root) as run:
        by_address = orch.attach(run.address, token=run.token)
        try:
            for kind, handle in (("launched", run), ("attached by address", by_address)):
                with pytest.raises(orch.RunFailed) as e:
                    handle.wait(timeout=120)
                errors[kind] = str(e.value)
        finally:
            by_address.close()
    with pytest.raises(orch.RunFailed) as e:
        orch.load_run(run.run_dir).wait()
    errors["loaded"] = str(e.value)
    assert len(set(errors.values())) == 1, errors
    assert "rank 1" in errors["loaded"], errors


def test_the_run_kinds_implement_one_contract() -> None:
    kinds = [orch.Run, orch.DetachedRun, orch.AttachedRun, orch.LoadedRun]
    for kind in kinds:
        assert issubclass(kind, RunHandle), kind
        assert not inspect.isabstract(kind), kind
        assert inspect.signature(kind.wait).return_annotation in ("RunResult", RunResult), kind
