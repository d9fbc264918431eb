"""orch._tracebacks: a failure formatted from the first frame of the user's code, in one process.

Code compiled under a module name of orch's (``orch.fake``) or runpy's stands for their frames;
the real thing, with ranks, is in tests/runtime/test_user_tracebacks.py."""

from __future__ import annotations

import builtins
import re
import sys
import traceback
from typing import Any

from orch._tracebacks import format_from_user_code, format_stack_from_user_code

MACHINERY = """
def orch_runs(fn, *args):  # as orch's worker runs the user's function: the error it ends with
    try:
        fn(*args)
    except BaseException as e:
        return e


def orch_calls(fn, *args):
    return fn(*args)


def orch_refuses(value):
    raise TypeError(f"not a number: {value!r}")


def orch_catches(fn):
    try:
        fn()
    except ValueError:
        raise RuntimeError("orch gave up")
"""


def _functions(module: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": module}
    exec(compile(MACHINERY, f"<{module}>", "exec"), namespace)
    return namespace


ORCH = _functions("orch.fake")
RUNPY = _functions("runpy")


def _user_logs(value: object) -> None:
    ORCH["orch_refuses"](value)


def _user_raises() -> None:
    raise ValueError("user's bad value")


def _names(text: str) -> list[str]:
    """The functions of a traceback's frames, top to bottom (an exception group's too)."""
    return re.findall(r'^[ |+-]*File "[^"]+", line \d+, in (.+)$', text, re.MULTILINE)


def test_the_frames_above_the_user_s_code_go_and_those_below_it_stay() -> None:
    error = ORCH["orch_runs"](RUNPY["orch_calls"], _user_logs, "x")
    text = format_from_user_code(error)
    assert text.startswith("Traceback (most recent call last):\n"), text
    assert _names(text) == ["_user_logs", "orch_refuses"], text  # orch's refusal, below, stays
    assert text.endswith("TypeError: not a number: 'x'\n"), text
    # The exception itself is as it was: every frame, for the log, %tb and a debugger.
    whole = _names("".join(traceback.format_exception(error)))
    assert whole == ["orch_runs", "orch_calls", "_user_logs", "orch_refuses"]


def test_a_traceback_of_orch_s_frames_only_is_kept_whole() -> None:
    error = ORCH["orch_runs"](ORCH["orch_calls"], ORCH["orch_refuses"], 1)
    assert _names(format_from_user_code(error)) == ["orch_runs", "orch_calls", "orch_refuses"]


def test_each_exception_of_a_chain_is_cut_where_its_top_is_orch_s() -> None:
    def user() -> None:
        try:
            ORCH["orch_calls"](_user_raises)
        except ValueError as e:
            raise KeyError("user's own") from e

    text = format_from_user_code(ORCH["orch_runs"](user))
    cause, effect = text.split("The above exception was the direct cause of the following exception:")
    assert _names(cause) == ["user", "orch_calls", "_user_raises"], cause  # caught by the user: whole
    assert _names(effect) == ["user"], effect
    assert effect.rstrip().endswith('KeyError: "user\'s own"'), effect
    # orch catching the user's error and raising its own: the user's starts at the user's code,
    # orch's own (no frame of the user's) is whole.
    text = format_from_user_code(ORCH["orch_runs"](ORCH["orch_catches"], _user_raises))
    context, during = text.split("During handling of the above exception, another exception occurred:")
    assert _names(context) == ["_user_raises"], context
    assert _names(during) == ["orch_runs", "orch_catches"], during


def test_an_exception_group_s_members_are_cut_too() -> None:
    if sys.version_info < (3, 11):
        return

    def group() -> None:
        raise builtins.ExceptionGroup("two", [ORCH["orch_runs"](ORCH["orch_calls"], _user_raises)])

    text = format_from_user_code(ORCH["orch_runs"](group))
    assert _names(text) == ["group", "_user_raises"], text


def test_a_stack_is_written_from_the_user_s_code_that_orch_called_on() -> None:
    def user() -> str:
        return format_stack_from_user_code(sys._getframe(), limit=8)

    # pytest's frames (as multiprocessing's start a worker), orch's and runpy's, then the user's
    text = ORCH["orch_calls"](RUNPY["orch_calls"], user)
    assert _names(text) == ["user"], text
    assert "return format_stack_from_user_code" in text, text
    # No frame of orch's: the stack as format_stack writes it.
    here = sys._getframe()
    assert format_stack_from_user_code(here, limit=3) == "".join(traceback.format_stack(here, limit=3))
