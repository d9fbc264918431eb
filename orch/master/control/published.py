"""The ranks' records as GetState replies carry them, each serialized once per change.

A panel polls a big run twice a second, and most of its ranks have not beaten since its last
poll (at 4,096 ranks the master asks each host for a beat every 2 s): rebuilding every rank's
``RankInfo`` for every reply cost the master more than the reply's points. Here each record's
message is built when what a client sees of it changed (its fields, its last beat, its last
advance), and stamped with the publication that saw the change; a caller that asks for
``changed_ranks`` gets only the records stamped after its cursor's publication. The ages
(seconds since a rank's last beat and last advance) change every moment: they are written
after the kept bytes in each reply (a later field wins when a message is parsed), and a
caller ages the ranks a reply leaves out by the master's clock (``GetStateResponse.clock``).
"""

from __future__ import annotations

import dataclasses
import operator
import struct
import threading
from collections.abc import Callable, Sequence

from orch.master.control.registry import RankRecord
from orch.master.control.series import Turns, yield_gil
from orch.wire._proto import orchestrator_pb2 as pb
from orch.wire.codec import field_key, varint
from orch.wire.ranks import RankView
from orch.wire.states import RankState

AGES = ("heartbeat_age", "progress_age")
# What a client sees of a record, but its ages: when it changes, the record is built again.
_SEEN = operator.attrgetter(
    *(f.name for f in dataclasses.fields(RankView) if f.name not in AGES),
    "last_heartbeat",
    "moved_at",
    "beats",
)


_AGE_TAGS = [field_key(pb.RankInfo, a) for a in AGES]  # doubles: 64-bit
_AGES = struct.Struct("<" + "".join(f"{len(tag)}sd" for tag in _AGE_TAGS))
RANKS_TAG = field_key(pb.GetStateResponse, "ranks")


class Published:
    """The run's publications of its ranks: one per reply, numbered. Built outside the run's
    lock, one at a time (two panels' replies do not build a record twice)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._roster: tuple[int, ...] = ()  # the records' identities at the last publication
        self._roster_seq = 0  # the publication that first saw them

    def ranks(
        self, records: Sequence[RankRecord], at: float, since: int, pause: Callable[[], None] = yield_gil
    ) -> tuple[int, bool, list[bytes]]:
        """(This publication's number, whether it carries only the records changed since
        publication ``since``, the serialized ``RankInfo`` of each record it carries, ages read
        at ``at``.) ``since`` 0: every record. A new roster of records (a restart) is sent whole.
        ``pause`` is called after each turn of building (see :class:`.series.Turns`)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            roster = tuple(map(id, records))
            if roster != self._roster:
                self._roster, self._roster_seq = roster, seq
            changed_only = since > 0 and self._roster_seq <= since
            out = []
            turn = Turns(pause)
            for rec in records:
                turn.check()
                seen = _SEEN(rec)
                kept = rec.published_as
                if kept is None or kept[0] != seen:
                    info = rec.to_pb()
                    info.steps_per_sec = rec.steps_per_second() if not rec.state.done else 0.0
                    kept = rec.published_as = (seen, info.SerializeToString(), seq)
                if changed_only and kept[2] <= since:
                    continue
                moved, beat = rec.moved_at, rec.last_heartbeat
                running = rec.state is RankState.RUNNING and moved is not None
                progress_age = max(0.0, at - moved) if running and moved is not None else -1.0
                beat_age = -1.0 if beat is None else max(0.0, at - beat)
                tail = _AGES.pack(_AGE_TAGS[0], beat_age, _AGE_TAGS[1], progress_age)
                out.append(kept[1] + tail)
            return seq, changed_only, out


def framed(infos: list[bytes]) -> bytes:
    """The serialized ``RankInfo`` messages as a ``GetStateResponse``'s ``ranks`` field."""
    return b"".join(RANKS_TAG + varint(len(info)) + info for info in infos)
