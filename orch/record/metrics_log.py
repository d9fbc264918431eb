"""A run's metrics log (``metrics.pb``): its format, written and read here, and the restart rule.

The log is append-only: each record is ``<u32 length><u32 crc32><payload>``, the payload one
heartbeat's points of one rank and attempt (:func:`orch.wire.codec.metric_record`). A torn
last record (the master died mid-write) fails its length or checksum and is ignored on
reading; a damaged record elsewhere is skipped, and reading resumes at the next intact one.
A framed file of protobuf records rather than a database: the master appends each beat's
points as the rank sent them, with one ``write`` and no index to keep, and a reader maps the
file and walks it. A restarted attempt's points replace the old attempt's from their first
step on (:class:`Attempts`): readers apply the rule as they read.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orch.record.owned import open_own
from orch.wire.codec import RECORD_KEYS, metric_batch
from orch.wire.model import MetricBatch

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
MAX_RECORD = 64 * 1024 * 1024


def frame(payload: bytes) -> bytes:
    """One record of the log: its payload after its length and checksum."""
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class Attempts:
    """The restart rule of one series, apart from the points it applies to (the master's
    series in memory and every reader of this log follow it).

    A restarted group replays the steps after its last checkpoint: a newer attempt's points
    replace those of the older one from its first step on, so no step is counted twice.
    """

    __slots__ = ("attempt", "last_step")

    def __init__(self) -> None:
        self.attempt = 0
        self.last_step: int | None = None

    def rewinds(self, steps: Sequence[int], attempt: int) -> bool:
        """Take a batch: True when it replaces the points held from ``steps[0]`` on."""
        if not steps:
            return False  # an empty batch says nothing of where its attempt starts
        rewound = attempt > self.attempt and self.last_step is not None and steps[0] <= self.last_step
        self.attempt = max(self.attempt, attempt)
        self.last_step = steps[-1]
        return rewound


_NOTED_REGIONS = 10
# A record's payload is its fields, each after its key: rank and attempt (varints) and series
# (length-delimited). The scan after damage reads a key as one byte (see codec.RECORD_KEYS).
_TAGS = RECORD_KEYS
_SERIES_TAG = RECORD_KEYS[2]
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


def read_metrics(path: Path, damage: MetricsDamage | None = None) -> Iterator[MetricBatch]:
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


def _records(buf: mmap.mmap, report: MetricsDamage) -> Iterator[MetricBatch]:
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


def _record_at(buf: mmap.mmap, pos: int) -> tuple[MetricBatch, int] | None:
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
    record = metric_batch(payload)
    return (record, end) if record is not None else None


def _resync(buf: mmap.mmap, pos: int) -> tuple[int, tuple[MetricBatch, int]] | None:
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
