"""orch.master.control.fate: a rank whose process ended without its last words (killed outright)
says from which step its points may be missing; a rank that said them (SIGTERM, ABORT, its own
end) says nothing of the kind."""

from __future__ import annotations

import signal

import pytest

from orch.master.control.fate import Fate
from orch.master.control.registry import Registry
from orch.wire.model import Completion, Registration
from orch.wire.states import EXIT_ABORTED, RankState


def _running() -> tuple[Fate, Registry, list[tuple[str, int, str]]]:
    told: list[tuple[str, int, str]] = []
    fate = Fate(1, lambda kind, rank, message: told.append((kind, rank, message)), lambda: None)
    reg = Registry(2)
    for i in range(2):
        rec, _ = reg.add(Registration(worker_id=f"w{i}", host="h", pid=10 + i), "r1")
        rec.state, rec.step, rec.last_heartbeat = RankState.RUNNING, 57, 100.0
    fate.start(2, 100.0)
    return fate, reg, told


@pytest.mark.parametrize("code", [-signal.SIGKILL, -signal.SIGSEGV])
def test_a_rank_killed_outright_says_its_last_points_may_be_missing(code: int) -> None:
    fate, reg, told = _running()
    fate.exited("w0", code, "", True, reg, 100.3)
    note = reg.ranks[0].note
    assert "0.3s after its last heartbeat" in note and "points from step 57 may be missing" in note, note
    assert signal.Signals(-code).name in note
    assert ("unsent", 0, f"rank 0: {note}") in told


def test_a_rank_killed_once_it_was_torn_down_says_so_too() -> None:
    """Forced to end (a stop past its grace), then SIGKILLed at the end of the launcher's grace."""
    fate, reg, _ = _running()
    fate.close("the run was closed", 100.0, reg)
    fate.exited("w1", -signal.SIGKILL, "", True, reg, 101.5)
    assert "may be missing" in reg.ranks[1].note


@pytest.mark.parametrize("code", [-signal.SIGTERM, EXIT_ABORTED])
def test_a_rank_that_said_its_last_words_has_nothing_missing(code: int) -> None:
    fate, reg, told = _running()
    fate.exited("w0", code, "", True, reg, 100.3)
    assert not reg.ranks[0].note and all(kind != "unsent" for kind, _, _ in told)


def test_a_rank_that_reported_its_end_has_nothing_missing() -> None:
    """Its own end sends its points before it reports; a signal while the process goes changes nothing."""
    fate, reg, _ = _running()
    done = Completion(run_id="r1", worker_id="w0", outcome=RankState.SUCCEEDED, step=57)
    fate.completed(reg.ranks[0], done, RankState.SUCCEEDED, reg, 100.2)
    fate.exited("w0", -signal.SIGABRT, "", False, reg, 100.3)
    assert not reg.ranks[0].note


def test_a_host_agent_that_saw_a_rank_killed_says_so() -> None:
    fate, reg, _ = _running()
    died = Completion(run_id="r1", worker_id="w1", outcome=RankState.FAILED, exit_code=-signal.SIGKILL)
    fate.completed(reg.ranks[1], died, RankState.FAILED, reg, 100.3)
    assert "points from step 57 may be missing" in reg.ranks[1].note
