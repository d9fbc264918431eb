"""The metric points of a run: one series per (rank, metric), read through cursors, under one
memory budget per master (the run dir's metrics log keeps every point)."""

from __future__ import annotations

import bisect
import sys
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from orch.master.control.validate import Reject
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.limits import MAX_METRICS_PER_RANK
from orch.wire.ranks import loss_name

# Points held in memory by one master, across all its series (24 bytes each: 23 MiB). Past it
# the oldest points of the biggest series leave memory first, down to three quarters of it.
MAX_POINTS_IN_MEMORY = 1_000_000
MAX_POINTS_PER_REPLY = 250_000  # a GetState reply stays a few MiB; the caller asks again for more
PIECE_POINTS = 8192  # points of a catch-up built at once (about 1 ms holding the GIL)
# Points of one encoded block kept for the catch-ups after it. Small, so that the many short
# series of a big run (1,024 ranks, a few hundred points each) are encoded once too; a piece
# joins its blocks' bytes (a Series message's packed fields, repeated, parse as one).
BLOCK_POINTS = 256


class Series:
    """One rank's points of one metric, in compact arrays.

    ``base`` is the absolute index of the first point held: the oldest points leave memory
    under the budget, and cursors, which count absolute points, stay valid.
    """

    __slots__ = ("attempt", "base", "blocks", "steps", "times", "values")

    def __init__(self) -> None:
        self.steps = array("q")
        self.values = array("d")
        self.times = array("d")
        self.attempt = 0
        self.base = 0
        # Encoded whole blocks of BLOCK_POINTS points (absolute index // BLOCK_POINTS): held
        # points never change, so a block is encoded once for every catch-up after it.
        self.blocks: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def end(self) -> int:
        """Absolute index after the last point."""
        return self.base + len(self.steps)

    def add(
        self, steps: Sequence[int], values: Sequence[float], times: Sequence[float], attempt: int
    ) -> bool:
        """Append points; True when a newer attempt rewound the series.

        A restarted group replays the steps after its last checkpoint: the new attempt's
        points replace those of the old one from its first step on, so no step is counted twice.
        """
        if not steps:
            return False  # an empty batch says nothing of where its attempt starts
        rewound = False
        if attempt > self.attempt and self.steps and steps[0] <= self.steps[-1]:
            cut = bisect.bisect_left(self.steps, steps[0])
            del self.steps[cut:], self.values[cut:], self.times[cut:]
            self.blocks.clear()  # a rewind rewrites points: no encoded block stands
            rewound = True
        self.attempt = max(self.attempt, attempt)
        self.steps.extend(steps)
        self.values.extend(values)
        self.times.extend(times)
        return rewound

    def trim(self, drop: int) -> None:
        """Let the oldest ``drop`` points leave memory."""
        del self.steps[:drop], self.values[:drop], self.times[:drop]
        self.base += drop
        for k in [k for k in self.blocks if k * BLOCK_POINTS < self.base]:
            del self.blocks[k]  # no longer whole in memory

    def encode(self, rank: int, name: str, base: int, first: int, last: int) -> bytes:
        """:meth:`copy`, serialized, the fast way: protobuf converts only the steps (varints);
        the values and the times are the arrays' own bytes, as packed doubles are on the wire."""
        if not RAW_DOUBLES:
            return self.copy(rank, name, base, first, last).SerializeToString()
        a, b = first - base, max(first, last) - base
        head = pb.Series(rank=rank, name=name, steps=self.steps[a:b]).SerializeToString()
        values, times = self.values[a:b].tobytes(), self.times[a:b].tobytes()
        return b"".join((head, VALUES_TAG, varint(len(values)), values, TIMES_TAG, varint(len(times)), times))

    def copy(self, rank: int, name: str, base: int, first: int, last: int) -> pb.Series:
        """Points ``first`` to ``last`` (absolute indexes), as held when the first point held was ``base``."""
        a, b = first - base, max(first, last) - base
        return pb.Series(
            rank=rank, name=name, steps=self.steps[a:b], values=self.values[a:b], times=self.times[a:b]
        )


