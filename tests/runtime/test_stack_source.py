"""What a rank's stack tells whoever holds the run's token: file, line, function, and the source
line, unless the launcher's environment says ``ORCH_STACK_SOURCE=0``, which its ranks inherit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import orch
from conftest import until_value
from orch.runtime._stack import SOURCE_ENV, capture, sends_source
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.states import RunState

pytestmark = pytest.mark.timeout(180)


def test_the_switch_reads_as_the_other_switches_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    assert sends_source()
    for off in ("0", "false", "no", "off", "OFF"):
        monkeypatch.setenv(SOURCE_ENV, off)
        assert not sends_source(), off
    monkeypatch.setenv(SOURCE_ENV, "1")
    assert sends_source()


def test_a_captured_stack_leaves_the_source_out_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    parked, release = threading.Event(), threading.Event()

    def waits_here() -> None:
        parked.set()
        release.wait(30)  # pw="not-for-the-master"

    thread = threading.Thread(target=waits_here)
    thread.start()
    try:
        parked.wait(10)
        assert thread.ident is not None
        monkeypatch.delenv(SOURCE_ENV, raising=False)
        with_source = capture(thread.ident, None, step=0)
        monkeypatch.setenv(SOURCE_ENV, "0")
        without = capture(thread.ident, None, step=0)
    finally:
        release.set()
        thread.join()
    mine = [f for f in with_source.frames if f.function == "waits_here"]
    assert mine and 'pw="not-for-the-master"' in mine[0].code
    assert [(f.file, f.line, f.function) for f in without.frames] == [
        (f.file, f.line, f.function) for f in with_source.frames
    ]
    assert all(f.code == "" for f in without.frames)


def _stacks_of_a_hung_run(tmp_path: Path) -> tuple[pb.GetStacksResponse, str]:
    """The stacks a token holder gets from a run whose rank 1 sleeps in its own code at step 3
    (rank 0 waits for it in the gradient all-reduce), over the wire and as ``run.stacks()``."""
    with orch.launch(
        "jobs:hang_rank1", world_size=2, config={"at": 3}, run_root=str(tmp_path), stop_grace=1.0
    ) as run:
        until_value(lambda: len(rs := run.state().ranks) == 2 and all(r.step >= 3 for r in rs), 90)
        client = run.connect()
        assert client is not None
        with client:

            def both() -> pb.GetStacksResponse | None:
                reply = client.stacks(wait=5.0)
                return reply if len(reply.ranks) == 2 and all(r.stack.frames for r in reply.ranks) else None

            reply = until_value(both, 60)
        text = str(run.stacks())
        run.stop()
        assert run.wait(timeout=60).state is RunState.STOPPED
    return reply, text


def test_a_runs_stacks_carry_source_lines_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    reply, text = _stacks_of_a_hung_run(tmp_path)
    sleeper = next(s.stack for s in reply.ranks if s.rank == 1)
    assert any(f.code == "time.sleep(10**6)" for f in sleeper.frames), sleeper
    assert "rank 1: in `time.sleep(10**6)` (jobs.py, line" in text, text


def test_with_orch_stack_source_0_a_runs_stacks_carry_file_line_and_function_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SOURCE_ENV, "0")
    reply, text = _stacks_of_a_hung_run(tmp_path)
    for rank in reply.ranks:
        frames = list(rank.stack.frames)
        assert frames and all(f.file and f.line > 0 and f.function for f in frames), frames
        assert all(f.code == "" for f in frames), frames
        assert "time.sleep(10**6)" not in rank.text and "loss.backward()" not in rank.text, rank.text
    sleeper = next(s.stack for s in reply.ranks if s.rank == 1)
    assert any(f.function == "hang_rank1" and f.file.endswith("jobs.py") for f in sleeper.frames), sleeper
    # The summary names the function and the line where the source would have been.
    assert "rank 1: in hang_rank1 (jobs.py, line" in text, text
    assert "time.sleep(10**6)" not in text and "loss.backward()" not in text, text
