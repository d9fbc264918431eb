"""The terminal dashboard's text, from a run state built by the master's own logic."""

from __future__ import annotations

import math

from orch._proto import orchestrator_pb2 as pb
from orch.client import StateMirror
from orch.coordinator import Coordinator
from orch.dashboard import render, summary


def mirror_of(losses: dict[int, list[float]], rates: dict[int, int]) -> StateMirror:
    clock = [0.0]
    c = Coordinator(3, run_id="run-x", clock=lambda: clock[0])
    for i in range(3):
        c.register(pb.RegisterRequest(worker_id=f"w{i}", host=f"h{i}", pid=100 + i, rendezvous_port=1))
    for i in range(3):
        c.can_start(pb.CanStartTrainingRequest(run_id="run-x", worker_id=f"w{i}"))
    for t in range(3):
        clock[0] += 1.0
        for i in range(3):
            series = [pb.Series(name="loss", steps=[t], values=[losses[i][t]])] if i in losses else []
            c.heartbeat(
                pb.HeartbeatRequest(run_id="run-x", worker_id=f"w{i}", step=rates[i] * t, series=series)
            )
    m = StateMirror()
    m.apply(c.snapshot())
    return m


def test_rows_mark_no_loss_yet_divergence_and_stragglers() -> None:
    m = mirror_of({0: [2.0, 1.5, 1.25], 1: [2.0, math.nan, math.nan]}, {0: 10, 1: 10, 2: 2})
    lines = render(m, address="127.0.0.1:1").splitlines()
    assert lines[0].startswith("orch run run-x  RUNNING") and "3/3 ranks" in lines[0]
    assert lines[3].split()[:3] == ["rank", "state", "step"]
    rows = dict(enumerate(lines[4:7]))
    assert "1.2500" in rows[0] and "<-" not in rows[0]
    assert "nan" in rows[1] and "NaN/inf loss" in rows[1]
    assert rows[2].split()[3] == "-" and "SLOW" in rows[2]  # no loss logged yet; a third of the others' pace
    assert "h2/102" in rows[2]


def test_summary_names_the_root_cause_with_its_traceback() -> None:
    m = mirror_of({0: [1.0, 1.0, 1.0]}, {0: 1, 1: 1, 2: 1})
    c = Coordinator(1, run_id="r")
    c.register(pb.RegisterRequest(worker_id="w", host="h", pid=7, rendezvous_port=1))
    c.can_start(pb.CanStartTrainingRequest(run_id="r", worker_id="w"))
    c.complete(
        pb.CompletionRequest(
            run_id="r",
            worker_id="w",
            outcome=pb.RANK_FAILED,
            error="Traceback (most recent call last):\nValueError: bad",
        )
    )
    m.apply(c.snapshot())
    text = summary(m)
    assert "FAILED" in text and "root cause: rank 0 (worker w, host h, pid 7) failed: ValueError: bad" in text
    assert "Traceback (most recent call last)" in text


def test_dropped_points_are_shown_in_the_dashboard_and_the_panel() -> None:
    from orch.panel import Panel

    m = mirror_of({0: [1.0, 1.0, 1.0]}, {0: 1, 1: 1, 2: 1})
    assert not any("dropped" in line for line in render(m).splitlines())
    c = Coordinator(1, run_id="d", clock=lambda: 0.0)
    c.register(pb.RegisterRequest(worker_id="w", host="h", pid=1, rendezvous_port=1))
    c.can_start(pb.CanStartTrainingRequest(run_id="d", worker_id="w"))
    c.heartbeat(pb.HeartbeatRequest(run_id="d", worker_id="w", step=1, dropped_points=1234))
    m = StateMirror()
    m.apply(c.snapshot())
    assert m.ranks[0].dropped_points == 1234
    assert "1234 points dropped" in render(m).splitlines()[4]
    assert "1234 points dropped" in Panel._table_html(m)
