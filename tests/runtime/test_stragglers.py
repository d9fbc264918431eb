"""The slow rank, found live under DDP (4 ranks on gloo, real processes): where each rank's step
time goes (orch.runtime._timing), and the master's judgement of it (orch.master.control.stragglers).

A rank that sleeps 30 ms per step in its compute slows every rank to its pace, so steps/s
are equal everywhere; the split of the step tells it apart: it computes longest and waits
least in the gradient all-reduce. The times printed (``pytest -s``) are from launch; the
bound asserted is the issue's 10 s from the moment every rank trains.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import orch
from orch.experiments.run_detail import describe
from orch.experiments.run_row import read_row
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(240)

MARK_WITHIN = 10.0  # seconds from every rank training to the straggler's mark


def launch(tmp_path: Path, **config: Any) -> orch.Run:
    return orch.launch(
        "jobs:straggler", world_size=4, config=config, run_root=str(tmp_path), heartbeat_timeout=60
    )


def training(run: orch.Run) -> float:
    """Waits until every rank has stepped; the time then."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = run.state()
        if m.state is RunState.RUNNING and len(m.ranks) == 4 and all(r.step > 0 for r in m.ranks):
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"the ranks did not all train within 120s: {run.state().as_dict()}")


def marked(run: orch.Run, since: float) -> tuple[orch.StateMirror, float]:
    deadline = since + 60
    while time.monotonic() < deadline:
        m = run.state()
        if m.straggler_rank >= 0:
            return m, time.monotonic() - since
        time.sleep(0.1)
    raise AssertionError(f"no straggler marked in 60s: {run.state().straggler_note}")


