"""What ``ctx.log`` accepts, and that one bad value never costs the run its metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import orch
from conftest import ROOT
from orch.errors import StopTraining
from orch.runtime._sender import HeartbeatSender
from orch.runtime.context import Context
from orch.views.waiting import wait_for
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(240)


def _context() -> tuple[Context, HeartbeatSender]:
    sender = HeartbeatSender(
        None,  # type: ignore[arg-type]  # never started: only its queue is read
        run_id="r",
        worker_id="w",
        on_stop=lambda: None,
        on_abort=lambda reason: None,
    )
    ctx = Context(
        rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), config={}, run_id="r", sender=sender
    )
    return ctx, sender


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.5, 0.5),
        (3, 3),
        (True, 1.0),
        (np.float32(0.25), 0.25),
        (np.int64(7), 7.0),
        (np.bool_(False), 0.0),
        (torch.tensor(2.5), 2.5),
        (torch.tensor([4.0]), 4.0),
        (torch.tensor(True), 1.0),
        (np.array([1.5]), 1.5),
        (float("nan"), math.nan),
        (float("inf"), math.inf),
    ],
)
def test_real_numbers_are_accepted(value: Any, expected: float) -> None:
    ctx, sender = _context()
    ctx.log(3, loss=0.1, value=value)
    ((step, _, values),) = sender._queue
    assert step == 3 and values["loss"] == 0.1
    got = values["value"]
    assert type(got) in (float, int)
    assert got == expected or (math.isnan(expected) and math.isnan(got))


@pytest.mark.parametrize(
    "value",
    ["sgd", b"x", [1.0], (1.0,), {"a": 1}, 1 + 2j, torch.ones(2), torch.tensor(1 + 1j), np.ones(3), object()],
)
def test_anything_else_raises_typeerror_naming_the_key(value: Any) -> None:
    ctx, sender = _context()
    with pytest.raises(TypeError, match="opt="):
        ctx.log(1, loss=0.5, opt=value)
    assert not sender._queue  # nothing half-logged


@pytest.mark.parametrize("step", [1.5, 2.0, "3", None, True, torch.tensor(1.5)])
def test_a_step_that_is_not_an_integer_raises_typeerror(step: Any) -> None:
    ctx, _ = _context()
    with pytest.raises(TypeError, match="step must be an integer"):
        ctx.log(step, loss=0.5)


def test_integer_like_steps_and_none_values() -> None:
    ctx, sender = _context()
    ctx.log(np.int64(4), loss=None, acc=None, lr=0.1)
    ctx.log(torch.tensor(5), loss=0.2)
    assert [(s, v) for s, _, v in sender._queue] == [(4, {"lr": 0.1}), (5, {"loss": 0.2})]
    with pytest.raises(ValueError, match="step must be between"):
        ctx.log(-1, loss=0.5)


def test_progress_is_the_larger_of_the_loop_step_and_the_logged_step() -> None:
    ctx, sender = _context()
    ctx.log(41, loss=0.5)
    assert sender.progress == 42  # steps 0..41 done
    ctx.log(7, loss=0.5)
    assert sender.progress == 42
    sender.step = 50
    assert sender.progress == 50
    ctx.total_steps = 100
    assert sender.total_steps == 100
    with pytest.raises(TypeError):
        ctx.total_steps = 1.5  # type: ignore[assignment]


def test_a_bad_point_given_to_the_sender_directly_costs_only_itself() -> None:
    _, sender = _context()
    sender.log(0, {"loss": 1.0})
    sender.log(1, {"loss": "oops"})  # type: ignore[dict-item]
    sender.log(2, {"loss": 0.5})
    request = sender._request(sender._drain())
    (series,) = request.series
    assert list(series.steps) == [0, 2] and list(series.values) == [1.0, 0.5]
    assert request.dropped_points == 1 and request.step == 3
    assert isinstance(request, pb.HeartbeatRequest)


def test_a_run_that_logs_a_string_fails_at_once_naming_the_key(tmp_path: Path) -> None:
    with (
        orch.launch("jobs:logs_a_string", world_size=2, run_root=str(tmp_path)) as run,
        pytest.raises(orch.RunFailed) as e,
    ):
        run.wait(timeout=120)
    assert "TypeError" in str(e.value) and "opt='sgd'" in str(e.value)
    assert "opt='sgd'" in e.value.traceback


def test_a_rank_that_fails_reports_the_steps_it_did(tmp_path: Path) -> None:
    """Its report carries the steps it did (steps 0..29, and step 30 logged before the bad
    value), not the step of its last heartbeat."""
    with (
        orch.launch("jobs:logs_a_string_at_step_30", world_size=2, run_root=str(tmp_path)) as run,
        pytest.raises(orch.RunFailed) as e,
    ):
        run.wait(timeout=120)
    assert e.value.rank == 1 and "loss='oops'" in e.value.traceback
    assert run.coordinator.ranks[1].step == 31


def test_a_dataloader_loop_without_ctx_steps_shows_progress(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:dataloader_loop", world_size=2, run_root=str(tmp_path), config={"epochs": 3, "sleep": 0.03}
    )
    try:
        seen: list[tuple[int, float]] = []

        def moving() -> bool:
            m = run.state()
            if m.state is RunState.RUNNING and len(m.ranks) == 2:
                seen.append((min(r.step for r in m.ranks), min(r.steps_per_sec for r in m.ranks)))
            started = [(step, rate) for step, rate in seen if step > 0]
            return len(started) >= 2 and started[-1][0] > started[0][0] and started[-1][1] > 0

        assert wait_for(moving, 120, interval=0.3), seen
        assert run.state().total_steps == 96  # 3 epochs x 32 batches, from ctx.total_steps
        result = run.wait(timeout=120)
    finally:
        run.close()
    assert result.state is RunState.SUCCEEDED
    assert result.steps == [96, 96]  # steps 0..95 logged: no ctx.steps() in the loop
    assert len(run.history()["loss"][0]["step"]) == 96


def test_the_quickstart_fit_line_runs_unchanged_at_world_size_1(tmp_path: Path) -> None:
    notebook = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    (cell,) = [c for c in notebook["cells"] if "def fit_line" in "".join(c["source"])]
    source = "".join(cell["source"]).split("\nline_run = ")[0]  # the function, not its launch
    namespace: dict[str, Any] = {"orch": orch}
    exec(compile(source, "quickstart-cell", "exec"), namespace)
    with orch.launch(
        namespace["fit_line"], world_size=1, config={"lr": 0.1, "steps": 30}, run_root=str(tmp_path)
    ) as run:
        result = run.wait(timeout=120)
    assert result.state is RunState.SUCCEEDED and result.steps == [30]
    assert len(run.history()["weight"][0]["value"]) == 30  # model.module.weight was read every step


def test_a_stop_ends_a_loop_without_ctx_steps_at_the_agreed_step() -> None:
    ctx, sender = _context()
    ctx.log(0, loss=1.0)
    ctx.request_stop(at_step=3)
    ctx.log(1, loss=1.0)
    with pytest.raises(StopTraining):
        ctx.log(2, loss=1.0)  # steps 0..2 done: 3
    assert [s for s, _, _ in sender._queue] == [0, 1, 2]  # the last step is recorded first
    assert ctx.stopped


def test_a_loop_driven_by_ctx_steps_is_never_stopped_by_ctx_log() -> None:
    ctx, _ = _context()
    for step in ctx.steps(5):
        ctx.log(step, loss=1.0)
    ctx.request_stop(at_step=1)
    ctx.log(10, final=1.0)  # after the loop: ctx.steps handled the stop, nothing is raised


def test_a_dataloader_loop_stops_on_every_rank_at_the_same_step(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:dataloader_loop", world_size=2, run_root=str(tmp_path), config={"epochs": 1000, "sleep": 0.02}
    )
    try:
        assert wait_for(lambda: min((r.step for r in run.state().ranks), default=0) > 10, 120)
        run.stop()
        result = run.wait(timeout=60)
    finally:
        run.close()
    assert result.state is RunState.STOPPED
    assert result.steps[0] == result.steps[1] > 10
    assert len(set(result.param_checksums)) == 1 and result.param_checksums[0]
    assert [r.state.value for r in run.state().ranks] == ["STOPPED", "STOPPED"]


class _AbortingMaster:
    """A stub whose first heartbeat reply is ABORT; it keeps every request it gets."""

    def __init__(self) -> None:
        self.requests: list[pb.HeartbeatRequest] = []

    def SendHeartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> pb.HeartbeatResponse:
        self.requests.append(request)
        return pb.HeartbeatResponse(command=pb.ABORT)


def test_an_aborted_rank_sends_the_points_it_logged_before_it_ends() -> None:
    """A restart resumes after the checkpoint: points logged before the abort and not yet sent
    would be a hole in the history, so they go out before the rank exits."""
    master = _AbortingMaster()
    aborted: list[str] = []
    sender = HeartbeatSender(
        master,  # type: ignore[arg-type]
        run_id="r",
        worker_id="w",
        max_batch=2,
        on_stop=lambda at_step: None,
        on_abort=aborted.append,
    )
    for step in range(5):
        sender.log(step, {"loss": 1.0})
    assert sender._beat()  # the first batch (steps 0, 1) is answered ABORT: the rest go out, then it ends
    sent = [[step for s in r.series for step in s.steps] for r in master.requests]
    assert sent == [[0, 1], [2, 3], [4]], sent
    assert aborted == ["the master ended this rank: another rank failed"]
    assert not sender._queue
