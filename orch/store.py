"""The durable part of a run dir: the metrics log, the event log and the run's metadata.

``metrics.pb`` is append-only: each record is ``<u32 length><u32 crc32><MetricRecord>``,
written (to the operating system, unbuffered) before the heartbeat that carried it is
acknowledged, so a point a worker saw acknowledged survives the master being killed; a
background thread fsyncs once a second against power loss. A torn last record (the master
died mid-write) fails its length or checksum and is ignored on reading, as is anything
after it. ``events.jsonl`` holds one JSON event per line; ``run.json`` what was launched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ._proto import orchestrator_pb2 as pb

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
MAX_RECORD = 64 * 1024 * 1024


def write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunStore:
    """Appends a run's metric points and events to its run dir."""

    def __init__(self, run_dir: Path, *, fsync_interval: float = 1.0) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._metrics = open(run_dir / "metrics.pb", "ab", buffering=0)  # noqa: SIM115
        self._events = open(run_dir / "events.jsonl", "a", buffering=1)  # noqa: SIM115
        self._dirty = False
        self._closed = threading.Event()
        self._syncer = threading.Thread(
            target=self._sync_loop, args=(fsync_interval,), daemon=True, name="orch-store-fsync"
        )
        self._syncer.start()

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_json_atomic(self.run_dir / "run.json", meta)

    def append_points(self, rank: int, attempt: int, series: Iterable[pb.Series]) -> None:
        payload = pb.MetricRecord(rank=rank, attempt=attempt, series=series).SerializeToString()
        record = HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            if self._closed.is_set():
                return
            self._metrics.write(record)
            self._dirty = True

    def append_event(self, event: pb.Event) -> None:
        line = json.dumps(
            {"time": event.time, "kind": event.kind, "rank": event.rank, "message": event.message}
        )
        with self._lock:
            if not self._closed.is_set():
                self._events.write(line + "\n")

    def _sync_loop(self, interval: float) -> None:
        while not self._closed.wait(interval):
            self.sync()

    def sync(self) -> None:
        with self._lock:
            if self._dirty and not self._closed.is_set():
                with contextlib.suppress(OSError):
                    os.fsync(self._metrics.fileno())
                    os.fsync(self._events.fileno())
                self._dirty = False

    def close(self) -> None:
        self.sync()
        with self._lock:
            self._closed.set()
            self._metrics.close()
            self._events.close()
        self._syncer.join(timeout=2.0)


def read_metrics(path: Path) -> Iterator[pb.MetricRecord]:
    """Every intact record of a metrics log, in order; stops at the first torn one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    pos = 0
    while pos + HEADER.size <= len(data):
        length, crc = HEADER.unpack_from(data, pos)
        start, end = pos + HEADER.size, pos + HEADER.size + length
        if length > MAX_RECORD or end > len(data) or zlib.crc32(data[start:end]) != crc:
            log.warning("%s: ignoring a torn or corrupt record at byte %d (and what follows)", path, pos)
            return
        record = pb.MetricRecord()
        record.ParseFromString(data[start:end])
        yield record
        pos = end


def read_events(path: Path) -> list[dict[str, Any]]:
    """The event log; a torn last line is ignored."""
    events = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return events
