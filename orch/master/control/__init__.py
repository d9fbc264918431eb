"""The parts of the master, each with one job; :class:`orch.master.coordinator.Coordinator` joins them.

- :mod:`.validate`: the checks every request passes before it touches any state (pure functions).
- :mod:`.registry`: the rank records, registration and the start barrier.
- :mod:`.intake`: what the ranks send, taken in: registration, heartbeats into records and series.
- :mod:`.series`: the metric points, with cursors and one memory budget per master.
- :mod:`.events`: the event log, bounded, with a count of the events that left memory.
- :mod:`.lifecycle`: the run's state machine; every transition is declared in one table.
- :mod:`.judge`: which failure is the root cause, kept as a structured :class:`~.judge.RootCause`.
- :mod:`.fate`: how the ends of ranks, stops, failures and restarts move the run (drives the two above).
- :mod:`.stopping`: a stop asked of the run, counted, and the one step every rank stops at
  (:mod:`.fate` carries it out: reached, or forced after the grace).
- :mod:`.policies`: what a hang does (``on_hang``) and whether a failure restarts the group
  (``max_restarts``), as objects that return decisions.
- :mod:`.hosts` and :mod:`.host_sync`: the host agents, and restarts across hosts (elastic too).
- :mod:`.stragglers` and :mod:`.straggler_watch`: who holds the others back, and when it is judged.
- :mod:`.cluster_job`: the scheduler's job the ranks run in, and when its news is an event.
- :mod:`.plan`: what the master holds the run to (:class:`~.plan.RunPlan`), made from the launch's spec.
- :mod:`.snapshot`: a GetState reply built from the parts, its points copied outside the lock.

None of them takes a lock, reads a clock or touches gRPC: the coordinator holds the one lock
and passes the time in, so each part is unit-tested alone (``tests/master/control/``). Parts that make
events (:mod:`.fate`) are handed the coordinator's way of telling them.
"""
