"""orch.master.control.policies: the hang and restart policies decide from plain values."""

from __future__ import annotations

import pytest

from orch.master.control.judge import CauseKind
from orch.master.control.policies import ON_HANG, HangPolicy, RestartDecision, RestartPolicy


def test_a_warned_hang_goes_on_and_a_failed_one_is_the_root_cause() -> None:
    assert HangPolicy.named("warn").decide("ranks 0-3 stand still for 31s", "stacks") is None
    cause = HangPolicy.named("fail").decide("ranks 0-3 stand still for 31s", "File train.py, line 9")
    assert cause is not None and cause.kind is CauseKind.HUNG
    assert cause.message == "ranks 0-3 stand still for 31s; on_hang='fail' ended it"
    assert cause.detail == "File train.py, line 9"
    assert ON_HANG == ("warn", "fail")


def test_an_unknown_hang_action_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"on_hang must be one of \('warn', 'fail'\), got 'restart'"):
        HangPolicy.named("restart")


def test_a_failure_restarts_while_attempts_are_left_after_a_step() -> None:
    policy = RestartPolicy(max_attempts=3)
    assert policy.decide(1, stepped=True) == RestartDecision(True)
    assert policy.decide(2, stepped=True) == RestartDecision(True)
    assert policy.decide(3, stepped=True) == RestartDecision(False, "no restarts left")


def test_a_failure_before_any_step_is_not_restarted() -> None:
    decision = RestartPolicy(max_attempts=3).decide(1, stepped=False)
    assert not decision.restart and "during start-up, before any step" in decision.reason


def test_a_run_without_restarts_says_nothing_of_them() -> None:
    assert RestartPolicy().decide(1, stepped=True) == RestartDecision(False, "")
