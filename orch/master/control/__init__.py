"""The parts of the master, each with one job; :class:`orch.master.coordinator.Coordinator` joins them.

- :mod:`.validate`: the checks every request passes before it touches any state (pure functions).
- :mod:`.registry`: the rank records, registration and the start barrier.
- :mod:`.series`: the metric points, with cursors and one memory budget per master.
- :mod:`.events`: the event log, bounded, with a count of the events that left memory.
- :mod:`.lifecycle`: the run's state machine; every transition is declared in one table.
- :mod:`.judge`: which failure is the root cause, kept as a structured :class:`~.judge.RootCause`.

None of them takes a lock, reads a clock or touches gRPC: the coordinator holds the one lock
and passes the time in, so each part is unit-tested alone (``tests/control/``).
"""
