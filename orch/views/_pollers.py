"""The live views' poller threads end before the interpreter does.

A panel or a runs view polls and draws (matplotlib's Agg, numpy) on a daemon thread. A
script that ends right after ``orch.compare(...)`` or ``run.panel()`` would otherwise
finalize the interpreter while that thread is inside a draw, which aborts the process
("terminate called without an active exception"). One ``atexit`` hook, registered with the
first view (so it runs before the hooks that end the runs), closes every live view.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Any

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_registered = False


def track(view: Any) -> None:
    """Close ``view`` (its ``close()`` joins its poller) when the interpreter exits."""
    global _registered
    _LIVE.add(view)
    if not _registered:
        atexit.register(close_all)
        _registered = True


def close_all() -> None:
    for view in list(_LIVE):
        with contextlib.suppress(Exception):
            view.close()
