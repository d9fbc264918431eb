"""A rank's training thread's stack, taken from its heartbeat thread when the master asks.

``sys._current_frames()`` gives every thread's current frame without stopping it: the
heartbeat thread reads the training thread's, which may be blocked anywhere (a collective, a
data loader, the user's own ``time.sleep``). Frames of notebook cells carry IPython's label
(``Cell In[3]``) as the rank's tracebacks do; each frame says whether it is the user's own
code, so that a stack is summed up by the user's innermost line.

Each frame carries its source line (``code``), as a traceback does: whoever holds the run's
token sees it (``run.stacks()``, ``orch stacks``, the hang warning). ``ORCH_STACK_SOURCE=0`` in
the launcher's environment, which its ranks inherit, sends file, line and function only.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import time

from orch.runtime.source import SourceMap
from orch.wire.model import Frame, Stack

MAX_FRAMES = 200  # a deep recursion is cut at its innermost frames
MAX_CODE = 200  # characters of a frame's source line
SOURCE_ENV = "ORCH_STACK_SOURCE"

_ORCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_WORKER = os.path.join(_ORCH, "runtime", "worker.py")
_LIBRARIES = tuple(
    {
        os.path.abspath(p) + os.sep
        for name in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(name))
    }
)


def is_user_code(filename: str) -> bool:
    """The user's own file: not Python's, a package's, or orch's; not generated code."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(_ORCH) and not path.startswith(_LIBRARIES)


def sends_source() -> bool:
    """Whether this rank's stacks carry their frames' source lines (``ORCH_STACK_SOURCE=0``: no)."""
    return os.environ.get(SOURCE_ENV, "1").lower() not in ("0", "false", "no", "off")


def capture(thread_id: int, sources: SourceMap | None, step: int) -> Stack:
    """The stack of thread ``thread_id``, outermost frame first; orch's own frames around the
    training function (the worker's entry points) are left out."""
    frames: list[Frame] = []
    stack = Stack(taken=time.time(), step=step, frames=frames)
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        stack.note = "the training thread has ended"
        return stack
    raw: list[tuple[str, int, str]] = []
    while frame is not None and len(raw) < MAX_FRAMES:
        raw.append((frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
        frame = frame.f_back
    raw.reverse()
    # The worker's own frames down to the training function's call are the same on every rank.
    start = 0
    for i, (filename, _, function) in enumerate(raw[:-1]):
        if function == "run_worker" and os.path.abspath(filename) == _WORKER:
            start = i + 1
    labels = sources.labels if sources is not None else {}
    source = sends_source()
    for filename, line, function in raw[start:]:
        code = linecache.getline(filename, line).strip()[:MAX_CODE] if source else ""
        frames.append(
            Frame(
                file=labels.get(filename, filename),
                line=line,
                function=function,
                code=code,
                user=filename in labels or is_user_code(filename),
            )
        )
    return stack