@pytest.mark.parametrize(
    ("where", "slow_rank", "section"),
    [("compute", 2, "compute"), ("data", 1, "data"), ("augment", 3, "augment")],
)
def test_the_slow_rank_is_marked_with_the_part_it_is_slow_in(
    tmp_path: Path, where: str, slow_rank: int, section: str
) -> None:
    run = launch(tmp_path, slow_rank=slow_rank, where=where, delay=0.03)
    try:
        t0 = training(run)
        m, took = marked(run, t0)
        print(f"\nrank {slow_rank} slow in {where}: marked {took:.1f}s after every rank trained")
        print(m.straggler_note)
        assert took < MARK_WITHIN
        assert (m.straggler_rank, m.straggler_section) == (slow_rank, section), m.straggler_note
        # Under DDP every rank runs at the slow one's pace: the rates alone could not tell.
        deadline = time.monotonic() + 30
        while not all(r.steps_per_sec > 0 for r in m.ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
            m = run.state()
        rates = [r.steps_per_sec for r in m.ranks]
        assert max(rates) < 1.5 * min(rates), rates
        slow = m.ranks[slow_rank]
        others = [r for r in m.ranks if r.rank != slow_rank]
        assert slow.slow_in == section and not any(r.slow_in for r in others)
        assert all(slow.collective_ms < r.collective_ms for r in others), [r.collective_ms for r in m.ranks]
        if section == "data":
            assert slow.data_ms > 20 and all(r.data_ms < 10 for r in others)
        else:
            assert slow.relative_score > 1.5 and all(r.relative_score < 1.5 for r in others)
        events = [e for e in m.events if e[1] == "straggler"]
        assert events and events[0][2] == slow_rank and f"slow in {section}" in events[0][3], events
    finally:
        run.close()


def test_no_rank_is_marked_in_an_even_run(tmp_path: Path) -> None:
    run = launch(tmp_path)
    try:
        t0 = training(run)
        judged = False
        while time.monotonic() - t0 < 12.0:
            m = run.state()
            assert m.straggler_rank < 0, m.straggler_note
            judged = judged or (m.stragglers_judged and m.straggler_note.startswith("no straggler"))
            time.sleep(0.2)
        assert judged, m.straggler_note  # it was judged, not merely unknown
        assert all(r.timed and r.step_ms > 9 for r in m.ranks), [r.as_dict() for r in m.ranks]
        assert not [e for e in m.events if e[1] == "straggler"]
    finally:
        run.close()


def test_a_loop_without_ctx_ddp_is_timed_by_ctx_log_and_says_why_it_cannot_be_judged(tmp_path: Path) -> None:
    run = orch.launch("jobs:untimed_loop", world_size=2, run_root=str(tmp_path), heartbeat_timeout=60)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            m = run.state()
            if m.state is RunState.RUNNING and all(r.step > 20 for r in m.ranks) and len(m.ranks) == 2:
                break
            time.sleep(0.1)
        time.sleep(1.5)
        m = run.state()
        assert not m.stragglers_judged and m.straggler_rank < 0
        # Its steps are timed (by ctx.log); what it lacks is a model from ctx.ddp: said so.
        assert m.straggler_note == (
            "stragglers cannot be judged: the gradient collectives are not timed "
            "(wrap the model with ctx.ddp, or give Lightning's Trainer orch's OrchCallback)"
        )
        assert all(r.timed and r.timed_by == "ctx.log" and r.step_ms > 5 for r in m.ranks)
    finally:
        run.close()


def test_an_epoch_loop_through_ctx_data_alone_finds_a_30_ms_straggler(tmp_path: Path) -> None:
    # for epoch in range(...): for i, (x, y) in enumerate(ctx.data(loader)): no ctx.steps
    run = orch.launch(
        "jobs:epoch_data_loop", world_size=4, config={"slow_rank": 1, "delay": 0.03},
        run_root=str(tmp_path), heartbeat_timeout=60,
    )  # fmt: skip
    try:
        t0 = training(run)
        m, took = marked(run, t0)
        print(f"\nctx.data loop, rank 1 slow: marked {took:.1f}s after all trained\n{m.straggler_note}")
        assert took < MARK_WITHIN
        assert (m.straggler_rank, m.straggler_section) == (1, "compute"), m.straggler_note
        assert m.straggler_note.endswith("(each batch of ctx.data timed as a step)"), m.straggler_note
        assert all(r.timed and r.timed_by == "ctx.data" for r in m.ranks)
        slow, others = m.ranks[1], [r for r in m.ranks if r.rank != 1]
        assert all(slow.collective_ms < r.collective_ms for r in others), [r.collective_ms for r in m.ranks]
        computes = [r.compute_ms for r in m.ranks]
        assert slow.compute_ms > 30 and all(r.compute_ms < 30 for r in others), computes
    finally:
        run.close()


def test_a_loop_that_only_logs_is_timed_and_its_slow_rank_found_without_a_split(tmp_path: Path) -> None:
    run = orch.launch(
        "jobs:log_only_loop", world_size=4, config={"slow_rank": 2, "delay": 0.03},
        run_root=str(tmp_path), heartbeat_timeout=60,
    )  # fmt: skip
    try:
        t0 = training(run)
        m, took = marked(run, t0)
        print(f"\nctx.log loop, rank 2 slow: marked {took:.1f}s after every rank trained\n{m.straggler_note}")
        assert took < MARK_WITHIN
        # Slow in its own time: not "compute", which ctx.log cannot tell from data.
        assert (m.straggler_rank, m.straggler_section) == (2, "own time"), m.straggler_note
        assert "slow in own time" in m.straggler_note and "compute" in m.straggler_note.split("(")[-1]
        assert m.straggler_note.endswith(
            "(timed from one ctx.log step to the next, not split into data and compute)"
        )
        assert all(r.timed and r.timed_by == "ctx.log" and r.data_ms == 0 for r in m.ranks)
        assert m.ranks[2].slow_in == "own time"
    finally:
        run.close()


def test_a_run_failing_at_step_10_keeps_a_true_sentence_in_its_record(tmp_path: Path) -> None:
    # ctx.steps(100), rank 1 raising at step 10: never "drive the loop with ctx.steps".
    run = orch.launch("jobs:fails_at_step_10", world_size=2, run_root=str(tmp_path), heartbeat_timeout=60)
    try:
        with pytest.raises(orch.RunFailed):
            run.wait(timeout=180)
        saved = json.loads((run.run_dir / "result.json").read_text())["stragglers"]
        loaded = orch.load_run(run.run_dir).state()
        shown = describe(read_row(run.run_dir))  # orch show
        assert f"stragglers {saved['note']}" in shown, shown
        records = ((saved["note"], saved["judged"]), (loaded.straggler_note, loaded.stragglers_judged))
        for note, judged in records:
            print(f"\nrecord: {note}")
            assert "ctx.steps" not in note and "cannot" not in note, note
            # Too few steps for a judgement (the usual case, ~10 ms steps), or a true one.
            assert note.startswith("not judged: the run ended after too few steps") or (
                judged and note.endswith("(timed by ctx.steps)")
            ), note
    finally:
        run.close()


def test_a_comm_hook_of_the_users_runs_and_the_wait_is_still_timed(tmp_path: Path) -> None:
    run = orch.launch("jobs:own_comm_hook", world_size=2, run_root=str(tmp_path), config={"steps": 400})
    try:
        # While it trains: DDP's timers run with a hook of the user's, so the wait is measured.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            m = run.state()
            if (
                m.stragglers_judged
                and len(m.ranks) == 2
                and all(r.timed and r.collective_ms > 0 for r in m.ranks)
            ):
                break
            time.sleep(0.2)
        else:
            raise AssertionError([r.as_dict() for r in run.state().ranks])
        result = run.wait(timeout=180)
        assert result.state is RunState.SUCCEEDED and len(set(result.param_checksums)) == 1
        calls = run.history()["hook_calls"]
        assert all(calls[r]["value"][-1] >= 400 for r in range(2)), calls  # the user's hook ran every step
    finally:
        run.close()
