"""A panel's buttons clicked while a cell blocks in ``wait()``, in every notebook frontend.

A cell blocked in ``run.wait()`` (or ``sweep.wait()``) holds the kernel's main shell, which
reads its next message only when the cell ends. JupyterLab 4.4+ sends widget messages on a
kernel subshell, handled at once in a thread of its own (:mod:`orch.views.waiting` keeps a
panel's clicks there). Classic Notebook, VS Code's notebooks and JupyterLab with "Kernel
Comms over subshells" disabled send them to the main shell. So, while it waits, a
:class:`Waiting` reads the main shell's incoming messages itself (ipykernel 6 and 7):

- a click on a button that asked for it (:func:`allow_clicks`: the panels' Stop and Stacks),
  or a change to a control that did (a metric's dropdown, the log scale), is handled then
  and there, as the kernel would have handled it;
- every other message (the next cell's ``execute_request``, a completion, a widget's state)
  is kept, untouched, and handed back to the kernel when the wait ends, in the order it came
  and ahead of whatever arrives later: the kernel runs it after this cell, as it would have.

Outside a kernel, off its main thread, or with no such button alive, a wait is a plain wait.
No part of ipykernel is imported here: a kernel that runs this code has it loaded already.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

SLICE = 0.05  # seconds between two looks at a run's end while the kernel's messages are read
EVENTS = ("custom", "update")  # a widget message the user made: a click, a change of its value

_clickable: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_serving = threading.Lock()  # one wait reads the main shell's messages at a time


def allow_clicks(comm: Any) -> None:
    """Let a button's clicks (``comm``: its widget's comm) be handled while a cell waits."""
    comm_id = getattr(comm, "comm_id", None)
    if comm_id:
        _clickable[comm_id] = comm


class _Inbox:
    """The main shell's incoming messages (a ZMQ socket read by the kernel's own event loop,
    which is not running while a cell blocks), and how to give the kept ones back."""

    def __init__(self, kernel: Any, socket: Any, give_back: Any, zmq: Any) -> None:
        self.kernel = kernel
        self.session = kernel.session
        self.socket = socket
        self.give_back = give_back
        self.zmq = zmq
        self.kept: list[Any] = []

    def read(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for messages; handle clicks, keep the rest."""
        if self.socket.poll(max(0, int(timeout * 1000)), self.zmq.POLLIN):
            self.drain()

    def drain(self) -> None:
        """Take every message queued now (the socket is left empty, so its event loop is
        woken by the next one that arrives)."""
        while True:
            try:
                frames = self.socket.recv_multipart(self.zmq.NOBLOCK, copy=False)
            except self.zmq.Again:
                return
            # A click goes ahead of what is kept (the next cell may be queued already);
            # what is kept keeps its order.
            if not self._handled(frames):
                self.kept.append(frames)

    def _handled(self, frames: Any) -> bool:
        """Handle ``frames`` if it is a click on an allowed button; whether it was."""
        comm = self._clicked(frames)
        if comm is None:
            return False
        _, parts = self.session.feed_identities(frames, copy=False)
        msg = self.session.deserialize(parts, content=True, copy=False)
        try:
            comm.handle_msg(msg)
        except Exception:  # a failing handler must not end the wait; the kernel logs it too
            self.kernel.log.exception("orch: a click handled while a cell waited failed")
        return True

    def _clicked(self, frames: Any) -> Any:
        """The allowed comm a message clicks on, or None. Only the header is read here (its
        signature is not recorded as seen): a message kept goes back to the kernel intact."""
        try:
            _, parts = self.session.feed_identities(frames, copy=False)
            msg = self.session.deserialize(parts, content=False, copy=False)
            if msg["header"].get("msg_type") != "comm_msg":
                return None
            content = self.session.unpack(msg["content"])
        except Exception:  # not ours to judge: the kernel reports a bad message itself
            return None
        data = content.get("data")
        if not isinstance(data, dict) or data.get("method") not in EVENTS:
            return None
        comm = _clickable.get(str(content.get("comm_id")))
        if comm is None or getattr(comm, "_closed", False):
            return None
        return comm

    def close(self) -> None:
        self.drain()
        kept, self.kept = self.kept, []
        if kept:
            self.give_back(kept)


