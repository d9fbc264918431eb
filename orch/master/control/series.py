"""The metric points of a run: one series per (rank, metric), read through cursors, under one
memory budget per master (the run dir's metrics log keeps every point)."""

from __future__ import annotations

import bisect
import sys
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from orch.master.control.validate import Reject
from orch.record.metrics_log import Attempts
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import field_key, varint
from orch.wire.limits import MAX_METRICS_PER_RANK
from orch.wire.model import Points
from orch.wire.ranks import loss_name

# Points held in memory by one master, across all its series (24 bytes each: 23 MiB). Past it
# the oldest points of the biggest series leave memory first, down to three quarters of it.
MAX_POINTS_IN_MEMORY = 1_000_000
MAX_POINTS_PER_REPLY = 250_000  # a GetState reply stays a few MiB; the caller asks again for more
PIECE_POINTS = 8192  # points of a catch-up built at once (about 1 ms holding the GIL)
# Seconds a reply is built for before it lets the master's heartbeats have the GIL (see
# SeriesLog.encode). A hand-over per series cost more than the series (1,024 ranks: 44 of a
# poll's 70 ms of CPU).
TURN_SECONDS = 0.001
# A series' chunks (see Chunks): once this many beats' chunks follow the last merged one, they
# are merged into one, encoded afresh (a catch-up joins a few hundred chunks, not thousands).
MERGE_CHUNKS = 32
CHUNK_POINTS = 1024  # points of a chunk at most, but for merged ones (a beat's backlog is cut)


class Chunks:
    """A series' points as serialized ``Series`` messages, made once when their beat arrives
    (a beat parsed once, its points encoded once for every reply after it): ``data[i]`` holds
    the points from :meth:`start` ``(i)`` to ``ends[i]`` (absolute indexes). A reply joins the
    chunks its points span (a Series message's fields, repeated, parse as one message).

    Written under the run's lock (a beat appends: its data, then its end), read without it: a
    reader counts ``ends`` first. A trim, a rewind or a merge makes a new Chunks; a reader
    that took the old one still reads whole, correct chunks.
    """

    __slots__ = ("data", "ends", "first", "loose")

    def __init__(self, first: int, data: list[bytes] | None = None, ends: Sequence[int] = ()) -> None:
        self.first = first
        self.data = data if data is not None else []
        self.ends = array("q", ends)
        self.loose = 0  # chunks after the last merged one

    def start(self, i: int) -> int:
        return self.ends[i - 1] if i else self.first

    @property
    def end(self) -> int:
        return self.ends[-1] if self.ends else self.first

    def span(self, first: int, last: int) -> tuple[int, int]:
        """The chunks ``[i, j)`` that lie whole in ``[first, last)``, the first starting at or
        after ``first`` (``i == j``: none)."""
        n = len(self.ends)  # before the data: a beat appends its data first
        # The chunk after the last one ending at or before first, or the first chunk.
        i = 0 if first <= self.first else bisect.bisect_left(self.ends, first, 0, n) + 1
        j = bisect.bisect_right(self.ends, last, 0, n)
        return i, max(i, j)


