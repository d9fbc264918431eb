"""Waiting in a notebook: a click handled while a cell blocks, and polling until something holds.

A cell blocked in ``run.wait()`` holds the kernel's main shell; a panel's Stop button, and
its metric, log scale and other controls, must still work then. :func:`answer_while_waiting`
keeps a control's clicks and changes on the kernel subshell the frontend sent them on
(JupyterLab 4.4+ with ipykernel 7), where they are handled at once, and lets ``wait()``
handle those sent to the main shell (every other frontend; :mod:`orch.launchers.kernel_wait`).
:func:`wait_for` is the small poll loop tests and notebooks use to wait for a panel or a run.
Neither needs ipywidgets at import time, so a script that only waits loads nothing of the
widgets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orch.launchers.kernel_wait import EVENTS, allow_clicks

if TYPE_CHECKING:
    import ipywidgets as widgets


def answer_while_waiting(control: widgets.DOMWidget) -> None:
    """Let a click on ``control`` (a button), or a change the user makes to it (a dropdown's
    choice, a checkbox), be handled while a cell blocks (``run.wait()``).

    JupyterLab sends widget messages on a kernel subshell (ipykernel 7 runs each in its own
    thread), but ipykernel routes a comm's messages back to the shell the comm last wrote
    from, which for the panel is the main one, blocked in ``wait()``. Clicks ("custom") and
    the user's changes ("update") are plain events, not replies to anything: they go where
    the frontend sent them. A frontend that sends them to the main shell (classic Notebook,
    VS Code, JupyterLab with subshells off) has them handled by the blocked ``wait()``
    itself (:class:`orch.launchers.kernel_wait.Waiting`). The control's callbacks then run on
    that thread: the panels draw under a lock their poller takes too.
    """
    comm = getattr(control, "comm", None)
    if comm is None:
        return
    allow_clicks(comm)
    route = getattr(comm, "_reply_subshell_for", None)
    if route is None:
        return

    def where(data: Any, default: Any) -> Any:
        if isinstance(data, dict) and data.get("method") in EVENTS:
            return default
        return route(data, default)

    comm._reply_subshell_for = where


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes (used by tests and notebooks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
