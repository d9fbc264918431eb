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
"""

from __future__ import annotations

import contextlib
import os
import sys
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
    path = os.path.abspath(frame.f_code.co_filename)
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