class Series:
    """One rank's points of one metric, in compact arrays, and encoded in :class:`Chunks`.

    ``base`` is the absolute index of the first point held: the oldest points leave memory
    under the budget, and cursors, which count absolute points, stay valid.
    """

    __slots__ = ("attempts", "base", "chunks", "key", "name", "rank", "steps", "times", "values")

    def __init__(self, rank: int = 0, name: str = "") -> None:
        self.rank, self.name = rank, name
        self.key = f"{rank}/{name}"  # its name in a GetState cursor
        self.steps = array("q")
        self.values = array("d")
        self.times = array("d")
        self.attempts = Attempts()  # the restart rule, as the run dir's readers apply it
        self.base = 0
        self.chunks = Chunks(0)

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def end(self) -> int:
        """Absolute index after the last point."""
        return self.base + len(self.steps)

    def add(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        times: Sequence[float],
        attempt: int,
        chunk: bool = False,
        encoded: bytes | None = None,
    ) -> bool:
        """Append points; True when a newer attempt rewound the series. ``chunk``: keep them
        encoded once, as one ``Series`` message of this series, for every reply after (a
        beat's): ``encoded`` when given (the beat's own bytes), else encoded from the arrays.

        A restarted group replays the steps after its last checkpoint: the new attempt's
        points replace those of the old one from its first step on, so no step is counted twice
        (:class:`~orch.record.metrics_log.Attempts`).
        """
        if not steps:
            return False  # an empty batch says nothing of where its attempt starts
        rewound = self.attempts.rewinds(steps, attempt)
        if rewound:
            cut = bisect.bisect_left(self.steps, steps[0])
            del self.steps[cut:], self.values[cut:], self.times[cut:]
            self.chunks = Chunks(self.end)  # a rewind rewrites points: no chunk after it stands
        at = self.end
        self.steps.extend(steps)
        self.values.extend(values)
        self.times.extend(times)
        chunks = self.chunks
        if not chunk or not RAW_DOUBLES or chunks.end != at:
            self.chunks = Chunks(self.end)  # points without a chunk: the chunks start after them
        elif len(steps) > CHUNK_POINTS:
            # A backlog's beat: chunks of CHUNK_POINTS, so that a reply that starts or stops
            # inside one (a trim's cut, a reply's budget) encodes few points afresh.
            for first in range(at, self.end, CHUNK_POINTS):
                last = min(self.end, first + CHUNK_POINTS)
                chunks.data.append(self.encode(self.rank, self.name, self.base, first, last))
                chunks.ends.append(last)
        else:
            if encoded is None:
                encoded = self.encode(self.rank, self.name, self.base, at, self.end)
            chunks.data.append(encoded)
            chunks.ends.append(self.end)
            chunks.loose += 1
            if chunks.loose >= MERGE_CHUNKS:
                self._merge(chunks)
        return rewound

    def _merge(self, chunks: Chunks) -> None:
        """The loose chunks as one, encoded afresh from the arrays."""
        keep = len(chunks.ends) - chunks.loose
        start = chunks.start(keep)
        held = max(start, self.base)  # the first chunk may hold points that left memory: keep == 0
        merged = self.encode(self.rank, self.name, self.base, held, self.end)
        first = chunks.first if held == start else held
        self.chunks = Chunks(first, [*chunks.data[:keep], merged], [*chunks.ends[:keep], self.end])

    def trim(self, drop: int) -> None:
        """Let the oldest ``drop`` points leave memory, and the chunks that hold only them."""
        del self.steps[:drop], self.values[:drop], self.times[:drop]
        self.base += drop
        chunks = self.chunks
        gone = bisect.bisect_right(chunks.ends, self.base)
        if gone:
            kept = Chunks(chunks.start(gone), chunks.data[gone:], chunks.ends[gone:])
            kept.loose = min(chunks.loose, len(kept.ends))
            self.chunks = kept

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


def _chunk_end(chunks: Chunks, first: int, last: int) -> int:
    """``last``, or the end of the last chunk at or before it past ``first``: a reply its
    budget cuts short ends where a chunk does, and the next starts where one does (joins, not
    points encoded afresh)."""
    j = bisect.bisect_right(chunks.ends, last)
    return chunks.ends[j - 1] if j and chunks.ends[j - 1] > first else last


def yield_gil() -> None:
    """Let another thread have the GIL (the event loop's turn)."""
    time.sleep(0)


class Turns:
    """Calls ``pause`` once :data:`TURN_SECONDS` passed since the last call (or the start)."""

    __slots__ = ("_pause", "_since")

    def __init__(self, pause: Callable[[], None]) -> None:
        self._pause = pause
        self._since = time.perf_counter()

    def check(self) -> None:
        if time.perf_counter() - self._since >= TURN_SECONDS:
            self._pause()
            self._since = time.perf_counter()


VALUES_TAG, TIMES_TAG = field_key(pb.Series, "values"), field_key(pb.Series, "times")
RANK_TAG = field_key(pb.Series, "rank")
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


