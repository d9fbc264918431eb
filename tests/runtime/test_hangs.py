"""A rank that stops moving while its process lives: seen by its step, not its heartbeats, with
every rank's stack; a stop it never reaches still ends the run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import orch
from conftest import notebook_kernel, orch_cli, until_value
from orch.launchers.loaded import load_run
from orch.views.panel import Panel
from orch.wire.states import RankState, RunState


def test_a_rank_blocked_in_its_own_code_shows_as_no_progress_with_every_ranks_stack(
    tmp_path: Path, subprocess_env: dict[str, str], widget_messages: list[Any]
) -> None:
    hang_timeout = 5.0
    with orch.launch(
        "jobs:hang_rank1", world_size=4, config={"at": 10}, run_root=str(tmp_path), hang_timeout=hang_timeout
    ) as run:
        # Rank 1 blocks at step 10; the note and the stacks come within the limit plus 10 s.
        until_value(lambda: len(rs := run.state().ranks) == 4 and all(r.step >= 10 for r in rs), 60)
        reached = time.monotonic()
        mirror = until_value(lambda: (m := run.state()).progress_note and m.stacks and m, hang_timeout + 10)
        assert time.monotonic() - reached < hang_timeout + 10
        assert mirror.state is RunState.RUNNING
        assert "no progress for" in mirror.progress_note and "ranks 0-3 at step 10" in mirror.progress_note
        # The odd rank out is named, at its own line; the others wait in the all-reduce.
        assert "rank 1 (the odd one out): in `time.sleep(10**6)`" in mirror.stacks, mirror.stacks
        assert "ranks 0, 2, 3: in `loss.backward()`" in mirror.stacks, mirror.stacks
        assert "jobs.py" in mirror.stacks
        kinds = [kind for _, kind, _, _ in mirror.events]
        assert "not_progressing" in kinds and "stacks" in kinds
        assert not any(kind == "straggler" for kind in kinds)
        # orch status and orch stacks, from another process, say the same.
        env = {**subprocess_env, "ORCH_TOKEN": run.token}
        status = orch_cli("status", "--master", run.address, env=env, timeout=60)
        assert status.returncode == 0, status.stderr
        assert "progress: no progress for" in status.stdout, status.stdout
        assert "no step for" in status.stdout  # each standing rank is marked in the table
        assert "rank 1 (the odd one out): in `time.sleep(10**6)`" in status.stdout
        assert "stragglers: stragglers are not judged while the ranks do not progress" in status.stdout
        stacks_cli = orch_cli("stacks", run.address, env=env, timeout=60)
        assert stacks_cli.returncode == 0, stacks_cli.stderr
        assert "ranks 0, 2, 3: in `loss.backward()`" in stacks_cli.stdout, stacks_cli.stdout
        # The panel shows the note and the stacks without being asked.
        panel = Panel(run, interval=0.2)
        try:
            assert "no progress for" in panel.progress_box.value
            assert "rank 1 (the odd one out)" in panel.progress_box.value
            # rank 1, the odd one out, is marked apart from the ranks that wait on it
            table = panel.table.value
            assert table.count('class="orch-odd"') == 1 and table.count('class="orch-still"') == 3, table
            odd_row = table.split('class="orch-odd"')[0].rsplit("<tr", 1)[1]
            assert odd_row.startswith(' class="orch-rank" data-rank="1"'), odd_row[:80]
            assert table.count("waiting on rank 1 for ") == 3, table
        finally:
            panel.close()
        # run.stacks() asks afresh and gets the same picture.
        stacks = run.stacks()
        assert stacks.odd == [] or stacks.odd == [1]
        assert "rank 1 (the odd one out)" in str(stacks)
        assert set(stacks.by_rank) == {0, 1, 2, 3}

        stop_asked = time.monotonic()
        run.stop()
        result = run.wait(timeout=60)
        stopped_in = time.monotonic() - stop_asked
    assert result.state is RunState.STOPPED
    grace = 10.0
    assert stopped_in < grace + 5, stopped_in
    # The record agrees with itself: the run and every rank STOPPED, in result.json and load_run.
    record = json.loads((run.run_dir / "result.json").read_text())
    assert record["state"] == "STOPPED"
    assert {r["state"] for r in record["ranks"]} == {"STOPPED"}
    assert "did not reach a step boundary within 10s and were terminated" in record["progress"]["note"]
    loaded = load_run(run.run_dir).state()
    assert loaded.state is RunState.STOPPED
    assert {r.state for r in loaded.ranks} == {RankState.STOPPED}
    # The stall is kept as evidence: how long, which ranks, their grouped stacks with the odd
    # one out, in result.json, load_run, the record's panel and orch show.
    progress = record["progress"]
    assert progress["stalled_for"] >= hang_timeout, progress
    assert progress["note"].startswith("no progress for ") and "ranks 0-3 at step 10" in progress["note"]
    assert "when the run ended" in progress["note"]
    assert "rank 1 (the odd one out): in `time.sleep(10**6)`" in progress["stacks"]
    assert loaded.stalled_for == progress["stalled_for"] and loaded.stacks == progress["stacks"]
    reread = load_run(run.run_dir).panel()
    try:
        assert "rank 1 (the odd one out)" in reread.progress_box.value
        assert "no progress for" in reread.progress_box.value
        assert reread.table.value.count('class="orch-odd"') == 1
    finally:
        reread.close()
    shown = orch_cli("show", str(run.run_dir), env=subprocess_env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "progress   no progress for" in shown.stdout, shown.stdout
    assert "rank 1 (the odd one out): in `time.sleep(10**6)`" in shown.stdout, shown.stdout
    # A stopped run's rate is over the time it moved (10 steps), not a mean with the stall in it.
    moved = [r.steps_per_sec for r in loaded.ranks]
    assert all(rate > 2 * 10 / loaded.elapsed for rate in moved), (moved, loaded.elapsed)


def test_on_hang_fail_fails_the_run_with_the_stacks_as_its_root_cause(tmp_path: Path) -> None:
    with (
        orch.launch(
            "jobs:hang_rank1",
            world_size=3,
            config={"at": 5},
            run_root=str(tmp_path),
            hang_timeout=3.0,
            on_hang="fail",
        ) as run,
        pytest.raises(orch.RunFailed) as failed,
    ):
        run.wait(timeout=60)
    message = str(failed.value)
    assert "no progress for" in message and "ranks 0-2 at step 5" in message
    assert "on_hang='fail' ended it" in message
    assert failed.value.rank is None  # no rank failed: the run was ended for standing still
    assert "rank 1 (the odd one out): in `time.sleep(10**6)` (jobs.py" in failed.value.traceback
    record = json.loads((run.run_dir / "result.json").read_text())
    assert record["state"] == "FAILED" and "no progress for" in record["failure"]
    assert "time.sleep(10**6)" in record["root_cause_error"]


HANG_CELL = """\
import orch, time, torch

