"""In a notebook, orch's errors lead with their message: orch's own frames are left out.

A :class:`~orch.errors.ConfigError` says what was wrong and what to pass instead, but
IPython printed it under some 40 lines of orch's frames (the launch's checks, the spec's
fields), and the message came last, out of sight. ``import orch`` in an IPython kernel
registers a handler for :class:`~orch.errors.OrchError` (``set_custom_exc``, only when no
other handler is there): the traceback it shows keeps the user's frames (the cell that called
orch) and drops the frames of files in the orch package, as IPython drops a frame marked
``__tracebackhide__``; a ConfigError's chained cause (the lower error it was made from) is not
printed either. The whole traceback stays where IPython keeps the last one: ``%tb`` prints it,
``%debug`` walks it.

A rank's failure is read the same way: :func:`format_from_user_code` formats it from the
first frame of the user's code, without the frames of orch (and of ``runpy``, for a script)
that led to it; the rank's log keeps all of them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import types
from typing import Any

from orch.errors import ConfigError, OrchError

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def is_orch_frame(frame: types.FrameType) -> bool:
    """A frame of orch's code: a file in the orch package, or code orch made (a dataclass's
    ``__init__``, whose file is ``<string>``) in one of its modules. The built-in example is
    user code."""
    module = frame.f_globals.get("__name__")
    if (
        isinstance(module, str)
        and module != "orch.example"
        and (module == "orch" or module.startswith("orch."))
    ):
        return True
    filename = frame.f_code.co_filename
    if filename.startswith("<"):  # no file: code compiled from text (a %%orch cell's, on a rank)
        return False
    path = os.path.abspath(filename)
    return path.startswith(PACKAGE_DIR) and not path.endswith(os.sep + "example.py")


def without_orch_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without orch's frames; the last frame stays when every frame is orch's."""
    kept: list[types.TracebackType] = []
    last = None
    while tb is not None:
        if not is_orch_frame(tb.tb_frame):
            kept.append(tb)
        last = tb
        tb = tb.tb_next
    if not kept and last is not None:
        kept = [last]
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def leads_to_user_code(frame: types.FrameType) -> bool:
    """A frame that only leads to the user's code: orch's, or ``runpy``'s (which runs a script
    or a ``-m`` module as ``__main__``)."""
    return is_orch_frame(frame) or frame.f_globals.get("__name__") == "runpy"


def from_user_code(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` from its first frame of the user's code on: the frames above it that only led
    there (:func:`leads_to_user_code`) left out, those below it kept (orch's too: an error orch
    raised where the user called it). ``tb`` itself when none of its frames is the user's."""
    entry = tb
    while entry is not None and leads_to_user_code(entry.tb_frame):
        entry = entry.tb_next
    return entry if entry is not None else tb


def format_from_user_code(error: BaseException) -> str:
    """``error`` as :func:`traceback.format_exception` writes it (the header, the frames, the
    exception's line, and the exceptions it was chained to), with each traceback of the chain
    starting at the user's code (:func:`from_user_code`)."""
    kept: dict[int, tuple[BaseException, types.TracebackType | None]] = {}
    todo = [error]
    while todo:
        exc = todo.pop()
        if id(exc) in kept:
            continue
        kept[id(exc)] = (exc, exc.__traceback__)
        todo.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
        members = getattr(exc, "exceptions", ())  # an exception group's
        if isinstance(members, tuple):
            todo.extend(e for e in members if isinstance(e, BaseException))
    try:
        for exc, tb in kept.values():
            exc.__traceback__ = from_user_code(tb)
        return "".join(traceback.format_exception(error))
    finally:
        for exc, tb in kept.values():
            exc.__traceback__ = tb


def format_stack_from_user_code(frame: types.FrameType, limit: int) -> str:
    """The stack that called ``frame`` and ``frame`` itself, as :func:`traceback.format_stack`
    writes it (its last ``limit`` frames), from the first frame of the user's code that orch's
    first frames called on: the process's start (multiprocessing's, orch's worker, runpy's for
    a script) is left out. The whole stack when orch called no user's code in it."""
    stack: list[types.FrameType] = []
    at: types.FrameType | None = frame
    while at is not None:
        stack.append(at)
        at = at.f_back
    stack.reverse()
    first = next((i for i, f in enumerate(stack) if is_orch_frame(f)), len(stack))
    while first < len(stack) and leads_to_user_code(stack[first]):
        first += 1
    kept = stack[first if first < len(stack) else 0 :][-limit:]
    return "".join(traceback.StackSummary.extract((f, f.f_lineno) for f in kept).format())


def _show(
    shell: Any, etype: type[BaseException], value: BaseException, tb: Any, tb_offset: Any = None
) -> None:
    """IPython's handler for orch's errors: the traceback without orch's frames."""
    cause, suppress = value.__cause__, value.__suppress_context__
    if isinstance(value, ConfigError):  # its message says it all: not the error it came from
        value.__cause__, value.__suppress_context__ = None, True
    try:
        shell.showtraceback((etype, value, without_orch_frames(tb)), tb_offset=tb_offset)
    finally:
        value.__cause__, value.__suppress_context__ = cause, suppress
        # What IPython keeps of the last error (showtraceback just set it): all of it, for %tb
        # and %debug.
        sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb


def install() -> bool:
    """Register the handler in this process's IPython shell, if there is one and it has no
    other custom handler; True when it is registered."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    with contextlib.suppress(Exception):
        shell = ipython.get_ipython()
        if shell is None:
            return False
        if getattr(shell, "custom_exceptions", ()) not in ((), (OrchError,)):
            return False  # the user's own handler stays
        shell.set_custom_exc((OrchError,), _show)
        return True
    return False
