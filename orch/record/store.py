"""The durable part of a run dir: the metrics log, the event log and the run's metadata.

``metrics.pb`` is append-only: each record is ``<u32 length><u32 crc32><MetricRecord>``,
written (to the operating system, unbuffered) before the heartbeat that carried it is
acknowledged, so a point a worker saw acknowledged survives the master being killed; a
background thread fsyncs once a second against power loss. A torn last record (the master
died mid-write) fails its length or checksum and is ignored on reading; a damaged record
elsewhere is skipped, and reading resumes at the next intact one. ``events.jsonl`` holds
one JSON event per line; ``run.json`` what was launched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import mmap
import os
import re
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from orch.errors import OrchError
from orch.record.owned import open_own, read_line
from orch.record.writes import own_dir
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import field_key
from orch.wire.model import Event

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
MAX_RECORD = 64 * 1024 * 1024


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

    def append_points(self, rank: int, attempt: int, series: Iterable[pb.Series]) -> None:
        payload = pb.MetricRecord(rank=rank, attempt=attempt, series=series).SerializeToString()
        record = HEADER.pack(len(payload), zlib.crc32(payload)) + payload
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


_NOTED_REGIONS = 10
# A MetricRecord's payload is its fields, each after its key: rank and attempt (varints) and
# series (length-delimited). The scan after damage reads a key as one byte: so they must be.
_TAGS = b"".join(field_key(pb.MetricRecord, name) for name in ("rank", "attempt", "series"))
_SERIES_TAG = field_key(pb.MetricRecord, "series")[0]
if len(_TAGS) != 3:
    raise ImportError("MetricRecord's rank, attempt and series must be numbered below 16 (one-byte keys)")
# Where a record may start after damage, matched from the header's 4th byte on: the high
# byte of a length of at most MAX_RECORD, the crc (any 4 bytes), a tag. The regex engine
# skips a damaged stretch in C; the few offsets it stops at are checked in Python.
_RESYNC = re.compile(b"[\x00-" + bytes([MAX_RECORD >> 24]) + b"].{4}[" + _TAGS + b"]", re.DOTALL)


@dataclass
class MetricsDamage:
    """What reading a metrics log skipped, for the caller to report.

    ``regions`` and ``skipped_bytes`` count the damaged stretches skipped to resynchronise
    (``first`` holds the offset and length of the first few); ``torn_tail`` is the incomplete
    last record a master that died mid-write leaves behind, expected and not counted as damage.
    """

    regions: int = 0
    skipped_bytes: int = 0
    first: list[tuple[int, int]] = field(default_factory=list)
    torn_tail: tuple[int, int] | None = None

    def skip(self, at: int, length: int) -> None:
        self.regions += 1
        self.skipped_bytes += length
        if len(self.first) < _NOTED_REGIONS:
            self.first.append((at, length))

    def notes(self, name: str) -> list[str]:
        """One human-readable line per thing skipped (the first few regions, then a total)."""
        out = [f"{name}: skipped {n} damaged bytes at byte {at}" for at, n in self.first]
        if self.regions > len(self.first):
            rest = self.skipped_bytes - sum(n for _, n in self.first)
            more = self.regions - len(self.first)
            out.append(f"{name}: skipped {more} more damaged regions ({rest} bytes)")
        if self.torn_tail is not None:
            at, n = self.torn_tail
            out.append(
                f"{name}: ignored an incomplete last record ({n} bytes at byte {at}): "
                "its writer stopped in the middle of it"
            )
        return out

    def warn(self, path: Path) -> None:
        for note in self.notes(str(path)):
            log.warning("%s", note)


def read_metrics(path: Path, damage: MetricsDamage | None = None) -> Iterator[pb.MetricRecord]:
    """Every intact record of a metrics log, in order, resynchronising after damage.

    A record that fails its length, checksum or parse does not end the read: the scan goes
    on from the next offset where an intact record starts, so one flipped byte costs one
    record, not the rest of the file. What was skipped is added to ``damage`` when given
    (the caller reports it), else logged as a warning. The file is mapped rather than read
    whole: memory holds the records still in use, not the log.
    """
    report = damage if damage is not None else MetricsDamage()
    try:
        f = open_own(path)  # a regular file of this user's: never a FIFO or a device
    except FileNotFoundError:
        return
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            return  # an empty file cannot be mapped
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            yield from _records(buf, report)
    if damage is None:
        report.warn(path)


def _records(buf: mmap.mmap, report: MetricsDamage) -> Iterator[pb.MetricRecord]:
    size, pos = len(buf), 0
    while pos < size:
        found = _record_at(buf, pos)
        if found is None:
            resumed = _resync(buf, pos)
            if resumed is None:
                if _incomplete(buf, pos):
                    report.torn_tail = (pos, size - pos)
                else:
                    report.skip(pos, size - pos)
                return
            at, found = resumed
            report.skip(pos, at - pos)
        record, pos = found
        yield record


def _record_at(buf: mmap.mmap, pos: int) -> tuple[pb.MetricRecord, int] | None:
    """The intact record framed at ``pos`` and the offset after it, or None."""
    if pos + HEADER.size > len(buf):
        return None
    length, crc = HEADER.unpack_from(buf, pos)
    start, end = pos + HEADER.size, pos + HEADER.size + length
    if length > MAX_RECORD or end > len(buf):
        return None
    payload = buf[start:end]
    if zlib.crc32(payload) != crc:
        return None
    record = pb.MetricRecord()
    try:
        record.ParseFromString(payload)
    except DecodeError:
        return None
    if any(len(s.steps) != len(s.values) for s in record.series):
        return None
    return record, end


def _resync(buf: mmap.mmap, pos: int) -> tuple[int, tuple[pb.MetricRecord, int]] | None:
    """Where the first intact, non-empty record after ``pos`` starts, with what _record_at gives.

    Empty records are not looked for: they carry no points, and a stretch of zeros, which
    a crash can leave, would read as a run of them.
    """
    at = pos + 1
    while (m := _RESYNC.search(buf, at + 3)) is not None:
        at = m.start() - 3
        length = HEADER.unpack_from(buf, at)[0]
        end = at + HEADER.size + length
        if 0 < length <= MAX_RECORD and end <= len(buf) and _fields_fit(buf, at + HEADER.size, end):
            found = _record_at(buf, at)
            if found is not None:
                return at, found
        at += 1
    return None


def _fields_fit(buf: mmap.mmap, pos: int, end: int) -> bool:
    """Whether ``buf[pos:end]`` walks as MetricRecord fields: a cheap test before the crc."""
    while pos < end:
        tag = buf[pos]
        if tag not in _TAGS:
            return False
        value, pos = _varint(buf, pos + 1, end)
        if value < 0:
            return False
        if tag == _SERIES_TAG:
            pos += value
    return pos == end


def _varint(buf: mmap.mmap, pos: int, end: int) -> tuple[int, int]:
    """A protobuf varint at ``pos`` and the offset after it; (-1, pos) when it runs past ``end``."""
    value = shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return -1, pos


def _incomplete(buf: mmap.mmap, pos: int) -> bool:
    """Whether the record at ``pos`` runs past the end: a torn tail rather than damage."""
    if pos + HEADER.size > len(buf):
        return True
    length: int = HEADER.unpack_from(buf, pos)[0]
    return length <= MAX_RECORD and pos + HEADER.size + length > len(buf)


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
