"""The event log of a run: what happened, in order, bounded in memory (the run dir keeps all)."""

from __future__ import annotations

from orch.wire.model import Event

# Events held in memory (past either bound the oldest quarter leaves) and sent in one
# GetState reply (the caller asks again for the rest).
MAX_EVENTS_IN_MEMORY = 10_000
MAX_EVENT_BYTES_IN_MEMORY = 8 * 1024 * 1024
MAX_EVENT_BYTES_PER_REPLY = 4 * 1024 * 1024
EVENT_OVERHEAD = 64  # bytes an event costs besides its message


class EventLog:
    """Events by absolute index; ``dropped`` counts the oldest ones that left memory."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.dropped = 0
        self._bytes = 0

    def append(self, event: Event) -> None:
        self.events.append(event)
        self._bytes += len(event.message) + EVENT_OVERHEAD
        if len(self.events) > MAX_EVENTS_IN_MEMORY or self._bytes > MAX_EVENT_BYTES_IN_MEMORY:
            self._trim()

    def _trim(self) -> None:
        """Let the oldest events leave memory, down to three quarters of both bounds."""
        drop, size = 0, self._bytes
        while drop < len(self.events) - 1 and (
            len(self.events) - drop > MAX_EVENTS_IN_MEMORY * 3 // 4
            or size > MAX_EVENT_BYTES_IN_MEMORY * 3 // 4
        ):
            size -= len(self.events[drop].message) + EVENT_OVERHEAD
            drop += 1
        del self.events[:drop]
        self._bytes = size
        self.dropped += drop

    def since(self, cursor: int, now: float) -> tuple[list[Event], int, bool]:
        """The events from absolute index ``cursor`` on, as many as one reply takes; the cursor
        after them; whether more wait (ask again). Events that left memory before the caller
        saw them are named by one ``events_dropped`` event."""
        out = []
        if cursor < self.dropped:
            missed = self.dropped - cursor
            out.append(
                Event(
                    time=self.events[0].time if self.events else now,
                    kind="events_dropped",
                    rank=-1,
                    message=f"{missed} earlier events are no longer in the master's memory "
                    "(the run dir's events.jsonl keeps them all)",
                )
            )
            cursor = self.dropped
        size = 0
        for event in self.events[cursor - self.dropped :]:
            size += len(event.message) + EVENT_OVERHEAD
            if size > MAX_EVENT_BYTES_PER_REPLY and out:
                return out, cursor, True
            out.append(event)
            cursor += 1
        return out, cursor, False