def _inbox() -> _Inbox | None:
    """The main shell's inbox, when this thread is a kernel's main shell running a cell."""
    ipython, zmq = sys.modules.get("IPython"), sys.modules.get("zmq")
    if ipython is None or zmq is None or not _clickable:
        return None
    kernel = getattr(ipython.get_ipython(), "kernel", None)
    if kernel is None or getattr(kernel, "session", None) is None:
        return None
    try:
        asyncio.get_running_loop()  # the kernel's loop, running this cell, takes what is given back
    except RuntimeError:
        return None
    channel = getattr(kernel, "shell_channel_thread", None)
    if channel is not None:  # ipykernel 7: a thread passes the main shell its messages
        main = getattr(channel, "parent_thread", threading.main_thread())
        manager = channel.manager
        pair_of = getattr(manager, "get_shell_channel_to_subshell_pair", None)
        pair = pair_of(None) if pair_of is not None else getattr(manager, "_shell_channel_to_main", None)
        stream = getattr(pair, "to_stream", None)
    else:  # ipykernel 6 (or 7 without subshells): the main shell reads the shell socket
        main = threading.main_thread()
        stream = getattr(kernel, "shell_stream", None)
    socket = getattr(stream, "socket", None)
    if socket is None or threading.current_thread() is not main:
        return None

    if hasattr(kernel, "schedule_dispatch") and hasattr(kernel, "msg_queue"):  # ipykernel 6

        def give_back(kept: list[Any]) -> None:
            # Behind what the kernel had read before this cell began, ahead of what comes next.
            for frames in kept:
                kernel.schedule_dispatch(kernel.dispatch_shell, frames)

        return _Inbox(kernel, socket, give_back, zmq)

    callback, run = getattr(stream, "_recv_callback", None), getattr(stream, "_run_callback", None)
    if callback is None or run is None:  # a kernel this module does not know: wait plainly
        return None

    def give_back_7(kept: list[Any]) -> None:
        # As the socket's stream would have: one task each, in order. They queue on the main
        # shell's lock, which this cell holds until its reply is sent.
        for frames in kept:
            run(callback, frames)

    return _Inbox(kernel, socket, give_back_7, zmq)


class Waiting:
    """One blocking wait in ``wait()``: ``with Waiting() as w: w.until(event, timeout)`` or
    ``w.sleep(seconds)`` in a poll loop. In a kernel's main shell, clicks on allowed buttons
    are handled meanwhile, and the other messages are given back when the block ends."""

    def __init__(self) -> None:
        self._inbox: _Inbox | None = None
        self._owns = False

    def __enter__(self) -> Waiting:
        inbox = _inbox()
        if inbox is not None and _serving.acquire(blocking=False):  # a nested wait waits plainly
            self._inbox, self._owns = inbox, True
        return self

    def __exit__(self, *exc: object) -> None:
        inbox, self._inbox = self._inbox, None
        try:
            if inbox is not None:
                inbox.close()
        finally:
            if self._owns:
                self._owns = False
                _serving.release()

    def until(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait for ``event``, at most ``timeout`` seconds (None: no limit); whether it is set."""
        inbox = self._inbox
        if inbox is None:
            return event.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not event.is_set():
            left = SLICE if deadline is None else min(SLICE, deadline - time.monotonic())
            if left <= 0:
                return event.is_set()
            inbox.read(left)
        return True

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``."""
        inbox = self._inbox
        if inbox is None:
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            inbox.read(left)


def block_until(
    ended: threading.Event | Callable[[], bool],
    timeout: float | None,
    *,
    interval: float,
    interrupted: Callable[[], str],
    timed_out: Callable[[], str],
) -> None:
    """The one blocking wait of every ``wait()`` (a run's, a sweep's): until ``ended`` (an
    event, or a check made every ``interval`` seconds), at most ``timeout`` seconds, handling
    the panel's clicks meanwhile (:class:`Waiting`). Interrupting it raises KeyboardInterrupt
    saying ``interrupted()`` (what still runs, how to stop it); a timeout raises TimeoutError
    saying ``timed_out()``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        with Waiting() as waiting:
            if isinstance(ended, threading.Event):
                finished = waiting.until(ended, timeout)
            else:
                while not (finished := ended()):
                    left = interval if deadline is None else min(interval, deadline - time.monotonic())
                    if left <= 0:
                        break
                    waiting.sleep(left)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(interrupted()) from None
    if not finished:
        raise TimeoutError(timed_out())
