"""The terminal dashboards drawn live: one run's ranks (``orch run``, ``orch master``,
``orch status``), and a sweep's runs.

What they show is :mod:`orch.views.rendering`'s (plain text and ``rich`` renderables, pure
functions); this module draws it. :class:`Dashboard` polls a master and
:class:`SweepDashboard` a caller's ``rows()``: on a terminal they redraw the rich view in
place (``rich.live.Live``), to a file or a pipe they print a plain line now and then, with
no escape codes. :func:`show` prints a run once.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.control import Control
from rich.live import Live
from rich.live_render import LiveRender
from rich.segment import ControlType, Segment
from rich.text import Text

from orch._text import number_text, printable
from orch.errors import MasterUnavailable
from orch.views.rendering import render, render_sweep_plain, run_table, state_counts, sweep_table
from orch.wire.client import MasterClient, StateMirror


def _is_terminal(out: TextIO) -> bool:
    """A terminal that can move its cursor (TERM=dumb cannot): there the views are redrawn."""
    return bool(getattr(out, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"


def _same_file(a: Any, b: Any) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (AttributeError, OSError, ValueError):
        return False


class _FrameTop(LiveRender):
    """rich's live render, returning to the top of the last frame in one sequence: up to its
    first line (CSI F), then erase to the end of the screen (CSI J), which also clears what a
    longer previous frame left below."""

    def position_cursor(self) -> Control:
        height = self.last_render_height
        control = Control()
        if height:
            up = f"\x1b[{height - 1}F" if height > 1 else "\r"
            control.segment = Segment(up + "\x1b[J", None, [(ControlType.CURSOR_UP, height - 1)])
        return control


class _Screen:
    """Where a dashboard draws: a ``rich.live.Live`` on a terminal, started on the first frame."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = _is_terminal(out)
        self._live: Live | None = None

    def frame(self, view: RenderableType) -> None:
        if self._live is None:
            console = Console(file=self.out, force_terminal=True, force_interactive=True)
            # Only the streams that reach this terminal print above the live view; a stderr sent
            # to a file stays in that file.
            live = Live(
                view,
                console=console,
                auto_refresh=False,
                redirect_stdout=_same_file(sys.stdout, self.out),
                redirect_stderr=_same_file(sys.stderr, self.out),
            )
            live._live_render = _FrameTop(view, vertical_overflow=live.vertical_overflow)
            live.start(refresh=True)
            self._live = live
        else:
            self._live.update(view, refresh=True)

    def above(self, lines: list[str]) -> None:
        """Print ``lines`` above the live view (before it starts: plainly)."""
        if not lines:
            return
        if self._live is None:
            self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()
            return
        for line in lines:
            self._live.console.print(Text(line), soft_wrap=True, highlight=False)

    def close(self) -> None:
        """Leave the last frame on the screen, the cursor below it and shown again."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def show(mirror: StateMirror, *, address: str = "", out: TextIO | None = None) -> None:
    """Print the run once (``orch status``): the rich view on a terminal, else :func:`render`."""
    out = out or sys.stdout
    if _is_terminal(out):
        Console(file=out, force_terminal=True).print(run_table(mirror, address=address))
    else:
        out.write(render(mirror, address=address) + "\n")
        out.flush()


class Dashboard:
    """Polls ``client`` every ``interval`` seconds and draws the run until it ends: redrawn in
    place on a terminal, a plain line every ``plain_every`` seconds elsewhere."""

    def __init__(
        self,
        client: MasterClient,
        *,
        out: TextIO | None = None,
        interval: float = 0.5,
        plain_every: float = 5.0,
        output: Callable[[], list[str]] | None = None,
    ) -> None:
        self.client = client
        self.output = output  # the ranks' own lines to print since the last draw (orch.views.output)
        self.out = out or sys.stdout
        self.interval = interval
        self.plain_every = plain_every
        self.mirror = StateMirror()
        self._last_plain = -math.inf
        self._screen = _Screen(self.out)
        self._tty = self._screen.tty
        self._job = ""  # the scheduler job's state last written (plain lines)
        self._startup = ""  # the start-up note last written (plain lines)

    def poll(self) -> StateMirror:
        return self.mirror.poll(self.client, skip_series=True)  # the table needs no points

    def draw(self) -> None:
        lines = self.output() if self.output is not None else []
        if self._tty:
            self._screen.above(lines)
            self._screen.frame(run_table(self.mirror, address=self.client.address))
            return
        if lines:
            self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()
        job = self.mirror.job.describe() if self.mirror.job is not None else ""
        if job != self._job:  # a line each time the job's state changes: queued, running, over
            self._job = job
            self.out.write(printable(job, one_line=True) + "\n")
        startup = self.mirror.startup_note
        if startup:  # before the first step: a line for each thing the run waits for, once
            if startup != self._startup:
                self._startup = startup
                seconds = self.mirror.elapsed  # the run's one clock, from its launch
                self.out.write(f"[{seconds:6.1f}s] starting: {printable(startup, one_line=True)}\n")
                self.out.flush()
            return
        now = time.monotonic()
        if now - self._last_plain < self.plain_every and not self.mirror.state.done:
            return
        self._last_plain = now
        done, total = self.mirror.progress()
        losses = " ".join(r.loss_text() for r in self.mirror.ranks)
        self.out.write(
            f"[{self.mirror.elapsed:6.1f}s] {self.mirror.state.value} step {done}"
            f"{'/' + str(total) if total else ''} loss per rank: {losses}\n"
        )
        self.out.flush()

    def close(self) -> None:
        """End the live view (``run`` does): the last frame stays, the cursor is shown."""
        self._screen.close()

    def run(self, stop: threading.Event | None = None) -> StateMirror:
        """Draw until the run is over (or ``stop`` is set); return the final state."""
        failures = 0
        try:
            while True:
                try:
                    self.poll()
                    failures = 0
                except MasterUnavailable:
                    failures += 1
                    if failures > 10:
                        raise
                self.draw()
                if self.mirror.state.done or (stop is not None and stop.is_set()):
                    return self.mirror
                time.sleep(self.interval)
        finally:
            self.close()


class SweepDashboard:
    """Draws ``rows()`` (a row per run of a sweep, as :func:`sweep_table` takes them) every
    ``interval`` seconds until ``done()`` returns True: redrawn in place on a terminal; a
    line of counts every ``plain_every`` seconds elsewhere, and the plain table at the end."""

    def __init__(
        self,
        rows: Callable[[], list[dict[str, Any]]],
        done: Callable[[], bool],
        *,
        metric: str = "loss",
        out: TextIO | None = None,
        interval: float = 0.5,
        plain_every: float = 5.0,
    ) -> None:
        self.rows = rows
        self.done = done
        self.metric = metric
        self.out = out or sys.stdout
        self.interval = interval
        self.plain_every = plain_every
        self._screen = _Screen(self.out)
        self._started = time.monotonic()
        self._last_plain = -math.inf

    def draw(self, rows: list[dict[str, Any]], *, final: bool = False) -> None:
        if self._screen.tty:
            self._screen.frame(sweep_table(rows, self.metric))
            return
        now = time.monotonic()
        if final:
            self.out.write(render_sweep_plain(rows, self.metric) + "\n")
        elif now - self._last_plain >= self.plain_every:
            self._last_plain = now
            best = [r for r in rows if r.get("best_run")]
            note = ""
            if best:
                value = number_text(best[0].get("last", {}).get(self.metric))
                note = f"; best #{best[0].get('index', 0)} {printable(self.metric, one_line=True)} {value}"
            self.out.write(f"[{now - self._started:6.1f}s] sweep: {state_counts(rows)}{note}\n")
        self.out.flush()

    def close(self) -> None:
        self._screen.close()

    def run(self, stop: threading.Event | None = None) -> list[dict[str, Any]]:
        """Draw until ``done()`` (or ``stop`` is set); return the last rows drawn."""
        try:
            while True:
                finished = self.done() or (stop is not None and stop.is_set())
                rows = self.rows()  # read after done(): the rows of a finished sweep are final
                self.draw(rows, final=finished)
                if finished:
                    return rows
                time.sleep(self.interval)
        finally:
            self.close()