class Slice(NamedTuple):
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
        self._ordered: list[Series] | None = None  # the series by (rank, name), for plan()
        self._names: dict[int, set[str]] = {}

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(list(self._series))

    def get(self, rank: int, name: str) -> Series:
        return self._series.get((rank, name), Series())

    @property
    def trimmed(self) -> bool:
        """True when some points are only in the run dir's metrics log, no longer in memory."""
        return any(s.base for s in self._series.values())

    def check_names(self, rank: int, series: Sequence[Points]) -> None:
        """A rank logs at most :data:`MAX_METRICS_PER_RANK` different metrics (a cap on what
        its beat carries, as the checks of :mod:`.validate`: the sender drops such a beat)."""
        known = self._names.get(rank, set())
        new = {s.name for s in series} - known
        if len(known) + len(new) > MAX_METRICS_PER_RANK:
            raise Reject(
                "invalid_argument",
                f"rank {rank} would log more than {MAX_METRICS_PER_RANK} different metrics",
            )

    def add(
        self,
        rank: int,
        series: Sequence[Points],
        attempt: int,
        wall: float,
        wire: Sequence[bytes] | None = None,
    ) -> float | None:
        """Append one heartbeat's points (checked with :meth:`check_names` first); returns the
        last loss value it carried, if any. Points without times get ``wall``. ``wire``: each
        series' ``Series`` message as the beat carried it, which becomes its chunk (the master's
        edge hands them in: encoding them again would cost a heartbeat more)."""
        names = self._names.setdefault(rank, set())
        names.update(s.name for s in series)
        shown = loss_name(names)
        loss = None
        for i, s in enumerate(series):
            held_series = self._series.get((rank, s.name))
            if held_series is None:
                held_series = self._series[(rank, s.name)] = Series(rank, s.name)
                self._ordered = None
            # The beat's points are one chunk, with the beat's rank (written last, so it wins over
            # any the sender set), and the arrival's time where they had none.
            encoded = None
            if s.times:
                times: Sequence[float] = s.times
                if wire is not None:
                    encoded = wire[i] + RANK_TAG + varint(rank)
            else:
                times = [wall] * len(s.steps)
                if wire is not None:
                    packed = array("d", times).tobytes()
                    encoded = wire[i] + RANK_TAG + varint(rank) + TIMES_TAG + varint(len(packed)) + packed
            held = len(held_series)
            if held_series.add(s.steps, s.values, times, attempt, chunk=True, encoded=encoded):
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
        # Under the run's lock, over every series of the run (8,192 at 4,096 ranks): lean.
        plan: list[Slice] = []
        more = False
        if self._ordered is None:
            self._ordered = [s for _, s in sorted(self._series.items())]
        keys, offsets = [], []
        for s in self._ordered:
            key, base = s.key, s.base
            first = sent.get(key, 0)
            if first < base:
                first = base  # absolute; points before base left memory
            end = base + len(s.steps)
            last = end if end - first <= budget else _chunk_end(s.chunks, first, first + budget)
            if last > first:
                plan.append(Slice(s.rank, s.name, s, base, first, last))
                budget -= last - first
            if last < end:
                more = True
            keys.append(key)
            offsets.append(last)
        cursor.keys.extend(keys)
        cursor.offsets.extend(offsets)
        return plan, more

    @staticmethod
    def copy(plan: list[Slice]) -> list[pb.Series]:
        """The planned points, copied without the lock: appends (and the array slices here)
        are atomic under the GIL and never move held points."""
        return [sl.series.copy(sl.rank, sl.name, sl.base, sl.first, sl.last) for sl in plan]

    @staticmethod
    def encode(plan: list[Slice], pause: Callable[[], None] = yield_gil) -> list[list[bytes]]:
        """The planned points as serialized ``Series`` messages (pieces, in order, that a
        reader takes as one series: the panel's mirror extends it), without the lock.

        The points the series' :class:`Chunks` hold whole are their chunks joined; only the
        ends of a slice that start or stop inside a chunk, or points from before the chunks
        (a rewind), are encoded here, in pieces of at most :data:`PIECE_POINTS` points.
        After each :data:`TURN_SECONDS` of building this thread calls ``pause`` (the gRPC
        master's waits while heartbeats are in flight): a reply delays a heartbeat by one
        turn at most."""
        out: list[list[bytes]] = []
        turn = Turns(pause)
        for sl in plan:
            series, pieces = sl.series, []
            chunks = series.chunks
            i, j = chunks.span(sl.first, sl.last) if sl.base == series.base else (0, 0)
            if i < j:
                start, end = chunks.start(i), chunks.ends[j - 1]
            else:
                start = end = sl.last  # no whole chunk: all encoded here
            for a, b in ((sl.first, start), (end, sl.last)):
                if a == end and i < j:
                    pieces.append(chunks.data[i] if j == i + 1 else b"".join(chunks.data[i:j]))
                while a < b:
                    piece_end = min(b, a + PIECE_POINTS)
                    pieces.append(series.encode(sl.rank, sl.name, sl.base, a, piece_end))
                    a = piece_end
                    turn.check()
            out.append(pieces)
            turn.check()
        return out

    @staticmethod
    def recopy_trimmed(plan: list[Slice], built: list[pb.Series]) -> None:
        """Under the lock again: a series trimmed while it was copied is copied again."""
        for i, sl in enumerate(plan):
            if sl.series.base != sl.base:
                built[i] = sl.series.copy(
                    sl.rank, sl.name, sl.series.base, max(sl.first, sl.series.base), sl.last
                )
