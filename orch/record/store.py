"""The durable part of a run dir: the metrics log, the event log and the run's metadata.

The metrics log (``metrics.pb``, its format in :mod:`.metrics_log`) is written before the
heartbeat that carried its points is acknowledged (to the operating system, unbuffered), so a
point a worker saw acknowledged survives the master being killed; a background thread fsyncs
once a second against power loss. ``events.jsonl`` holds one JSON event per line;
``run.json`` what was launched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orch.errors import OrchError
from orch.record.metrics_log import frame
from orch.record.owned import open_own, read_line
from orch.record.writes import own_dir
from orch.wire.model import Event

log = logging.getLogger(__name__)


class RunStore:
    """Appends a run's metric points and events to its run dir."""

    def __init__(self, run_dir: Path, *, fsync_interval: float = 1.0) -> None:
        self.run_dir = run_dir
        # Held open from its creation: the run's own writes go through it (see .writes).
        self.folder = own_dir(run_dir)
        self._lock = threading.Lock()
        self._metrics = self.folder.append("metrics.pb")
        self._events = self.folder.append("events.jsonl")
        self._dirty = False
        self.on_moved: Callable[[str], None] | None = None  # told once if the run dir is swapped
        self._closed = threading.Event()
        self._syncer = threading.Thread(
            target=self._sync_loop, args=(fsync_interval,), daemon=True, name="orch-store-fsync"
        )
        self._syncer.start()

    def write_meta(self, meta: dict[str, Any]) -> None:
        self.folder.put_json("run.json", meta)

    def append_metrics(self, payload: bytes) -> None:
        """Append one record of points (:func:`orch.wire.codec.metric_record`'s bytes)."""
        record = frame(payload)
        with self._lock:
            if self._closed.is_set():
                return
            self._metrics.write(record)
            self._dirty = True

    def append_event(self, event: Event) -> None:
        line = json.dumps(dataclasses.asdict(event))
        with self._lock:
            if not self._closed.is_set():
                self._events.write(line.encode() + b"\n")

    def _sync_loop(self, interval: float) -> None:
        while not self._closed.wait(interval):
            self.sync()
            # The run dir's path still leads to the folder made for it (the writes here go
            # through its descriptor whatever the path says; the ranks open it by its path).
            moved = self.folder.moved() if self.on_moved is not None else ""
            if moved and self.on_moved is not None:
                self.on_moved(moved)
                self.on_moved = None

    def sync(self) -> None:
        with self._lock:
            if not self._dirty or self._closed.is_set():
                return
            self._dirty = False
            # Copies of the descriptors: close() may close the files while they are synced.
            fds = [os.dup(self._metrics.fileno()), os.dup(self._events.fileno())]
        # An fsync can take a long while on a busy disk: never while appends wait on the lock.
        for fd in fds:
            with contextlib.suppress(OSError):
                os.fsync(fd)
            os.close(fd)

    def close(self) -> None:
        self.sync()
        with self._lock:
            self._closed.set()
            self._metrics.close()
            self._events.close()
        self._syncer.join(timeout=2.0)
        self.folder.close()


MAX_EVENT_LINE_BYTES = 1024 * 1024  # an event's line: a traceback of 64 KiB, escaped, fits


def read_events(path: Path) -> list[dict[str, Any]]:
    """The event log, every line checked; a torn last line (its writer died mid-line) is ignored.

    Raises :class:`~orch.errors.OrchError`, naming the file and line, for a line that is not
    JSON (anywhere but last) or not an event object.
    """
    try:
        f = open_own(path)
    except FileNotFoundError:
        return []
    events: list[dict[str, Any]] = []
    with f:
        pending: tuple[int, bytes] | None = None
        number = 0
        while True:
            line, cut = read_line(f, MAX_EVENT_LINE_BYTES)
            if not line:
                break
            number += 1
            if cut:
                raise OrchError(
                    f"{path}, line {number}: over {MAX_EVENT_LINE_BYTES:,} bytes, not an event orch "
                    "wrote; move the event log aside to load the run without its events"
                )
            if pending is not None:
                events.append(_event(path, *pending))
            pending = (number, line)
    if pending is not None and _parses(pending[1]):
        events.append(_event(path, *pending))
    return events


_EVENT_FIELDS: dict[str, tuple[type, ...]] = {
    "time": (int, float),
    "kind": (str,),
    "rank": (int,),
    "message": (str,),
}


def _parses(line: bytes) -> bool:
    try:
        json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return True


def json_object(data: bytes, where: str, remedy: str) -> dict[str, Any]:
    """``data`` parsed as a JSON object, else an OrchError naming ``where`` and what to do."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise OrchError(f"{where}: not valid JSON ({type(e).__name__}: {e}); {remedy}") from e
    if not isinstance(value, dict):
        raise OrchError(f"{where}: should hold a JSON object, not {type(value).__name__}")
    return value


def _event(path: Path, number: int, line: bytes) -> dict[str, Any]:
    """One line of the event log, checked to be an event."""
    value = json_object(
        line,
        f"{path}, line {number}",
        "the event log is damaged: move it aside to load the run without its events",
    )
    for key, types in _EVENT_FIELDS.items():
        if key not in value:
            raise OrchError(f"{path}, line {number}: the event has no {key!r}")
        if not isinstance(value[key], types) or isinstance(value[key], bool):
            raise OrchError(
                f"{path}, line {number}: the event's {key!r} should be "
                f"{' or '.join(t.__name__ for t in types)}, not {type(value[key]).__name__}"
            )
    return value


def tail(path: Path, lines: int, max_bytes: int = 16384) -> str:
    """The last ``lines`` lines of a file, reading at most ``max_bytes`` from its end; a file
    that is not a regular one of this user's shows why instead."""
    try:
        with open_own(path) as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes).decode(errors="replace")
    except OSError:
        return ""
    except OrchError as e:
        return str(e)
    return "\n".join(shown_lines(data)[-lines:])


def shown_lines(text: str) -> list[str]:
    """The lines of a log as a terminal leaves them: a line rewritten with ``\r`` (a tqdm bar)
    is its last state, one line, so the lines printed around it stay in view."""
    out = []
    for line in text.split("\n"):
        if "\r" in line:
            line = next((part for part in reversed(line.split("\r")) if part.strip()), "")
        out.append(line.rstrip("\r"))
    if out and not out[-1]:
        out.pop()  # the text ended with its last line's newline
    return out
