"""The live terminal dashboard of ``orch run`` and ``orch master``.

:func:`render` turns a :class:`~orch.client.StateMirror` into text (pure, tested on its
own); :class:`Dashboard` polls a master and redraws that text in place on a terminal,
or prints a line now and then when the output is a file or a pipe.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import TextIO

from .client import MasterClient, StateMirror
from .errors import MasterUnavailable
from .states import RankState

STRAGGLER_FRACTION = 0.8  # a rank below this share of the median steps/s is marked slow

# Terminal control sequences, whole: CSI (ESC [ or 0x9b ... final byte), OSC, DCS, SOS, PM and
# APC strings (up to BEL or ST), other two-byte escapes; then any other C0/C1 control but
# newline and tab, and DEL.
_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` without terminal control sequences: what a remote host or traceback says is shown,
    never obeyed (a host name can carry an escape that retitles or clears the terminal).

    ``one_line`` also turns newlines and tabs into spaces, for a field of one table row.
    """
    text = _CONTROL.sub("", text)
    return text.replace("\n", " ").replace("\t", " ") if one_line else text


def _fmt_age(age: float) -> str:
    return "-" if age < 0 else f"{age:.1f}s"


def _bar(done: int, total: int, width: int = 30) -> str:
    if total <= 0:
        return f"step {done}"
    frac = min(1.0, done / total)
    fill = round(frac * width)
    return f"[{'#' * fill}{'.' * (width - fill)}] {done}/{total} ({frac:.0%})"


def stragglers(mirror: StateMirror) -> set[int]:
    """Ranks still running clearly slower than the others."""
    running = [r for r in mirror.ranks if r.state is RankState.RUNNING and r.steps_per_sec > 0]
    if len(running) < 2:
        return set()
    rates = sorted(r.steps_per_sec for r in running)
    median = rates[len(rates) // 2]
    return {r.rank for r in running if r.steps_per_sec < STRAGGLER_FRACTION * median}


def render(mirror: StateMirror, *, address: str = "") -> str:
    done, total = mirror.progress()
    lines = [
        f"orch run {printable(mirror.run_id, one_line=True) or '?'}  {mirror.state.value:<9}  "
        f"{mirror.registered}/{mirror.world_size} ranks  elapsed {mirror.elapsed:6.1f}s"
        + (f"  attempt {mirror.attempt}/{mirror.max_attempts}" if mirror.max_attempts > 1 else "")
        + (f"  master {printable(address, one_line=True)}" if address else "")
        + (f"  rendezvous {printable(str(mirror.rendezvous), one_line=True)}" if mirror.rendezvous else ""),
        _bar(done, total),
        "",
        f"{'rank':>4}  {'state':<10} {'step':>7} {'loss':>10} {'steps/s':>8} {'heartbeat':>9}  host/pid",
    ]
    slow = stragglers(mirror)
    for r in mirror.ranks:
        marks = []
        if r.rank in slow:
            marks.append("SLOW")
        if r.diverged:
            marks.append("NaN/inf loss")
        if r.dropped_points:
            marks.append(f"{r.dropped_points} points dropped")
        host = printable(r.host, one_line=True)  # what the worker says its host is called
        lines.append(
            f"{r.rank:>4}  {r.state.value:<10} {r.step:>7} {r.loss_text():>10} "
            f"{r.steps_per_sec:>8.1f} {_fmt_age(r.heartbeat_age):>9}  {host}/{r.pid}"
            + (f"  <- {', '.join(marks)}" if marks else "")
        )
    if mirror.failure:
        lines += ["", f"FAILED: {printable(mirror.failure)}"]
    return "\n".join(lines)


def summary(mirror: StateMirror) -> str:
    lines = [f"run {printable(mirror.run_id, one_line=True)} {mirror.state.value} in {mirror.elapsed:.1f}s"]
    for r in mirror.ranks:
        lines.append(
            f"  rank {r.rank}: {r.state.value}, step {r.step}, loss {r.loss_text()}"
            + (f", params {printable(r.param_checksum, one_line=True)[:12]}" if r.param_checksum else "")
        )
    if mirror.failure:
        lines.append(f"root cause: {printable(mirror.failure)}")
        if mirror.root_cause_error:
            lines.append(printable(mirror.root_cause_error).rstrip())
    return "\n".join(lines)


class Dashboard:
    """Polls ``client`` every ``interval`` seconds and draws the run until it ends."""

    def __init__(
        self,
        client: MasterClient,
        *,
        out: TextIO | None = None,
        interval: float = 0.5,
        plain_every: float = 5.0,
    ) -> None:
        self.client = client
        self.out = out or sys.stdout
        self.interval = interval
        self.plain_every = plain_every
        self.mirror = StateMirror()
        self._drawn_lines = 0
        self._last_plain = 0.0
        self._tty = bool(getattr(self.out, "isatty", lambda: False)())

    def poll(self) -> StateMirror:
        return self.mirror.poll(self.client, skip_series=True)  # the table needs no points

    def draw(self) -> None:
        text = render(self.mirror, address=self.client.address)
        if self._tty:
            # Move to the top of the previous frame and overwrite it: no scrolling, no flicker.
            up = f"\x1b[{self._drawn_lines}F" if self._drawn_lines else ""
            self.out.write(up + "\x1b[J" + text + "\n")
            self._drawn_lines = text.count("\n") + 1
        else:
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

    def run(self, stop: threading.Event | None = None) -> StateMirror:
        """Draw until the run is over (or ``stop`` is set); return the final state."""
        failures = 0
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
