"""Waiting in a notebook: a click handled while a cell blocks, and polling until something holds.

A cell blocked in ``run.wait()`` holds the kernel's main shell; a panel's Stop button must
still work then. :func:`route_clicks_to_their_subshell` keeps a button's clicks on the
kernel subshell the frontend sent them on (ipykernel 7), where they are handled at once.
:func:`wait_for` is the small poll loop tests and notebooks use to wait for a panel or a run.
Neither needs ipywidgets at import time, so a script that only waits loads nothing of the
widgets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ipywidgets as widgets


def route_clicks_to_their_subshell(button: widgets.Button) -> None:
    """Let a click on ``button`` be handled while a cell blocks (``run.wait()``).

    JupyterLab sends widget messages on a kernel subshell (ipykernel 7 runs each in its own
    thread), but ipykernel routes a comm's messages back to the shell the comm last wrote
    from, which for the panel is the main one, blocked in ``wait()``. Clicks are plain
    events, not replies to anything: they go where the frontend sent them. Where the kernel
    has no such routing (no subshells), nothing changes.
    """
    comm = getattr(button, "comm", None)
    route = getattr(comm, "_reply_subshell_for", None)
    if comm is None or route is None:
        return

    def where(data: Any, default: Any) -> Any:
        if isinstance(data, dict) and data.get("method") == "custom":
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
