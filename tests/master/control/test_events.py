"""orch.master.control.events: the run's event log, bounded in count and bytes, read by absolute index.

The bounds are module constants; the tests shrink them with ``monkeypatch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from orch.master.control import events
from orch.master.control.events import EVENT_OVERHEAD, EventLog
from orch.wire.model import Event


@dataclass
class Reply:
    """What one GetState reply carries of the events."""

    events: list[Event] = field(default_factory=list)
    more: bool = False


def since(log: EventLog, cursor: int, reply: Reply, now: float) -> int:
    events, cursor, reply.more = log.since(cursor, now)
    reply.events += events
    return cursor


def event(i: int, size: int = 10) -> Event:
    """Event ``i``: its time is ``i`` and its message is ``size`` characters naming it."""
    return Event(time=float(i), kind="k", rank=i % 3, message=f"e{i}".ljust(size, "."))


def filled(n: int, size: int = 10) -> EventLog:
    log = EventLog()
    for i in range(n):
        log.append(event(i, size))
    return log


def numbers(evs: list[Event]) -> list[int]:
    return [int(e.time) for e in evs]


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most 8 events and 1000 bytes in memory; 500 bytes in one reply."""
    monkeypatch.setattr(events, "MAX_EVENTS_IN_MEMORY", 8)
    monkeypatch.setattr(events, "MAX_EVENT_BYTES_IN_MEMORY", 1000)
    monkeypatch.setattr(events, "MAX_EVENT_BYTES_PER_REPLY", 500)


# -- bounds --------------------------------------------------------------------------------


def test_events_are_kept_in_order(small: None) -> None:
    log = filled(8)
    assert numbers(log.events) == list(range(8))
    assert log.dropped == 0


def test_past_the_count_the_oldest_quarter_leaves(small: None) -> None:
    log = filled(9)
    assert numbers(log.events) == [3, 4, 5, 6, 7, 8]  # down to 8 * 3 // 4
    assert log.dropped == 3
    for i in range(9, 11):
        log.append(event(i))
    assert numbers(log.events) == list(range(3, 11)) and log.dropped == 3
    log.append(event(11))
    assert numbers(log.events) == list(range(6, 12)) and log.dropped == 6


def test_past_the_bytes_the_oldest_leave(small: None) -> None:
    size = 200 - EVENT_OVERHEAD  # each event costs 200 bytes
    log = filled(5, size)  # 1000 bytes: at the bound
    assert log.dropped == 0 and len(log.events) == 5
    log.append(event(5, size))  # 1200 bytes: down to 750 or less
    assert numbers(log.events) == [3, 4, 5]
    assert log.dropped == 3
    log.append(event(6, size))  # 800 bytes: within the bound, so the count of bytes was right
    assert numbers(log.events) == [3, 4, 5, 6] and log.dropped == 3
    log.append(event(7, size))
    assert log.dropped == 3
    log.append(event(8, size))  # 1200 again
    assert numbers(log.events) == [6, 7, 8] and log.dropped == 6


def test_an_event_bigger_than_the_bound_is_kept_alone(small: None) -> None:
    log = filled(2)
    log.append(event(2, 5000))
    assert numbers(log.events) == [2]
    assert log.dropped == 2
    log.append(event(3))  # the big one leaves now
    assert numbers(log.events) == [3] and log.dropped == 3


# -- reading -------------------------------------------------------------------------------


def test_since_returns_the_events_after_the_cursor() -> None:
    log = filled(5)
    reply = Reply()
    assert since(log, 0, reply, 99.0) == 5
    assert numbers(list(reply.events)) == [0, 1, 2, 3, 4] and not reply.more
    reply = Reply()
    assert since(log, 3, reply, 99.0) == 5
    assert numbers(list(reply.events)) == [3, 4]
    reply = Reply()
    assert since(log, 5, reply, 99.0) == 5
    assert list(reply.events) == []


def test_since_names_the_events_that_left_memory_in_one_event(small: None) -> None:
    log = filled(12)  # events 6..11 held, 6 dropped
    assert log.dropped == 6
    reply = Reply()
    assert since(log, 2, reply, 99.0) == 12
    first, *rest = reply.events
    assert first.kind == "events_dropped" and first.rank == -1
    assert first.message.startswith("4 earlier events are no longer in the master's memory")
    assert "events.jsonl" in first.message
    assert first.time == 6.0  # the time of the oldest event held
    assert numbers(rest) == list(range(6, 12))
    assert [e.kind for e in reply.events].count("events_dropped") == 1


def test_since_from_the_first_held_event_misses_nothing(small: None) -> None:
    log = filled(12)
    reply = Reply()
    assert since(log, log.dropped, reply, 99.0) == 12
    assert "events_dropped" not in [e.kind for e in reply.events]
    assert numbers(list(reply.events)) == list(range(6, 12))


def test_since_with_nothing_held_stamps_the_dropped_event_now() -> None:
    log = EventLog()
    log.dropped = 3
    reply = Reply()
    assert since(log, 0, reply, 42.0) == 3
    assert [(e.kind, e.time) for e in reply.events] == [("events_dropped", 42.0)]
    assert reply.events[0].message.startswith("3 earlier events")


def test_one_reply_takes_a_bounded_number_of_bytes(small: None) -> None:
    size = 200 - EVENT_OVERHEAD  # two events fit the 500 bytes of one reply
    log = EventLog()
    for i in range(5):
        log.append(event(i, size))  # each append stays under the memory bound until the 6th
    got: list[int] = []
    cursor = 0
    replies = 0
    while True:
        reply = Reply()
        cursor = since(log, cursor, reply, 0.0)
        replies += 1
        assert len(reply.events) <= 2
        got += numbers(list(reply.events))
        if not reply.more:
            break
    assert got == [0, 1, 2, 3, 4]
    assert replies == 3 and cursor == 5


def test_an_event_bigger_than_a_reply_still_goes_alone(small: None) -> None:
    log = EventLog()
    log.append(event(0, 800))
    log.append(event(1))
    reply = Reply()
    assert since(log, 0, reply, 0.0) == 1
    assert numbers(list(reply.events)) == [0] and reply.more
    reply = Reply()
    assert since(log, 1, reply, 0.0) == 2
    assert numbers(list(reply.events)) == [1] and not reply.more
