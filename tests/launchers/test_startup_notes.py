"""Start-up narrated: before the first step the master says what the run waits for, in words,
with the seconds moving, and the terminal dashboard prints each of those once.

The launches run in fresh processes (a script, ``orch run``): their worker pool is cold, as in
a new notebook kernel, so the slow part (the pool importing torch) is there to be seen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import orch_cli
from orch.master.control.registry import RankRecord
from orch.master.control.startup import StartupWatch
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(300)

# The order the notes come in (by a word each holds), from the launch to the first step.
PHASES = ("importing torch", "workers started", "registered", "start barrier", "first step")


def _phase(note: str) -> int:
    return next(i for i, word in enumerate(PHASES) if word in note)


@pytest.mark.unit
def test_the_note_follows_the_launcher_then_the_ranks() -> None:
    watch = StartupWatch(now=100.0)
    a, b = RankRecord(rank=0), RankRecord(rank=1)
    assert watch.note(RunState.PENDING, [], 2, 101.0) == ("waiting for 2 workers to register", 1.0)
    assert watch.set_phase("starting 2 workers: importing torch", 101.0)
    assert not watch.set_phase("starting 2 workers: importing torch", 102.0)  # no change
    assert watch.note(RunState.PENDING, [], 2, 106.0) == ("starting 2 workers: importing torch", 6.0)
    assert watch.note(RunState.PENDING, [a], 2, 107.0) == ("1/2 registered", 7.0)
    barrier = watch.note(RunState.RUNNING, [a, b], 2, 108.0)
    assert barrier == ("at the start barrier: joining the process group", 8.0)
    a.beats = b.beats = 1
    assert watch.note(RunState.RUNNING, [a, b], 2, 109.0)[0] == "training: waiting for the first step"
    b.step = 1
    assert watch.note(RunState.RUNNING, [a, b], 2, 110.0) == ("", 0.0)  # the run's numbers speak
    assert watch.note(RunState.FAILED, [], 2, 110.0) == ("", 0.0)
    watch.set_phase("", 200.0, new_attempt=True)  # a restart's start-up counts from its own start
    assert watch.note(RunState.PENDING, [], 2, 203.0)[1] == 3.0


WATCH = """\
import json, sys, time
import orch
run = orch.launch("jobs:allreduce_steps", world_size=2, config={"steps": 20, "sleep": 0.02},
                  run_root=sys.argv[1])
seen = []
try:
    while True:
        m = run.state()
        step = max((r.step for r in m.ranks), default=0)
        seen.append([m.state.value, m.startup_note, m.startup_seconds, step])
        if m.state.done or (not m.startup_note and seen[-1][3] > 0):
            break
        time.sleep(0.05)
    run.wait(timeout=120)
finally:
    run.close()
print(json.dumps(seen))
"""


def test_a_cold_launch_says_what_it_waits_for_in_order_with_the_seconds_moving(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", WATCH, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=subprocess_env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    notes = [(note, seconds) for _, note, seconds, _ in seen if note]
    assert notes, seen
    # The pool's first start (torch being imported) comes first, and it is said while it lasts.
    assert "starting 2 workers: importing torch" in notes[0][0], notes[:3]
    importing = [s for note, s in notes if "importing torch" in note]
    assert len(importing) > 2 and importing[-1] > importing[0], importing  # the seconds move
    # Every note is one of the phases, in order; the seconds never go back.
    order = [_phase(note) for note, _ in notes]
    assert order == sorted(order), notes
    assert [s for _, s in notes] == sorted(s for _, s in notes), notes
    assert any(_phase(note) in (1, 2) for note, _ in notes), notes  # the ranks registering
    # Once a rank reported a step the note is gone.
    assert seen[-1][1] == "" and seen[-1][3] > 0, seen[-1]
    changes = [note for i, (note, _) in enumerate(notes) if i == 0 or note != notes[i - 1][0]]
    print("\nstart-up notes:", changes)


def test_orch_run_prints_each_start_up_phase_once(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    proc = orch_cli(
        "run",
        "--fn",
        "jobs:allreduce_steps",
        "--workers",
        "2",
        "--steps",
        "20",
        "--run-root",
        str(tmp_path),
        "--refresh",
        "0.05",
        env=subprocess_env,
        cwd=tmp_path,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "] starting: " in line]
    notes = [line.split("] starting: ", 1)[1] for line in lines]
    assert notes and "importing torch" in notes[0], proc.stdout
    assert len(notes) == len(set(notes)), proc.stdout  # each once
    assert [_phase(n) for n in notes] == sorted(_phase(n) for n in notes), notes
    assert "PENDING step 0" not in proc.stdout, proc.stdout  # no frozen-looking line meanwhile