def varint(n: int) -> bytes:
    """``n`` as a protobuf varint."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _packed_tag(field: str) -> bytes:
    return bytes([(pb.Series.DESCRIPTOR.fields_by_name[field].number << 3) | 2])  # length-delimited


VALUES_TAG, TIMES_TAG = _packed_tag("values"), _packed_tag("times")
# Doubles go on the wire as little-endian 8-byte floats: the arrays' own bytes on such a machine.
RAW_DOUBLES = sys.byteorder == "little"


def water_level(lengths: list[int], excess: int) -> int:
    """The largest length L such that cutting every longer series down to L frees ``excess`` points."""
    ordered = sorted(lengths, reverse=True)
    top = 0
    for k, n in enumerate(ordered, 1):
        top += n
        level = (top - excess) // k
        following = ordered[k] if k < len(ordered) else 0
        if level >= following:
            return max(level, 0)
    return 0


@dataclass(frozen=True)
class Slice:
    """Which points of one series a reply carries (absolute indexes), planned under the lock."""

    rank: int
    name: str
    series: Series
    base: int
    first: int
    last: int


class SeriesLog:
    """Every series of a run. ``epoch`` changes when points a cursor counted are gone for
    another reason than the budget (a restart rewound a series): such cursors start over."""

    def __init__(self, max_points_in_memory: int = MAX_POINTS_IN_MEMORY) -> None:
        self.max_points_in_memory = max_points_in_memory
        self.points_in_memory = 0
        self.epoch = 0
        self._series: dict[tuple[int, str], Series] = {}
        self._names: dict[int, set[str]] = {}

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(list(self._series))

    def get(self, rank: int, name: str) -> Series:
        return self._series.get((rank, name), Series())

    @property
    def trimmed(self) -> bool:
        """True when some points are only in the run dir's metrics log, no longer in memory."""
        return any(s.base for s in self._series.values())

    def check_names(self, rank: int, series: Sequence[pb.Series]) -> None:
        """A rank logs at most :data:`MAX_METRICS_PER_RANK` different metrics (a cap on what
        its beat carries, as the checks of :mod:`.validate`: the sender drops such a beat)."""
        known = self._names.get(rank, set())
        new = {s.name for s in series} - known
        if len(known) + len(new) > MAX_METRICS_PER_RANK:
            raise Reject(
                "invalid_argument",
                f"rank {rank} would log more than {MAX_METRICS_PER_RANK} different metrics",
            )

    def add(self, rank: int, series: Sequence[pb.Series], attempt: int, wall: float) -> float | None:
        """Append one heartbeat's points (checked with :meth:`check_names` first); returns the
        last loss value it carried, if any. Points without times get ``wall``."""
        names = self._names.setdefault(rank, set())
        names.update(s.name for s in series)
        shown = loss_name(names)
        loss = None
        for s in series:
            held_series = self._series.get((rank, s.name))
            if held_series is None:
                held_series = self._series[(rank, s.name)] = Series()
            times = s.times if s.times else [wall] * len(s.steps)
            held = len(held_series)
            if held_series.add(s.steps, s.values, times, attempt):
                self.epoch += 1
            self.points_in_memory += len(held_series) - held
            if s.name == shown and s.values:
                loss = s.values[-1]
        if self.max_points_in_memory and self.points_in_memory > self.max_points_in_memory:
            self._trim()
        return loss

    def _trim(self) -> None:
        """Bring the points in memory down to three quarters of the budget, from the oldest
        points of the biggest series: every series longer than one level is cut to it, so a
        flood of one series leaves the others whole."""
        excess = self.points_in_memory - self.max_points_in_memory * 3 // 4
        level = water_level([len(s) for s in self._series.values()], excess)
        for s in self._series.values():
            if len(s) > level:
                self.points_in_memory -= len(s) - level
                s.trim(len(s) - level)

    def plan(self, sent: dict[str, int], budget: int, cursor: pb.StateCursor) -> tuple[list[Slice], bool]:
        """Which points go in one reply: those after ``sent`` (per ``rank/name`` key), at most
        ``budget``. Fills ``cursor`` with the offsets after them; True when more are left."""
        plan: list[Slice] = []
        more = False
        for (rank, name), s in sorted(self._series.items()):
            key = f"{rank}/{name}"
            first = max(sent.get(key, 0), s.base)  # absolute; points before base left memory
            last = min(s.end, first + budget)
            if last > first:
                plan.append(Slice(rank, name, s, s.base, first, last))
                budget -= last - first
            more = more or last < s.end
            cursor.keys.append(key)
            cursor.offsets.append(last)
        return plan, more

    @staticmethod
    def copy(plan: list[Slice]) -> list[pb.Series]:
        """The planned points, copied without the lock: appends (and the array slices here)
        are atomic under the GIL and never move held points."""
        return [sl.series.copy(sl.rank, sl.name, sl.base, sl.first, sl.last) for sl in plan]

    @staticmethod
    def encode(plan: list[Slice]) -> list[list[bytes]]:
        """The planned points as serialized ``Series`` messages, each slice in pieces of at
        most :data:`PIECE_POINTS` points, without the lock. Building a message holds the GIL
        for as long as it takes (a 250k-point series: some 30 ms, during which the master's
        event loop serves no heartbeat); between pieces this thread lets it go, so a catch-up
        delays a heartbeat by one piece at most. A reader takes the pieces of one series
        in order as one series (the panel's mirror extends it).

        A piece is the bytes of its whole blocks of :data:`BLOCK_POINTS` points, each encoded
        once and kept, joined with the ends of the slice encoded afresh: a catch-up of points
        already sent to another client is mostly a join."""
        out: list[list[bytes]] = []
        for sl in plan:
            pieces = []
            series, first = sl.series, sl.first
            cached = sl.base == series.base  # else trimmed since the plan: nothing is kept
            while first < sl.last:
                end = min(sl.last, first + PIECE_POINTS)
                parts: list[bytes] = []
                fresh = first  # the start of points not yet in parts
                k = -(-first // BLOCK_POINTS)  # the first whole block at or after first
                while (k + 1) * BLOCK_POINTS <= end:
                    start = k * BLOCK_POINTS
                    block = series.blocks.get(k) if cached else None
                    if block is None:
                        block = series.encode(sl.rank, sl.name, sl.base, start, start + BLOCK_POINTS)
                        if cached:
                            series.blocks[k] = block
                    if fresh < start:  # the slice's head, before its first block
                        parts.append(series.encode(sl.rank, sl.name, sl.base, fresh, start))
                    parts.append(block)
                    fresh = start + BLOCK_POINTS
                    k += 1
                if fresh < end:  # the tail, after the last whole block
                    parts.append(series.encode(sl.rank, sl.name, sl.base, fresh, end))
                pieces.append(parts[0] if len(parts) == 1 else b"".join(parts))
                first = end
                time.sleep(0)  # the event loop's turn
            out.append(pieces)
        return out

    @staticmethod
    def recopy_trimmed(plan: list[Slice], built: list[pb.Series]) -> None:
        """Under the lock again: a series trimmed while it was copied is copied again."""
        for i, sl in enumerate(plan):
            if sl.series.base != sl.base:
                built[i] = sl.series.copy(
                    sl.rank, sl.name, sl.series.base, max(sl.first, sl.series.base), sl.last
                )