def stuck(ctx):
    model = ctx.ddp(torch.nn.Linear(4, 1))
    x = torch.randn(8, 4)
    for step in ctx.steps(10**6):
        if ctx.rank == 1 and step == 5:
            time.sleep(10**6)  # rank 1 waits forever
        model(x).sum().backward()
        ctx.log(step, loss=1.0)
"""

STACKS_CELL = """\
run = orch.launch(stuck, world_size=3, run_root={run_root!r}, hang_timeout=3)
for _ in range(1200):  # up to 2 minutes on a loaded machine
    if run.state().stacks:
        break
    time.sleep(0.1)
print(json.dumps({{"stacks": run.state().stacks, "asked": str(run.stacks())}}))
run.close()
"""


@pytest.mark.timeout(240)
def test_in_a_notebook_the_stacks_show_the_cells_and_their_lines(tmp_path: Path) -> None:
    with notebook_kernel(tmp_path) as (_, kc):
        for code in ("import json", HANG_CELL, STACKS_CELL.format(run_root=str(tmp_path))):
            out: list[str] = []
            reply = kc.execute_interactive(
                code, timeout=180, output_hook=lambda m, out=out: out.append(m["content"].get("text", ""))
            )
            assert reply["content"]["status"] == "ok", reply["content"]
    seen = json.loads("".join(out).strip().splitlines()[-1])
    for text in (seen["stacks"], seen["asked"]):
        # IPython's label for the cell that defined the function (the second one run: In[2]).
        assert (
            "rank 1 (the odd one out): in `time.sleep(10**6)  # rank 1 waits forever` (Cell In[2], line 8)"
            in text
        )
        assert "ranks 0, 2: in `model(x).sum().backward()` (Cell In[2], line 9)" in text
        assert "  Cell In[2], line 9, in stuck" in text
        assert "<dynamic-code>" not in text and "ipykernel" not in text


def test_a_frozen_process_is_lost_and_its_stack_read_from_outside(tmp_path: Path) -> None:
    launched = orch.launch("jobs:freeze_rank1", world_size=2, run_root=str(tmp_path), heartbeat_timeout=3.0)
    with launched as run, pytest.raises(orch.RunFailed) as failed:
        run.wait(timeout=60)
    assert failed.value.rank == 1
    assert "was lost: no heartbeat for" in str(failed.value)
    # py-spy (a dev dependency) read the frozen rank's threads: its training thread was in the
    # user's function; its heartbeat thread was frozen with it.
    text = failed.value.traceback
    assert "its stack, read by py-spy (its process was frozen):" in text, text
    assert "stuck_in_here (jobs.py:" in text, text
    record = json.loads((run.run_dir / "result.json").read_text())
    assert "stuck_in_here" in record["root_cause_error"]


def test_without_py_spy_a_frozen_ranks_record_says_how_to_get_its_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orch.launchers import _frozen

    monkeypatch.setattr(_frozen, "py_spy", lambda: None)
    assert "py-spy is not installed here (pip install py-spy" in _frozen.dump(os.getpid())
